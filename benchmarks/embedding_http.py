"""DP-IE over HTTP: ``GET /v1/embeddings/{node}`` latency and the batch endpoint's seeds/s.

Starts ``python -m service serve`` (``--workers``, PostgreSQL in a fresh database next to
``--base-url``, Redis at ``--redis-url`` if given) on ``--graph FILE`` or a generated graph
(``--generate NODES,EDGES``, the generator's graph with seed 0, written to a temporary file),
then, one request at a time from one client (the latency of an answer, not a throughput):

* ``single, MODE``: ``--queries`` fresh seeds, each asked once (k 256, sigma 1e-3, eps 1):
  a node the worker has not embedded yet, so every answer computes PushFlowCap; `edge` mode is
  charged to a service account, `personalized` to each seed's user account (the service
  account asks for them);
* ``batch, MODE``: ``POST /v1/embeddings/batch`` of ``--batch`` fresh seeds, seeds per second.

Prints p50, p90 and max per row, and the load average before and after (a figure taken at
load > 1.5 is marked). Not part of the tests.

    .venv/bin/python benchmarks/embedding_http.py --generate 100000,2000000 --workers 1 \\
        --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from embedding_batch import accounts  # this folder's, beside it
from request_statements import drop_database, fresh_database

from service.graph.generate import write_generated_edge_list
from service.graph.loader import load_edge_list
from service.loadtest.server import served


def load() -> str:
    one = os.getloadavg()[0]
    return f"{one:.2f}{' (busy)' if one > 1.5 else ''}"


def row(name: str, millis: list[float], extra: str = "") -> None:
    ordered = sorted(millis)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    print(
        f"{name:<24} {statistics.median(ordered):>8.1f} {p90:>8.1f} {ordered[-1]:>8.1f} "
        f"{len(ordered):>6}  {extra}load {load()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--generate", metavar="NODES,EDGES")
    source.add_argument("--graph", type=Path)
    parser.add_argument(
        "--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--redis-url")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--port", type=int, default=8617)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--modes", nargs="+", default=["edge", "personalized"])
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="ppr-embedding-http-"))
    if args.generate:
        nodes, edges = (int(x) for x in args.generate.split(","))
        path = folder / "graph.txt"
        graph = write_generated_edge_list(path, nodes, edges, seed=0)
    else:
        path = args.graph
        graph = load_edge_list(path)
    rng = np.random.default_rng(2026)
    per_mode = args.queries + args.batch + 1
    picks = rng.choice(graph.n, per_mode * len(args.modes), replace=False)
    seeds = [str(s) for s in graph.external_ids(picks)]
    name = f"ppr_embedding_http_{os.getpid()}"
    url = fresh_database(args.base_url, name)
    try:
        with served(
            port=args.port, workers=args.workers, graph=path, database_url=url,
            redis_url=args.redis_url, log_path=folder / "serve.log",
        ) as base:  # fmt: skip
            key = accounts(url, seeds)
            headers = {"Authorization": f"Bearer {key}"}
            print(
                f"graph: {graph.n} nodes, {graph.m} edges; {args.workers} worker(s), "
                f"PostgreSQL{' + Redis' if args.redis_url else ''}; k 256, sigma 1e-3, eps 1; "
                f"load before {load()}"
            )
            print(f"{'row':<24} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8} {'count':>6}")
            with httpx.Client(base_url=base, headers=headers, timeout=600) as client:
                params = {"k": 256, "sigma": 1e-3, "epsilon": 1.0}
                for index, mode in enumerate(args.modes):
                    mine = seeds[index * per_mode : (index + 1) * per_mode]
                    warm = client.get(f"/v1/embeddings/{mine[0]}", params={**params, "mode": mode})
                    warm.raise_for_status()
                    millis = []
                    for seed in mine[1 : 1 + args.queries]:
                        start = time.perf_counter()
                        answer = client.get(
                            f"/v1/embeddings/{seed}", params={**params, "mode": mode}
                        )
                        millis.append((time.perf_counter() - start) * 1000)
                        answer.raise_for_status()
                    row(f"single, {mode}", millis)
                    batch = mine[1 + args.queries :]
                    body = {"nodes": batch, "mode": mode, "k": 256, "sigma": 1e-3, "epsilon": 1.0}
                    start = time.perf_counter()
                    response = client.post("/v1/embeddings/batch", json=body)
                    wall = time.perf_counter() - start
                    response.raise_for_status()
                    failed = [i for i in response.json()["items"] if "error" in i]
                    if failed:
                        print(f"batch, {mode}: {len(failed)} items failed: {failed[0]}")
                        return 1
                    row(f"batch {len(batch)}, {mode}", [wall * 1000],
                        f"{len(batch) / wall:.1f} seeds/s  ")  # fmt: skip
    finally:
        drop_database(args.base_url, name)
    print(f"load after {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
