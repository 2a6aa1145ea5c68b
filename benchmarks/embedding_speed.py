"""DP-IE's speed in process: one query, a batch's block, the all-node release, per node.

On one graph (``--generate NODES,EDGES``, the generator's graph with seed 0, or ``--graph
FILE``), k 256, sigma 1e-3, R 100, ``--mode`` (`edge` by default), the same seeds for every
row, interleaved:

* with ``--dense``, ``query, dense``: the reference path (the service's single query before
  issue 34): ``pushflowcap_dense``, then ``dp_instant_embedding`` (InstantEmbedding, exact noise);
* ``query, floor 0``: the paper's Algorithm 2 in its compiled kernel (every row, every round),
  then the same steps: what ``GET /v1/embeddings/{node}`` ran before the floor;
* ``query, floor F``: what it runs now for a node it has not computed yet: PushFlowCap with the
  floor (``EMBEDDING_FLOOR``), then the same steps;
* ``query, kept``: the same node again (the noise-free vector kept, fresh noise drawn);
* ``block B``: ``NoiseFreeEmbeddings.vectors`` of B seeds at once (the batch endpoint), per seed;
* ``release, T thread(s)``: ``edge_instant_embeddings`` (the all-node release's computation,
  `edge` mode, with the floor) on ``--release-nodes`` nodes, per node; and ``release, floor 0``,
  the same at floor 0 (Algorithm 2 in blocks of 16, what the release ran before) on an eighth
  of them;
* with ``--before REV``: ``release, REV kernel``: the all-node kernel of git revision REV
  (``git show REV:service/embeddings/all_nodes.py``), for a before/after in one run.

Every row prints the median wall time and the median CPU time of the timing thread (the
release rows: wall time per node; CPU time of all threads per node), and the load average
before and after: the machine is shared, and a figure taken at load > 1.5 is marked.

    .venv/bin/python benchmarks/embedding_speed.py --generate 10312,333983
    .venv/bin/python benchmarks/embedding_speed.py --generate 100000,2000000 --queries 5 \\
        --mode personalized

``--write-labelled DIR`` writes the generated graph (``graph.txt``) and its community of each
node as a label (``labels.txt``, ``--communities`` blocks) for ``evaluate --task
classification``, and exits. Not part of the tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.embeddings.all_nodes import edge_instant_embeddings
from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    EMBEDDING_ROUNDS,
    dp_instant_embedding,
)
from service.embeddings.hashing import embedding_hashes, new_salt
from service.embeddings.noise_free import NoiseFreeEmbeddings
from service.graph.generate import generate_graph, write_edge_list
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.mechanisms.floored_pushflowcap import floored_pushflowcap
from service.mechanisms.pushflowcap import pushflowcap, pushflowcap_dense
from service.privacy.modes import Mode

SIGMA = 1e-3
EPSILON = 1.0


def load() -> str:
    one = os.getloadavg()[0]
    return f"{one:.2f}{' (busy)' if one > 1.5 else ''}"


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def row(name: str, samples: list[tuple[float, float]], per: int = 1) -> None:
    wall = statistics.median(s[0] for s in samples) / per * 1000
    cpu = statistics.median(s[1] for s in samples) / per * 1000
    print(f"{name:<28} {wall:>10.1f} {cpu:>10.1f} {len(samples) * per:>6}  load {load()}")


def old_kernel(rev: str) -> Any:
    """The all-node computation of revision ``rev`` (its module, loaded from git)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:service/embeddings/all_nodes.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "all_nodes_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("all_nodes_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_labelled(graph: Graph, nodes: int, communities: int, out: Path) -> None:
    """The graph and each node's community block (the generator's formula) as its label."""
    out.mkdir(parents=True, exist_ok=True)
    write_edge_list(out / "graph.txt", graph)
    share = np.cumsum(1.0 / np.sqrt(np.arange(1, communities + 1, dtype=np.float64)))
    bounds = np.floor(share / share[-1] * nodes).astype(np.int64)
    bounds = np.minimum(np.maximum(bounds, np.arange(1, communities + 1)), nodes)
    label = np.repeat(np.arange(communities), np.diff(np.concatenate(([0], bounds))))
    ids = graph.external_ids(np.arange(graph.n, dtype=np.int64))
    with open(out / "labels.txt", "w") as f:
        for i in range(graph.n):
            f.write(f"{ids[i]} g{label[int(ids[i])]}\n")
    print(f"wrote {out / 'graph.txt'} ({graph.n} nodes, {graph.m} edges) and {out / 'labels.txt'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--generate", metavar="NODES,EDGES")
    source.add_argument("--graph", type=Path)
    parser.add_argument("--queries", type=int, default=10, help="seeds timed per query row")
    parser.add_argument("--blocks", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--release-nodes", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--before", metavar="REV", help="also time REV's all-node kernel")
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--communities", type=int, default=39)
    parser.add_argument("--write-labelled", type=Path, metavar="DIR")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.EDGE.value)
    parser.add_argument("--dense", action="store_true", help="also time the dense reference")
    args = parser.parse_args()
    mode = Mode(args.mode)

    if args.generate:
        nodes, edges = (int(x) for x in args.generate.split(","))
        if args.write_labelled:
            graph = generate_graph(nodes, edges, seed=0, communities=args.communities)
            write_labelled(graph, nodes, args.communities, args.write_labelled)
            return 0
        graph = generate_graph(nodes, edges, seed=0)
    else:
        graph = load_edge_list(args.graph)
    hashes = embedding_hashes(graph.external_ids(np.arange(graph.n)), new_salt(), args.k)
    pick = np.random.default_rng(12345)
    seeds = [int(s) for s in pick.choice(graph.n, size=args.queries, replace=False)]
    print(f"graph: {graph.n} nodes, {graph.m} edges; k {args.k}, sigma {SIGMA:g}, "
          f"R {EMBEDDING_ROUNDS}, {mode.value} mode, floor {EMBEDDING_FLOOR:g}; "
          f"load before {load()}")  # fmt: skip
    print(f"{'row':<28} {'wall ms':>10} {'cpu ms':>10} {'nodes':>6}  (per node, median)")

    def query(capped: Callable[[int], np.ndarray]) -> Callable[[int], Any]:
        return lambda s: dp_instant_embedding(
            graph, s, hashes, EPSILON, SIGMA, mode, capped=capped(s)
        )

    paths = {
        "dense": query(lambda s: pushflowcap_dense(graph, s, EMBEDDING_BETA, EMBEDDING_ROUNDS,
                                                   SIGMA, mode)),
        "floor 0": query(lambda s: pushflowcap(graph, s, EMBEDDING_BETA, EMBEDDING_ROUNDS,
                                               SIGMA, mode)),
        f"floor {EMBEDDING_FLOOR:g}": query(lambda s: floored_pushflowcap(
            graph, s, EMBEDDING_BETA, EMBEDDING_ROUNDS, SIGMA, mode, EMBEDDING_FLOOR)),
    }  # fmt: skip
    if not args.dense:
        del paths["dense"]
    kept = NoiseFreeEmbeddings()

    def from_kept(s: int) -> Any:
        w = kept.vector(graph, s, hashes, SIGMA, mode, EMBEDDING_BETA, EMBEDDING_ROUNDS)
        return dp_instant_embedding(graph, s, hashes, EPSILON, SIGMA, mode, embedded=w)

    for path in paths.values():
        path(seeds[0])  # compile (or load numba's cache) before timing
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in [*paths, "kept"]}
    for s in seeds:
        for name, path in paths.items():
            samples[name].append(timed(lambda s=s, path=path: path(s)))  # type: ignore[misc]
        from_kept(s)
        samples["kept"].append(timed(lambda s=s: from_kept(s)))  # type: ignore[misc]
    for name in samples:
        row(f"query, {name}", samples[name])

    for size in args.blocks:
        block = [int(s) for s in pick.choice(graph.n, size=size, replace=False)]
        fresh = NoiseFreeEmbeddings(max_bytes=0, block=size)
        sample = timed(lambda b=block, f=fresh: f.vectors(  # type: ignore[misc]
            graph, b, hashes, SIGMA, mode, EMBEDDING_BETA, EMBEDDING_ROUNDS))  # fmt: skip
        row(f"block {size}", [sample], per=size)

    release = np.array(pick.choice(graph.n, size=args.release_nodes, replace=False))
    if args.before:
        before = old_kernel(args.before)
        part = release[: max(4, args.release_nodes // 8)]
        before.edge_instant_embeddings(graph, hashes, part[:1], SIGMA, rounds=2)  # compile
        sample = timed(lambda: before.edge_instant_embeddings(graph, hashes, part, SIGMA))
        row(f"release, {args.before} kernel", [sample], per=part.size)
    part = release[: max(4, args.release_nodes // 8)]
    runs: list[tuple[float, np.ndarray]] = [(0.0, part), (EMBEDDING_FLOOR, release)]
    for floor, chosen in runs:
        for threads in args.threads:
            wall, cpu = time.perf_counter(), time.process_time()
            edge_instant_embeddings(graph, hashes, chosen, SIGMA, floor=floor, threads=threads)
            sample = (time.perf_counter() - wall, time.process_time() - cpu)
            row(f"release, floor {floor:g}, {threads} thr", [sample], per=chosen.size)
    print(f"load after {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
