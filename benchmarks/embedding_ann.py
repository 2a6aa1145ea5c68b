"""Nearest-neighbour libraries on edge-mode DP-IE embeddings of every node of a generated graph.

Computes the all-node release's vectors with the release's own code
(:func:`service.embeddings.all_nodes.edge_embeddings`: PushFlowCap in `edge` mode, InstantEmbedding,
Lap(sigma n / eps) per coordinate, rounded to the grid), then builds an HNSW index with usearch,
faiss-cpu and hnswlib (same M and ef_construction) and measures, against exact search:

- recall@10: |ANN top 10 & exact top 10| / 10 over ``--queries`` random nodes, each querying
  with its own vector and its own row left out (the endpoint's question);
- build time (``--threads`` threads), index file size, and the process's resident-set growth
  during the build;
- per-query latency p50 / p99, one query at a time on one thread, at each ``--ef``.

The metric is cosine (inner product of L2-normalized vectors): InstantEmbedding is feature
hashing, which preserves inner products in expectation (E <H^T x, H^T y> = <x, y>), and the
Laplace noise is zero-mean and independent between nodes, so inner products are unbiased
estimates of the log-mass vectors' inner products; normalizing removes the vectors' overall
scale (a high-degree seed's larger mass) and the noise norm, which is the same for every row.

    python benchmarks/embedding_ann.py --generate 100000,2000000 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.embeddings.all_nodes import edge_embeddings
from service.embeddings.dp import DEFAULT_EMBEDDING_SIGMA, DEFAULT_K, EMBEDDING_ROUNDS
from service.embeddings.hashing import embedding_hashes, new_salt
from service.graph.generate import generate_graph
from service.mechanisms.randomness import fresh_generator

TOP = 10


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def exact_neighbours(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Exact top TOP by inner product of normalized rows, the query's own row left out."""
    scores = vectors[queries] @ vectors.T
    scores[np.arange(queries.size), queries] = -np.inf
    top = np.argpartition(-scores, TOP, axis=1)[:, :TOP]
    return top


def drop_self(found: np.ndarray, query: int) -> list[int]:
    return [int(x) for x in found if int(x) != query][:TOP]


class Library:
    name = ""

    def build(self, vectors: np.ndarray, m: int, ef_construction: int, threads: int) -> None:
        raise NotImplementedError

    def set_ef(self, ef: int) -> None:
        raise NotImplementedError

    def query(self, vector: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def save(self, path: Path) -> None:
        raise NotImplementedError


class Usearch(Library):
    name = "usearch (HNSW, cos, f32)"

    def build(self, vectors: np.ndarray, m: int, ef_construction: int, threads: int) -> None:
        from usearch.index import Index

        self.index = Index(ndim=vectors.shape[1], metric="cos", dtype="f32",
                           connectivity=m, expansion_add=ef_construction)  # fmt: skip
        self.index.add(np.arange(vectors.shape[0], dtype=np.uint64), vectors, threads=threads)

    def set_ef(self, ef: int) -> None:
        self.index.expansion_search = ef

    def query(self, vector: np.ndarray) -> np.ndarray:
        return np.asarray(self.index.search(vector, TOP + 1, threads=1).keys)

    def save(self, path: Path) -> None:
        self.index.save(str(path))


class Faiss(Library):
    name = "faiss-cpu (IndexHNSWFlat, IP)"

    def build(self, vectors: np.ndarray, m: int, ef_construction: int, threads: int) -> None:
        import faiss

        faiss.omp_set_num_threads(threads)
        self.index = faiss.IndexHNSWFlat(vectors.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = ef_construction
        self.index.add(vectors)
        faiss.omp_set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.index.hnsw.efSearch = ef

    def query(self, vector: np.ndarray) -> np.ndarray:
        _, found = self.index.search(vector[None, :], TOP + 1)
        return np.asarray(found[0])

    def save(self, path: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(path))


class Hnswlib(Library):
    name = "hnswlib (cosine)"

    def build(self, vectors: np.ndarray, m: int, ef_construction: int, threads: int) -> None:
        import hnswlib

        self.index = hnswlib.Index(space="cosine", dim=vectors.shape[1])
        self.index.init_index(max_elements=vectors.shape[0], ef_construction=ef_construction, M=m)
        self.index.add_items(vectors, np.arange(vectors.shape[0]), num_threads=threads)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def query(self, vector: np.ndarray) -> np.ndarray:
        found, _ = self.index.knn_query(vector[None, :], k=TOP + 1, num_threads=1)
        return np.asarray(found[0])

    def save(self, path: Path) -> None:
        self.index.save_index(str(path))


LIBRARIES: dict[str, Callable[[], Library]] = {
    "usearch": Usearch,
    "faiss": Faiss,
    "hnswlib": Hnswlib,
}


def measure(
    library: Library, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:  # fmt: skip
    gc.collect()
    before = rss_mb()
    started = time.perf_counter()
    library.build(vectors, args.m, args.ef_construction, args.threads)
    build = time.perf_counter() - started
    grown = rss_mb() - before
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index"
        library.save(path)
        size = path.stat().st_size / 2**20
    rows = []
    for ef in args.ef:
        library.set_ef(ef)
        hits = 0
        latencies = []
        for q, expected in zip(queries, truth, strict=True):
            vector = vectors[q]
            t = time.perf_counter()
            found = library.query(vector)
            latencies.append(time.perf_counter() - t)
            hits += len(set(drop_self(found, int(q))) & set(expected.tolist()))
        ms = np.asarray(latencies) * 1e3
        rows.append({
            "library": library.name, "ef": ef, "recall": hits / (TOP * queries.size),
            "build": build, "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)),
            "size": size, "rss": grown,
        })  # fmt: skip
    return rows


def exact_row(vectors: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    latencies = []
    for q in queries[:200]:
        t = time.perf_counter()
        scores = vectors @ vectors[q]
        scores[q] = -np.inf
        np.argpartition(-scores, TOP)[:TOP]
        latencies.append(time.perf_counter() - t)
    ms = np.asarray(latencies) * 1e3
    return {"library": "exact (numpy matvec)", "ef": "-", "recall": 1.0, "build": 0.0,
            "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "size": vectors.nbytes / 2**20, "rss": 0.0}  # fmt: skip


def usearch_exact_row(vectors: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """usearch's brute-force search (``exact=True``), one query at a time on one thread."""
    from usearch.index import MetricKind, search

    latencies = []
    for q in queries[:200]:
        t = time.perf_counter()
        search(vectors, vectors[q], TOP + 1, MetricKind.Cos, exact=True, threads=1)
        latencies.append(time.perf_counter() - t)
    ms = np.asarray(latencies) * 1e3
    return {"library": "usearch exact (exact=True)", "ef": "-", "recall": 1.0, "build": 0.0,
            "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "size": vectors.nbytes / 2**20, "rss": 0.0}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generate", default="100000,2000000", metavar="NODES,EDGES")
    parser.add_argument("--epsilon", type=float, default=1.0, help="per-node epsilon")
    parser.add_argument("--sigma", type=float, default=DEFAULT_EMBEDDING_SIGMA)
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--rounds", type=int, default=EMBEDDING_ROUNDS, help="PushFlowCap's R")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--m", type=int, default=16, help="HNSW M (links per node)")
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--ef", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--threads", type=int, default=2, help="build threads")
    parser.add_argument("--libraries", nargs="*", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--cache", type=Path, default=None,
                        help=".npy file: reuse these embeddings if it exists, else "
                        "write them")  # fmt: skip
    args = parser.parse_args()
    nodes, edges = (int(p) for p in args.generate.split(","))
    if args.cache is not None and args.cache.exists():
        released = np.load(args.cache)
        print(f"embeddings from {args.cache}: {released.shape}")
    else:
        graph = generate_graph(nodes, edges, seed=0)
        hashes = embedding_hashes(graph.node_ids, new_salt(), args.k)
        started = time.perf_counter()
        released, grid, plan = edge_embeddings(
            graph, hashes, np.arange(graph.n), args.epsilon, args.sigma, fresh_generator(),
            rounds=args.rounds,
        )  # fmt: skip
        print(f"edge-mode DP-IE of {graph.n} nodes ({graph.m} edges), k {args.k}, sigma "
              f"{args.sigma:g}, R {args.rounds}, eps {args.epsilon:g} each (noise scale "
              f"{plan.scale:g}, grid {grid:g}): {time.perf_counter() - started:.0f} s")  # fmt: skip
        if args.cache is not None:
            np.save(args.cache, released)
    vectors = np.asarray(released, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = np.ascontiguousarray(vectors / np.where(norms > 0, norms, 1.0))
    queries = np.random.default_rng(7).choice(vectors.shape[0], args.queries, replace=False)
    truth = exact_neighbours(vectors, queries)
    rows = [exact_row(vectors, queries), usearch_exact_row(vectors, queries)]
    for name in args.libraries:
        rows += measure(LIBRARIES[name](), vectors, queries, truth, args)
    print(f"\n{vectors.shape[0]} vectors, k {vectors.shape[1]}, cosine; HNSW M {args.m}, "
          f"ef_construction {args.ef_construction}, build on {args.threads} threads; "
          f"{args.queries} queries, one at a time on one thread\n")  # fmt: skip
    print(
        "| library | ef | recall@10 | build s | query p50 ms | query p99 ms | index MiB | "
        "RSS growth MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['library']} | {r['ef']} | {r['recall']:.3f} | {r['build']:.1f} | "
              f"{r['p50']:.3f} | {r['p99']:.3f} | {r['size']:.0f} | {r['rss']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
