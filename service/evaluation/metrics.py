"""Ranking quality of a private ranking against exact PPR (pure functions).

Definitions (the papers' setting, made explicit):

- The *ideal list* is the exact top-k: the k nodes with the largest exact PPR score, ``exclude``
  removed, ties broken by index, keeping only nodes with a positive exact score (a node the
  seed cannot reach has PPR 0 and is not relevant to it).
- NDCG@k: the gain of a node is its exact PPR score (graded relevance). DCG of a list =
  sum_i gain(list[i]) / log2(i + 2) over its first k entries (i from 0); NDCG = DCG(private
  list) / DCG(ideal list), in [0, 1].
- Recall@k = |private top-k ∩ ideal list| / |ideal list| (= / k unless fewer than k nodes are
  relevant).
- ``exclude`` is removed from both lists: the seed for the papers' metric; the seed and its
  neighbours for the "beyond neighbours" variant.
- A metric is undefined (NaN) when no candidate is relevant (empty ideal list);
  :func:`mean_ci` skips NaNs.

Confidence intervals: mean ± t_{0.975, n-1} * s / sqrt(n) over the seeds (Student t).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from service.mechanisms.postprocess import top_k

__all__ = [
    "dcg",
    "ideal_ranking",
    "mean_ci",
    "ndcg_at_k",
    "private_ranking",
    "recall_at_k",
]


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")


def dcg(gains: np.ndarray) -> float:
    """sum_i gains[i] / log2(i + 2), i from 0 (the first entry has discount 1)."""
    g = np.asarray(gains, dtype=np.float64)
    return float(np.sum(g / np.log2(np.arange(g.shape[0]) + 2.0)))


def ideal_ranking(exact: np.ndarray, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """The exact top-k (indices, best first) without ``exclude`` and without zero-score nodes."""
    _check_k(k)
    best = np.asarray(top_k(exact, k, exclude), dtype=np.int64)
    keep = np.asarray(exact, dtype=np.float64)[best] > 0
    return np.asarray(best[keep], dtype=np.int64)


def private_ranking(scores: np.ndarray, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """A private vector's top-k (indices, best first, scores clipped at 0), ``exclude`` removed."""
    _check_k(k)
    return top_k(scores, k, exclude)


def _filtered(ranking: np.ndarray, k: int, exclude: np.ndarray | None) -> np.ndarray:
    ranked = np.asarray(ranking, dtype=np.int64)
    if exclude is not None and len(exclude):
        ranked = ranked[~np.isin(ranked, np.asarray(exclude, dtype=np.int64))]
    return ranked[:k]


def ndcg_at_k(
    ranking: np.ndarray, exact: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> float:
    """NDCG@k of ``ranking`` (indices, best first) with gain = exact PPR score; NaN if undefined."""
    _check_k(k)
    exact = np.asarray(exact, dtype=np.float64)
    ideal = ideal_ranking(exact, k, exclude)
    best = dcg(exact[ideal])
    if best <= 0:
        return math.nan
    ranked = _filtered(ranking, k, exclude)
    return min(1.0, dcg(exact[ranked]) / best)


def recall_at_k(
    ranking: np.ndarray, exact: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> float:
    """|ranking[:k] ∩ exact top-k| / |exact top-k| (``exclude`` removed); NaN if undefined."""
    _check_k(k)
    ideal = ideal_ranking(np.asarray(exact, dtype=np.float64), k, exclude)
    if ideal.shape[0] == 0:
        return math.nan
    ranked = _filtered(ranking, k, exclude)
    hits = int(np.intersect1d(ranked, ideal, assume_unique=True).shape[0])
    return hits / int(ideal.shape[0])


def mean_ci(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> tuple[float, tuple[float, float]]:
    """Mean and two-sided Student-t confidence interval of the finite values.

    NaN mean and interval with no finite value; a zero-width interval is never invented: with a
    single value the interval is (NaN, NaN).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.shape[0] == 0:
        return math.nan, (math.nan, math.nan)
    mean = float(v.mean())
    if v.shape[0] < 2:
        return mean, (math.nan, math.nan)
    sem = float(v.std(ddof=1)) / math.sqrt(v.shape[0])
    half = float(stats.t.ppf(0.5 + confidence / 2.0, v.shape[0] - 1)) * sem
    return mean, (mean - half, mean + half)


def json_number(x: float) -> float | None:
    """A metric for JSON: NaN (undefined, e.g. no seed had a hidden edge) becomes None."""
    return None if math.isnan(x) else float(x)


def json_interval(ci: tuple[float, float]) -> list[float | None]:
    """An interval for JSON, as [low, high] (NaN ends become None)."""
    return [json_number(ci[0]), json_number(ci[1])]
