"""``friends_of_friends`` and ``blended`` with the binomial counts' Binomial(u, 1/2) draws by the
popcount of u raw bits (as before service/mechanisms/exact_binomial.py) and by
``binomial_half`` (the rejection sampler above ``POPCOUNT_LIMIT``), interleaved query by query
on one generated graph, in one process.

The loop is ``bench``'s (``scale_where.bench_queries``: the same seeds, ``default_rng(12345)``
over the nodes with an edge; epsilon 0.1; the ranked top ``1000 + d(s)`` the service stores;
the degree release and its order made once before timing). Each seed is queried with one
sampler, then the other, the order alternating from seed to seed, after one warm query of
each; p50 and mean ms a query of each mechanism and sampler, and the ratio of the p50s. Both
samplers have the exact law, so the two columns time the same mechanism. The graph is
generated once, so the figures at 10M nodes cost one generation (about a minute) instead of
one per side.

    .venv/bin/python benchmarks/exact_binomial_ab.py --generate 100000,1000000 1000000,10000000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import service.mechanisms.lazy_top_k as ltk
from benchmarks.scale_where import bench_queries
from service.cli.bench import generate_spec
from service.graph.generate import generate_graph
from service.mechanisms.exact_binomial import binomial_half, binomial_half_popcount

SAMPLERS: dict[str, Callable[[np.random.Generator, int], int]] = {
    "popcount": binomial_half_popcount,
    "binomial_half": binomial_half,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--generate", type=generate_spec, nargs="+", required=True,
                        metavar="NODES,EDGES")  # fmt: skip
    parser.add_argument("--queries", type=int, default=20)
    args = parser.parse_args(argv)
    print("| nodes / edges | mechanism | popcount p50 (mean) ms | binomial_half p50 (mean) ms "
          "| p50 ratio |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: |")
    for nodes, edges in args.generate:
        seeds, query = bench_queries(generate_graph(nodes, edges, seed=0), args.queries)

        for name in ("friends_of_friends", "blended"):
            times: dict[str, list[float]] = {label: [] for label in SAMPLERS}
            order = list(SAMPLERS)
            for sampler in order:  # warm
                ltk.binomial_half = SAMPLERS[sampler]
                query(name, int(seeds[0]))
            for i, seed in enumerate(int(s) for s in seeds):
                for sampler in order if i % 2 == 0 else order[::-1]:
                    ltk.binomial_half = SAMPLERS[sampler]
                    started = time.perf_counter()
                    query(name, seed)
                    times[sampler].append(time.perf_counter() - started)
            ltk.binomial_half = binomial_half
            p50 = {label: 1000 * float(np.median(t)) for label, t in times.items()}
            mean = {label: 1000 * float(np.mean(t)) for label, t in times.items()}
            print(f"| {nodes:,} / {edges:,} | `{name}` "
                  f"| {p50['popcount']:.2f} ({mean['popcount']:.2f}) "
                  f"| {p50['binomial_half']:.2f} ({mean['binomial_half']:.2f}) "
                  f"| {p50['binomial_half'] / p50['popcount']:.2f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
