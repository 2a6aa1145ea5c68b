"""Post-processing of a released vector: free of privacy cost, never touches the graph's edges
(except the seed's own neighbours, which only the personalized mode may use)."""

from __future__ import annotations

import numpy as np


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
