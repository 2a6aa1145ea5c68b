"""Where the time of the lazy count rankings goes as the graph grows: ``friends_of_friends`` and
``blended`` on generated graphs, with timers around the samplers' parts.

The loop is ``bench``'s for these two mechanisms (the same seeds, ``default_rng(12345)`` over
the nodes with an edge; epsilon 0.1; the ranked top ``1000 + d(s)`` the service stores; the
degree release and its order made once before timing). Around it, the samplers' functions are
wrapped with timers (the functions themselves run unchanged): per mechanism, the mean and p50
ms a query, then the mean ms a query spent in each part (nested parts count in their callers
too), how many calls a query made, and for the exact binomial counts' Binomial(u, 1/2) draws
the raw 64-bit words of the popcounts (u up to ``POPCOUNT_LIMIT``) and the number of rejection
draws above it (service/mechanisms/exact_binomial.py; before it, the counts were popcounts of
about 2 n / 64 words, the part that grew with n).
``--blocks`` times ``blended`` again for each value of ``lazy_blend.MIN_BLOCK``, interleaved
on the same seeds (a cost, never the law).

    .venv/bin/python benchmarks/scale_where.py --generate 100000,1000000 1000000,10000000
    .venv/bin/python benchmarks/scale_where.py --generate 1000000,10000000 --blocks 256 2048
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import service.mechanisms.friends_of_friends as fof
import service.mechanisms.lazy_blend as lb
import service.mechanisms.lazy_top_k as ltk
from service.cli.bench import SERVED_TOP, generate_spec
from service.graph.generate import generate_graph
from service.graph.model import Graph
from service.mechanisms.blended import degree_standard
from service.mechanisms.exact_binomial import POPCOUNT_LIMIT
from service.mechanisms.popular import noisy_degrees
from service.privacy.laplace import (
    DEGREE_SENSITIVITY,
    TwoScalePlan,
    plan_laplace,
    plan_two_scale,
)

SPENT: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()
WORDS: collections.Counter[str] = collections.Counter()


def _timed(owner: Any, name: str, label: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - started
            CALLS[label] += 1

    setattr(owner, name, timed)


def _instrument() -> None:
    half = ltk.binomial_half  # instrumented in place, for its word count

    def counted(rng: np.random.Generator, u: int) -> int:
        if u <= POPCOUNT_LIMIT:
            WORDS["raw"] += (u + 63) // 64
        else:
            WORDS["rejection"] += 1
        return half(rng, u)

    ltk.binomial_half = counted
    _timed(ltk, "binomial_half", "binomial_half")
    for owner in (ltk, lb):
        _timed(owner, "binomial_count", "binomial_count")
        _timed(owner, "distinct_uniform", "distinct_uniform")
    for owner in (fof, lb):
        _timed(owner, "split_neighbourhood", "split_neighbourhood")
    _timed(fof, "lazy_top", "lazy_top")
    for name in ("lower", "extend"):
        _timed(lb.LazyCandidates, name, name)
    for name in ("range_levels", "lazy_rank_to_index", "_settle", "ranked_first"):
        _timed(lb, name, name)


def _query(
    graph: Graph,
    plan: TwoScalePlan,
    degrees: np.ndarray,
    degree_scale: float,
    name: str,
    seed: int,
) -> None:
    top = SERVED_TOP + int(graph.degrees[seed])  # what the service ranks and stores
    if name == "friends_of_friends":
        fof.friends_of_friends_top(graph, seed, plan, top)
    else:
        lb.blended_top(graph, seed, plan, degrees, degree_scale, top)


def bench_queries(graph: Graph, queries: int) -> tuple[np.ndarray, Callable[[str, int], None]]:
    """``bench``'s seeds on ``graph`` and a function querying one ``(mechanism, seed)`` as the
    service ranks and stores it (the degree release and its order made once, here)."""
    degree_plan = plan_laplace(0.1, DEGREE_SENSITIVITY)
    degrees = noisy_degrees(graph, degree_plan)
    degree_standard(degrees, degree_plan.scale)  # once per graph version in the service
    pick = np.random.default_rng(12345)
    seeds = pick.choice(np.flatnonzero(graph.degrees > 0), queries, replace=False)
    plan = plan_two_scale(0.1)
    return seeds, partial(_query, graph, plan, degrees, degree_plan.scale)


def _report(label: str, times: list[float]) -> None:
    q = len(times)
    print(f"{label}: p50 {1000 * np.median(times):.2f} ms, mean {1000 * np.mean(times):.2f} ms")
    for part in sorted(SPENT, key=lambda p: -SPENT[p]):
        print(f"   {part:22s} {1000 * SPENT[part] / q:7.3f} ms/query ({CALLS[part] / q:.1f} calls)")
    print(
        f"   binomial counts: {WORDS['raw'] / q:,.0f} raw words of popcounts and"
        f" {WORDS['rejection'] / q:,.1f} rejection draws a query",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--generate", type=generate_spec, nargs="+", required=True,
                        metavar="NODES,EDGES")  # fmt: skip
    parser.add_argument("--mechanisms", nargs="+", default=["friends_of_friends", "blended"],
                        choices=["friends_of_friends", "blended"])  # fmt: skip
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--blocks", type=int, nargs="*", default=[],
                        help="MIN_BLOCK values to time blended at, interleaved")  # fmt: skip
    args = parser.parse_args(argv)
    _instrument()
    for nodes, edges in args.generate:
        started = time.perf_counter()
        graph = generate_graph(nodes, edges, seed=0)
        print(f"n {nodes:,} m {edges:,}: generated in {time.perf_counter() - started:.1f} s")
        seeds, query = bench_queries(graph, args.queries)
        runs = [(name, None) for name in args.mechanisms]
        runs += [("blended", block) for block in args.blocks]
        for name, block in runs:
            if block is not None:
                lb.MIN_BLOCK = block
            query(name, int(seeds[0]))  # warm
            SPENT.clear(), CALLS.clear(), WORDS.clear()
            times = []
            for seed in (int(s) for s in seeds):
                started = time.perf_counter()
                query(name, seed)
                times.append(time.perf_counter() - started)
            _report(name if block is None else f"{name}, MIN_BLOCK {block}", times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
