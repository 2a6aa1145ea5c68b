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
than 2^31 stored entries; test graphs built through scipy).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.graph.model import Graph


def compile_kernels() -> dict[str, float]:
    """Compile (or load) each kernel family; the seconds each took, by name."""
    from service.graph.demo import demo_graph
    from service.mechanisms.discrete_gaussian import discrete_gaussian
    from service.mechanisms.engine import warm_engine
    from service.mechanisms.exact_bernoulli import (
        bernoulli_exp,
        bernoulli_ratio,
        bernoulli_scaled,
        uniform_below,
    )
    from service.mechanisms.exact_laplace import rounded_laplace
    from service.mechanisms.pushflowcap import warm_up_kernel

    rng = np.random.default_rng()  # draws are discarded
    with tempfile.TemporaryDirectory(prefix="ppr-kernels-") as folder:
        kinds = _graph_kinds(demo_graph(), Path(folder))
        steps: dict[str, Callable[[], object]] = {
            "exact Laplace": lambda: rounded_laplace(rng, 1, 1, 8),
            "exact Bernoulli": lambda: (
                bernoulli_exp(rng, 1, 2),
                bernoulli_ratio(rng, 1, 3),
                bernoulli_scaled(rng, 1, 3, 1),
                uniform_below(rng, 5),
            ),
            "discrete Gaussian": lambda: discrete_gaussian(rng, 1, 0, 8),
            "diffusion engine": lambda: _warm_each(kinds, warm_engine),
            "PushFlowCap": lambda: _warm_each(
                kinds, lambda kind: warm_up_kernel(kind.indptr, kind.indices)
            ),
        }
        seconds = {}
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            seconds[name] = time.perf_counter() - started
    return seconds


def _warm_each(kinds: list[Graph], warm: Callable[[Graph], None]) -> None:
    for kind in kinds:
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


def main() -> None:
    for name, seconds in compile_kernels().items():
        print(f"{name:20s} {seconds:6.2f} s")


if __name__ == "__main__":  # pragma: no cover - run as a command
    main()
