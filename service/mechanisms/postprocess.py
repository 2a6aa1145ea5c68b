"""Post-processing of a released vector: free of privacy cost, never touches the graph's edges
(except the seed's own neighbours, which only the personalized mode may use)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.graph.model import Graph


def top_k(scores: np.ndarray, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest scores (clipped at 0), best first, without ``exclude``.

    Ties are broken by index so the ranking of a given vector is deterministic.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    values = np.maximum(np.asarray(scores, dtype=np.float64), 0.0)
    candidates = np.ones(values.shape[0], dtype=bool)
    if exclude is not None and len(exclude):
        candidates[np.asarray(exclude, dtype=np.int64)] = False
    pool = np.flatnonzero(candidates)
    k = min(k, pool.shape[0])
    if k == 0:
        return pool[:0]
    pool_values = values[pool]
    if k < pool.shape[0]:
        part = np.argpartition(-pool_values, k - 1)[:k]
        # include every candidate tied with the k-th value so tie-breaking is by index
        kth = pool_values[part].min()
        part = np.flatnonzero(pool_values >= kth)
    else:
        part = np.arange(pool.shape[0])
    order = np.lexsort((pool[part], -pool_values[part]))
    return pool[part][order][:k]


@dataclass(frozen=True)
class RankedNode:
    """One entry of a released ranking, by external id."""

    node: str
    score: float


def ranked_results(
    graph: Graph,
    seed: int,
    scores: np.ndarray,
    k: int,
    *,
    exclude_neighbors: bool = False,
) -> list[RankedNode]:
    """Top-k of a released vector with external ids, the seed excluded.

    ``exclude_neighbors`` also drops the seed's neighbours: it uses the seed's own edges, which
    only the personalized model leaves unprotected, so callers allow it only in that mode.
    """
    exclude = np.array([seed], dtype=np.int64)
    if exclude_neighbors:
        exclude = np.concatenate([exclude, graph.neighbors(seed).astype(np.int64)])
    best = top_k(scores, k, exclude)
    ids = graph.external_ids(best)
    values = np.maximum(scores[best], 0.0)
    return [RankedNode(node, float(score)) for node, score in zip(ids, values, strict=True)]
