"""``bench``: per-query latency of the mechanisms on one graph, and the graph's load cost.

Measures, in one run and on the same seeds: noisy diffusion with a cold seed (noise-free prefix
computed in the query) and a warm seed (prefix cached), exact PPR, DP-PushFlowCap, the naive
reference (papers' style: float64 product and ``numpy.random.laplace`` at every step), and, in
personalized mode, noisy common neighbours and ``friends_of_friends`` (the two-scale counts,
friends first), both as the service draws them: the ranked top ``replay_store_top`` (1000) plus
the seed's degree, by the lazy top-k, and ``blended`` (the two-scale counts blended with the
graph version's DP degree release, drawn and summarized once before timing as the service
stores it; the same ranked top, by its lazy top-k).
With ``--papers-code DIR`` (a checkout of the papers' repository, which this project does not
hold) it also times the papers' own ``PrivatePageRankClip`` on the same graph, under
``--papers-python`` (service/cli/papers_code.py), from each seed right after the service's own
queries from it, and adds a ratio to it.
Each row has a ``batch`` field: 1 for one query at a time; with ``--batch B`` (default 32) cold
and warm noisy diffusion are also timed as blocks of B queries on the batched engine's kernel,
reported per query (block time / B).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import resource
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.cli.arg_types import positive_float, positive_int
from service.cli.common import add_mechanism_arguments, load_graph, print_json, print_table
from service.errors import InvalidParameter
from service.privacy.modes import Mode

if TYPE_CHECKING:
    import numpy as np

    from service.graph.model import Graph
    from service.privacy.calibration import DiffusionConfig


def generate_spec(text: str) -> tuple[int, int]:
    """``NODES,EDGES`` of a generated graph, checked (``--generate`` here and in
    benchmarks/speed_targets.py)."""
    try:
        nodes, edges = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NODES,EDGES, got {text!r}") from None
    if nodes < 2 or edges < 1:
        raise argparse.ArgumentTypeError("need at least 2 nodes and 1 edge")
    if edges > nodes * (nodes - 1) // 2:
        raise argparse.ArgumentTypeError(
            f"{nodes} nodes hold at most {nodes * (nodes - 1) // 2} edges, got {edges}"
        )
    return nodes, edges


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="latency of the mechanisms", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--graph", type=Path, metavar="FILE", help="edge-list file")
    source.add_argument("--generate", type=generate_spec, metavar="NODES,EDGES",
                        help="a generated power-law graph of this size")  # fmt: skip
    source.add_argument("--demo", action="store_true", help="the built-in demo graph")
    parser.add_argument("--queries", type=positive_int, default=10, help="seeds to time")
    parser.add_argument("--epsilon", type=positive_float, default=0.1)
    parser.add_argument("--mechanisms", nargs="+", default=None, metavar="NAME",
                        help=f"subset of {', '.join(MECHANISMS)} (default: all that the mode "
                        "offers)")  # fmt: skip
    add_mechanism_arguments(parser)
    parser.add_argument("--batch", type=positive_int, nargs="*", default=[32], metavar="B",
                        help="also time noisy_cold and noisy_warm with B queries computed "
                        "together on the batched engine (per-query time = block time / B); "
                        "default 32; none to skip")  # fmt: skip
    parser.add_argument("--batch-repeats", type=positive_int, default=3, metavar="R",
                        help="blocks timed per batch size")  # fmt: skip
    parser.add_argument("--papers-code", type=Path, metavar="DIR",
                        help="also time the papers' own code on the same graph and seeds: a "
                        "checkout of Graph-COM/DP_GraphDiffusion (its model.py); adds a "
                        "papers_code row and an 'x papers' column")  # fmt: skip
    parser.add_argument("--papers-python", default=sys.executable, metavar="PYTHON",
                        help="the Python that runs the papers' code, with their requirements "
                        "(numpy, scipy, pandas); default: this one")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    import numpy as np

    arr = np.asarray(samples) * 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 90))


def _query(
    name: str,
    graph: Graph,
    seed: int,
    config: DiffusionConfig,
    epsilon: float,
    degrees: np.ndarray | None = None,
) -> Callable[[], object]:
    """One query of mechanism ``name`` for ``seed``, ready to time (warm: prefix precomputed)."""
    from service.mechanisms.common_neighbours import common_neighbours_top
    from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
    from service.mechanisms.exact import exact_ppr
    from service.mechanisms.friends_of_friends import friends_of_friends_top
    from service.mechanisms.lazy_blend import blended_top
    from service.mechanisms.pushflowcap import dp_pushflowcap
    from service.mechanisms.reference import naive_noisy_diffusion
    from service.privacy.laplace import (
        COMMON_NEIGHBOUR_SENSITIVITY,
        DEGREE_SENSITIVITY,
        plan_laplace,
        plan_two_scale,
    )

    stored = SERVED_TOP + int(graph.degrees[seed])  # what the service ranks and stores
    if name == "common_neighbours":
        plan = plan_laplace(epsilon, COMMON_NEIGHBOUR_SENSITIVITY)
        return partial(common_neighbours_top, graph, seed, plan, stored)
    if name == "friends_of_friends":
        return partial(friends_of_friends_top, graph, seed, plan_two_scale(epsilon), stored)
    if name == "blended":
        assert degrees is not None
        scale = plan_laplace(DEGREE_EPSILON, DEGREE_SENSITIVITY).scale
        return partial(blended_top, graph, seed, plan_two_scale(epsilon), degrees, scale, stored)
    if name == "noisy_cold":
        return partial(noisy_diffusion, graph, seed, config)
    if name == "noisy_warm":
        prefix = noise_free_prefix(
            graph, seed, config.mode, config.beta, config.eta, config.noise_free_steps
        )
        return partial(noisy_diffusion, graph, seed, config, prefix=prefix)
    if name == "exact_ppr":
        return partial(exact_ppr, graph, seed, config.beta)
    if name == "pushflowcap":
        return partial(
            dp_pushflowcap, graph, seed, beta=config.beta, rounds=config.steps, sigma=1e-6,
            epsilon=epsilon, mode=config.mode,
        )  # fmt: skip
    return partial(
        naive_noisy_diffusion, graph, seed, beta=config.beta, steps=config.steps,
        eta=config.eta, noise_scale=config.noise_scale, mode=config.mode,
    )  # fmt: skip


def _batched(
    graph: Graph, seeds: list[int], config: DiffusionConfig, *, warm: bool
) -> Callable[[], object]:
    """One block of len(seeds) queries on the batched engine's kernel (in this thread, both
    cores for the sparse products), each with its own fresh generator; warm: prefixes cached."""
    from service.mechanisms.engine import DiffusionJob, run_jobs
    from service.mechanisms.randomness import fresh_generator
    from service.privacy.calibration import DiffusionConfig

    prefixes: list[np.ndarray | None] = [None] * len(seeds)
    if warm:  # the prefixes, computed together (noise-free, untimed)
        m = config.noise_free_steps
        free = DiffusionConfig(mode=config.mode, beta=config.beta, steps=m, eta=config.eta,
                               noise_scale=0.0, noisy_steps=0)  # fmt: skip
        jobs = [DiffusionJob(s, free, None, keep_prefix=False) for s in seeds]
        run_jobs(graph, jobs)
        prefixes = [job.future.result().scores for job in jobs]

    def block() -> None:
        jobs = [
            DiffusionJob(s, config, fresh_generator(), p, keep_prefix=not warm)
            for s, p in zip(seeds, prefixes, strict=True)
        ]
        run_jobs(graph, jobs)

    return block


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


MECHANISMS = (
    "noisy_cold",
    "noisy_warm",
    "blended",
    "friends_of_friends",
    "common_neighbours",
    "exact_ppr",
    "pushflowcap",
    "naive_reference",
)
PERSONALIZED_ONLY = frozenset({"blended", "friends_of_friends", "common_neighbours"})
#: The service's default ``replay_store_top``: the count rankings are timed ranked to it.
SERVED_TOP = 1000
#: eps_d of the one degree release ``blended`` reuses (the service's default).
DEGREE_EPSILON = 0.1


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from service.mechanisms.operator import walk_operator
    from service.mechanisms.popular import noisy_degrees
    from service.privacy.calibration import plan_diffusion
    from service.privacy.laplace import DEGREE_SENSITIVITY, plan_laplace

    if args.mechanisms is None:
        args.mechanisms = [
            m for m in MECHANISMS if args.mode is Mode.PERSONALIZED or m not in PERSONALIZED_ONLY
        ]
    unknown = set(args.mechanisms) - set(MECHANISMS)
    if unknown:
        raise InvalidParameter("mechanisms", f"unknown {sorted(unknown)}; choose from {MECHANISMS}")
    if args.mode is not Mode.PERSONALIZED and PERSONALIZED_ONLY & set(args.mechanisms):
        raise InvalidParameter(
            "mechanisms",
            "blended, friends_of_friends and common_neighbours are personalized only",
        )
    if args.papers_code is not None:  # before anything is timed: a clear error, at once
        from service.cli.papers_code import check_papers_code

        check_papers_code(args.papers_code, args.papers_python)
    gc.collect()
    rss_before = _rss_bytes()
    start = time.perf_counter()
    if args.generate is not None:
        from service.graph.generate import generate_graph

        nodes, edges = args.generate
        graph = generate_graph(nodes, edges, seed=0)
    else:
        graph = load_graph(None if args.demo else args.graph)
    load_seconds = time.perf_counter() - start
    rss_graph = _rss_bytes() - rss_before
    walk_operator(graph)  # built once per graph at load in the service

    delta = min(1e-6, 1.0 / max(graph.m, 1))
    plan = plan_diffusion(args.epsilon, delta, args.steps, args.beta, args.eta, args.mode)
    config = plan.config
    pick = np.random.default_rng(12345)  # which seeds to time; not the noise
    candidates = np.flatnonzero(graph.degrees > 0)
    seeds = pick.choice(candidates, size=min(args.queries, candidates.size), replace=False)

    degree_plan = plan_laplace(DEGREE_EPSILON, DEGREE_SENSITIVITY)
    degrees = noisy_degrees(graph, degree_plan)
    if "blended" in args.mechanisms:  # once per graph version in the service, not per query
        from service.mechanisms.blended import degree_standard

        degree_standard(degrees, degree_plan.scale)
    timings: dict[str, list[float]] = {name: [] for name in args.mechanisms}
    papers: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack:
        session = None
        if args.papers_code is not None:  # their class built once, before any timing
            from service.cli.papers_code import PapersSession

            session = stack.enter_context(PapersSession(
                graph, config, epsilon=plan.epsilon, delta=delta, directory=args.papers_code,
                python=args.papers_python,
            ))  # fmt: skip
            timings["papers_code"] = []
            papers = {"code": str(args.papers_code), "environment": session.environment,
                      "setup_seconds": session.setup_seconds}  # fmt: skip
        for seed in (int(s) for s in seeds):
            for name in args.mechanisms:
                query = _query(name, graph, seed, config, args.epsilon, degrees)
                timings[name].append(_timed(query))
            if session is not None:  # right after ours, from the same seed
                timings["papers_code"].append(session.time(seed))

    batched: dict[tuple[str, int], list[float]] = {}
    seed_list = [int(s) for s in seeds]
    for size in sorted(set(args.batch or [])):
        if size < 2:
            continue
        block_seeds = [seed_list[i % len(seed_list)] for i in range(size)]
        for name in ("noisy_cold", "noisy_warm"):
            if name not in args.mechanisms:
                continue
            block = _batched(graph, block_seeds, config, warm=name == "noisy_warm")
            batched[(name, size)] = [_timed(block) / size for _ in range(args.batch_repeats)]

    naive = timings.get("naive_reference")
    naive_p50 = _percentiles(naive)[0] if naive else None
    papers_p50 = _percentiles(timings["papers_code"])[0] if papers else None
    rows: list[dict[str, Any]] = []
    measured = [((name, 1), samples) for name, samples in timings.items()]
    measured += sorted(batched.items())
    for (name, size), samples in measured:
        p50, p90 = _percentiles(samples)
        rows.append({
            "mechanism": name, "batch": size, "p50_ms": p50, "p90_ms": p90,
            "queries": len(samples) * size,
            "speedup_vs_naive": (naive_p50 / p50) if naive_p50 else None,
            "speedup_vs_papers": (papers_p50 / p50) if papers_p50 else None,
        })  # fmt: skip
    graph_report: dict[str, Any] = {
            "nodes": graph.n, "edges": graph.m, "version": graph.version,
            "load_seconds": load_seconds, "graph_bytes": graph.nbytes,
            "bytes_per_adjacency_entry": graph.nbytes / max(graph.indices.shape[0], 1),
            "rss_increase_bytes": rss_graph,
    }  # fmt: skip
    report = {
        "graph": graph_report,
        "mechanism": {
            "epsilon": plan.epsilon, "delta": delta, "beta": config.beta, "steps": config.steps,
            "noisy_steps": config.noisy_steps, "eta": config.eta,
            "noise_scale": config.noise_scale, "mode": config.mode.value,
        },
        "threads": walk_operator(graph).threads,
        "seeds": seed_list,
        "papers_code": papers,
        "latency": rows,
    }  # fmt: skip
    if args.json:
        print_json(report)
        return 0
    g = graph_report
    print(
        f"graph: {g['nodes']} nodes, {g['edges']} edges, loaded in {g['load_seconds']:.2f} s, "
        f"{g['graph_bytes'] / 2**20:.1f} MiB arrays ({g['bytes_per_adjacency_entry']:.1f} B per "
        f"adjacency entry), RSS +{g['rss_increase_bytes'] / 2**20:.1f} MiB"
    )
    print(
        f"noisy diffusion: eps {plan.epsilon:.4g} at delta {delta:.3g}, K {config.steps}, "
        f"L {config.noisy_steps} noisy steps, b {config.noise_scale:.4g}, {len(seeds)} seeds"
    )
    if papers:
        print(f"papers' code: {papers['code']} ({papers['environment']}), set up in "
              f"{papers['setup_seconds']:.2f} s (untimed, like the graph load)")  # fmt: skip
    ratios = [("x naive (p50)", "speedup_vs_naive")] if naive_p50 else []
    ratios += [("x papers (p50)", "speedup_vs_papers")] if papers_p50 else []
    print_table(
        ["mechanism", "batch", "p50 ms/query", "p90 ms/query", *(title for title, _ in ratios)],
        [
            [r["mechanism"], str(r["batch"]), f"{r['p50_ms']:.2f}", f"{r['p90_ms']:.2f}",
             *("-" if r[key] is None else f"{r[key]:.1f}" for _, key in ratios)]
            for r in rows
        ],
    )  # fmt: skip
    return 0
