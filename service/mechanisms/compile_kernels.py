"""``python -m service.mechanisms.compile_kernels``: compile every numba kernel of the serving
path into numba's on-disk cache (``cache=True``), once, before processes that need them start.

A fresh checkout or a new install has no cache: each process that reaches a kernel first
compiles it (about 25 CPU seconds for all of them, most in the exact samplers), and processes
that start together all compile the same kernels at once. Run this once after installing (an
image build, a deployment step, or the test run's start, see ``tests/conftest.py``) and every
later process loads the kernels in milliseconds. Nothing here touches a served graph: the
kernels are compiled on the built-in demo graph, and the noise drawn is discarded.

numba compiles one variant of a kernel per argument type, read-only flags included, so the
graph kernels are compiled for each kind of graph the service holds: in memory and mapped from
a snapshot (every worker's), each with int32 row offsets and with int64 ones (a graph of more
than 2^31 stored entries; test graphs built through scipy), and each walked through 16-bit
column indices (graphs of at most 65,536 nodes) and through the graph's own int32 ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from service.graph.model import Graph

#: The kernel families, in the order one process compiles them (the exact Laplace sampler
#: before the diffusion engine, whose noisy step calls it).
FAMILIES = (
    "exact Laplace",
    "exact Bernoulli",
    "exact binomial",
    "discrete Gaussian",
    "diffusion engine",
    "PushFlowCap",
    "count rankings",
)
#: What a second process compiles with ``parallel``: the families that share no kernel with
#: the others (measured on a fresh install, quiet 2-core machine: 11.5 s of wall time against
#: 19.0 s in one process, for the same 19 CPU-s; the count rankings, about 6 CPU-s, were added
#: since, to the second).
SECOND_PROCESS = ("exact Bernoulli", "exact binomial", "discrete Gaussian", "count rankings")


def compile_kernels(parallel: bool = False) -> dict[str, float]:
    """Compile (or load) each kernel family; the seconds each took, by name. With ``parallel``
    the families of :data:`SECOND_PROCESS` are compiled by a fresh process at the same time
    (numba's cache is safe to share: each kernel is written by the one process that compiles
    it)."""
    if not parallel:
        return compile_families(FAMILIES)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    here = [name for name in FAMILIES if name not in SECOND_PROCESS]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as second:
        there = second.submit(compile_families, SECOND_PROCESS)
        timed = compile_families(here) | there.result()
    return {name: timed[name] for name in FAMILIES}


def compile_families(names: Sequence[str]) -> dict[str, float]:
    """:func:`compile_family` of each of ``names``, in order."""
    return dict(map(compile_family, names))


def compile_family(name: str) -> tuple[str, float]:
    """Compile (or load) the kernels of one family (one of :data:`FAMILIES`); its seconds."""
    started = time.perf_counter()
    _STEPS[name]()
    return name, time.perf_counter() - started


def _exact_laplace() -> None:
    from service.mechanisms.exact_laplace import rounded_laplace

    rounded_laplace(np.random.default_rng(), 1, 1, 8)  # draws are discarded


def _exact_bernoulli() -> None:
    from service.mechanisms.exact_bernoulli import (
        bernoulli_exp,
        bernoulli_ratio,
        bernoulli_scaled,
        uniform_below,
    )

    rng = np.random.default_rng()
    bernoulli_exp(rng, 1, 2)
    bernoulli_ratio(rng, 1, 3)
    bernoulli_scaled(rng, 1, 3, 1)
    uniform_below(rng, 5)


def _exact_binomial() -> None:
    from service.mechanisms.exact_binomial import binomial_half_rejection

    binomial_half_rejection(np.random.default_rng(), 1 << 20)  # the draw is discarded


def _discrete_gaussian() -> None:
    from service.mechanisms.discrete_gaussian import discrete_gaussian

    discrete_gaussian(np.random.default_rng(), 1, 0, 8)


def _diffusion_engine() -> None:
    from service.mechanisms.engine import warm_engine
    from service.mechanisms.operator import WalkOperator

    def warm(kind: Graph) -> None:
        warm_engine(kind)  # 16-bit indices: the demo graph is below COMPACT_INDEX_NODES
        warm_engine(kind, WalkOperator(kind, threads=1, compact=False))  # larger graphs'

    _warm_each_kind(warm)


def _pushflowcap() -> None:
    from service.mechanisms.floored_pushflowcap import warm_up_floored_kernel
    from service.mechanisms.pushflowcap import warm_up_kernel

    def warm(kind: Graph) -> None:
        warm_up_kernel(kind.indptr, kind.indices)
        warm_up_floored_kernel(kind.indptr, kind.indices)  # DP-IE's, with the floor

    _warm_each_kind(warm)


def _count_rankings() -> None:
    """``blended``'s hold-out pass and the count rankings' array steps (each one variant; the
    server's supervisor warms them before it forks its workers)."""
    from service.mechanisms import hold_out, ranking_kernels

    hold_out.warm_up()
    ranking_kernels.warm_up()


_STEPS: dict[str, Callable[[], None]] = {
    "exact Laplace": _exact_laplace,
    "exact Bernoulli": _exact_bernoulli,
    "exact binomial": _exact_binomial,
    "discrete Gaussian": _discrete_gaussian,
    "diffusion engine": _diffusion_engine,
    "PushFlowCap": _pushflowcap,
    "count rankings": _count_rankings,
}


def _warm_each_kind(warm: Callable[[Graph], None]) -> None:
    """``warm`` on each kind of graph the service holds, built from the demo graph."""
    from service.graph.demo import demo_graph

    with tempfile.TemporaryDirectory(prefix="ppr-kernels-") as folder:
        for kind in _graph_kinds(demo_graph(), Path(folder)):
            warm(kind)


def _graph_kinds(graph: Graph, folder: Path) -> list[Graph]:
    """``graph`` with int32 and with int64 row offsets, each in memory and mapped (read-only)
    from a snapshot written in ``folder``."""
    from service.graph.snapshot import open_snapshot, write_snapshot

    wide = dataclasses.replace(graph, indptr=graph.indptr.astype(np.int64))
    kinds = []
    for number, kind in enumerate((graph, wide)):
        path = folder / f"graph-{number}.snapshot"
        write_snapshot(kind, path, kind.fingerprint)
        kinds += [kind, open_snapshot(path, kind.fingerprint)]
    return kinds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m service.mechanisms.compile_kernels",
        description="Compile every numba kernel of the serving path into numba's on-disk cache.",
    )
    parser.add_argument(
        "--parallel", action="store_true",
        help="compile the samplers in a second process at the same time (two cores)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    for name, seconds in compile_kernels(args.parallel).items():
        print(f"{name:20s} {seconds:6.2f} s")


if __name__ == "__main__":  # pragma: no cover - run as a command
    main()
