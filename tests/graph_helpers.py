"""Small graphs for tests, built straight from edge lists (independent of the file loader)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

from service.graph.model import Graph, GraphStats
from service.graph.node_ids import ListedIds


def graph_from_edges(edges: Iterable[tuple[int, int]], n: int | None = None) -> Graph:
    """Undirected simple graph on nodes 0..n-1 (ids "0".."n-1"); self-loops and repeats dropped."""
    pairs = {(min(u, v), max(u, v)) for u, v in edges if u != v}
    size = n if n is not None else (max((max(p) for p in pairs), default=-1) + 1)
    rows = np.array([u for u, v in pairs] + [v for u, v in pairs], dtype=np.int64)
    cols = np.array([v for u, v in pairs] + [u for u, v in pairs], dtype=np.int64)
    matrix = sp.csr_matrix((np.ones(rows.shape[0]), (rows, cols)), shape=(size, size))
    matrix.sort_indices()
    degrees = np.diff(matrix.indptr).astype(np.int64)
    ids = [str(i) for i in range(size)]
    stats = GraphStats(
        nodes=size,
        edges=len(pairs),
        degree_min=int(degrees.min(initial=0)),
        degree_mean=float(degrees.mean()) if size else 0.0,
        degree_max=int(degrees.max(initial=0)),
        isolated_nodes=int((degrees == 0).sum()),
    )
    return Graph(
        indptr=matrix.indptr.astype(np.int64),
        indices=matrix.indices.astype(np.int32),
        degrees=degrees,
        ids=ListedIds(ids),
        version=f"test-{hash(frozenset(pairs)) & 0xFFFFFFFF:08x}-{size}",
        stats=stats,
    )


def random_graph(n: int, p: float, rng: np.random.Generator) -> Graph:
    upper = np.triu(rng.random((n, n)) < p, k=1)
    u, v = np.nonzero(upper)
    return graph_from_edges(zip(u.tolist(), v.tolist(), strict=True), n)
