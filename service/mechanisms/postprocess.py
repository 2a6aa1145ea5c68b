"""Post-processing of a released vector: free of privacy cost, never touches the graph's edges
(except the seed's own neighbours, which only the personalized mode may use)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from service.errors import InvalidParameter

if TYPE_CHECKING:  # a type only: the ledger reads RankedNode without loading graphs (scipy)
    from service.graph.model import Graph


def top_k(scores: np.ndarray, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest scores (clipped at 0), best first, without ``exclude``.

    Ties are broken by index so the ranking of a given vector is deterministic.

    The excluded entries are marked below every candidate (-inf; the candidates are >= 0),
    the k-th largest value is found by a partition of the values alone, every candidate at
    least that large is kept (so all of a tie at the k-th value are, and ties break by
    index), and those are sorted by value with a stable sort (they are in index order): the
    ranking of :func:`top_k_reference`, in about half its time.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    values = np.maximum(np.asarray(scores, dtype=np.float64), 0.0)  # a new array: ours
    if math.isnan(values.sum()):  # NaN orders nowhere: the reference's ranking, as it was
        return top_k_reference(scores, k, exclude)
    n = values.shape[0]
    candidates = n
    if exclude is not None and len(exclude):
        excluded = np.asarray(exclude, dtype=np.int64)
        values[excluded] = -np.inf  # an index out of range raises, as in the reference
        candidates -= len({i % n for i in excluded.tolist()})  # each excluded entry once
    k = min(k, candidates)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if k < n:
        kth = np.partition(values, n - k)[n - k]
        part = np.flatnonzero(values >= kth)
    else:
        part = np.arange(n, dtype=np.int64)
    order = np.argsort(-values[part], kind="stable")
    return part[order[:k]]


def top_k_reference(scores: np.ndarray, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """:func:`top_k` as first written (the candidates' values gathered, ranked by a
    two-key sort): the ranking :func:`top_k` must give, and what it gives a vector with a
    NaN."""
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


#: The grid is this many times finer than the noise scale (and a power of two).
GRID_STEPS_PER_SCALE = 256
#: The grid of a release that carries no noise (a one-step personalized diffusion).
NOISELESS_GRID = 2.0**-40


def score_grid(noise_scale: float) -> float:
    """The grid released scores are rounded to: the largest power of two <= b / 256.

    A power of two, so that every multiple of it is an exact float64 (up to 2^53 steps) and
    dividing by it is exact. It is ~2^-8 of the noise scale, so rounding moves a score by far
    less than the noise already does, and ~2^30 times coarser than the float64 spacing of the
    scores, so no low-order bit of a floating-point Laplace sample survives (Mironov 2012).
    """
    if not noise_scale > 0 or not math.isfinite(noise_scale):
        return NOISELESS_GRID
    return float(2.0 ** math.floor(math.log2(noise_scale / GRID_STEPS_PER_SCALE)))


def count_grid(noise_scale: float) -> float:
    """The grid a count release's noise is drawn on: :func:`score_grid` of its scale, but at
    most 1, so that every integer count is a multiple of it and ``c + g N`` is exactly
    ``round_g(c + noise)`` (docs/privacy.md, "The Laplace sampler and its stated delta")."""
    return min(1.0, score_grid(noise_scale))


def checked_count_grid(grid: float | None, scale: float) -> float:
    """``grid``, or :func:`count_grid` of ``scale`` for None; refused above 1 (an integer
    count would not be a multiple of it)."""
    grid = count_grid(scale) if grid is None else float(grid)
    if not 0.0 < grid <= 1.0:
        raise InvalidParameter("grid", f"a count release's grid must be in (0, 1], got {grid!r}")
    return grid


def round_to_grid(scores: np.ndarray, grid: float) -> np.ndarray:
    """Each score as the nearest integer multiple of ``grid`` (post-processing): ties to
    even, as :func:`numpy.round` (which is :func:`numpy.rint` for 0 decimals), in place on
    the one new array."""
    rounded = grid_units(scores, grid)
    rounded *= grid
    return rounded


def grid_units(scores: np.ndarray, grid: float) -> np.ndarray:
    """Each score's nearest integer multiple of ``grid`` counted in grids (ties to even), as
    a new float64 array of integer values: :func:`round_to_grid` before its last product."""
    units = np.asarray(scores, dtype=np.float64) / grid
    np.rint(units, out=units)
    return units


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
    grid: float,
    exclude_neighbors: bool = False,
) -> list[RankedNode]:
    """Top-k of a released vector with external ids, the seed excluded.

    The vector is first rounded to multiples of ``grid`` (see :func:`score_grid`) and ranked
    as rounded (ties by internal index), so that nothing in the answer, order included,
    depends on bits below the grid.

    ``exclude_neighbors`` also drops the seed's neighbours: it uses the seed's own edges, which
    only the personalized model leaves unprotected, so callers allow it only in that mode.
    """
    best, values = ranked_indices(
        graph, seed, scores, k, grid=grid, exclude_neighbors=exclude_neighbors
    )
    ids = graph.external_ids(best)
    return [RankedNode(node, score) for node, score in zip(ids, values.tolist(), strict=True)]


def ranked_indices(
    graph: Graph,
    seed: int,
    scores: np.ndarray,
    k: int,
    *,
    grid: float,
    exclude_neighbors: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ranked_results` by internal index: (indices, scores rounded to the grid and
    clipped at 0), best first, without an object per entry.

    With a power-of-two grid (:func:`score_grid`'s) the ranking is :func:`top_k_units` of the
    scores in grid units: the ranking :func:`top_k` gives the rounded scores, since
    multiplying by a power of two keeps their order and their ties."""
    units = grid_units(scores, grid)
    exclude = np.array([seed], dtype=np.int64)
    if exclude_neighbors:
        exclude = np.concatenate([exclude, graph.neighbors(seed).astype(np.int64)])
    best = top_k_units(units, k, exclude) if math.frexp(grid)[0] == 0.5 else None
    if best is None:
        units *= grid  # round_to_grid(scores, grid)
        best = top_k(units, k, exclude)
        return best, np.maximum(units[best], 0.0)
    return best, np.maximum(units[best], 0.0) * grid


def top_k_units(units: np.ndarray, k: int, exclude: np.ndarray | None = None) -> np.ndarray | None:
    """:func:`top_k` of integer-valued scores (float64; a grid's multiples counted in grids),
    from one unsigned 64-bit key per entry: ``(top - max(units, 0)) << b | index`` with ``top``
    the largest clipped score and ``b`` the bits of an index, so that ascending keys are
    descending scores, ties by index. The keys are distinct: the k smallest are found by a
    partition and sorted as integers (no stable sort of floats), and the excluded entries get
    a key above every other. None when a key would not fit in 63 bits (or a score is NaN):
    the caller ranks with :func:`top_k`."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = units.shape[0]
    bits = max(1, (n - 1).bit_length())
    clipped = np.maximum(units, 0.0)
    top = float(clipped.max()) if n else 0.0
    if not top < 2.0 ** (63 - bits):  # NaN fails this too
        return None
    keys = np.uint64(top) - clipped.astype(np.uint64)
    keys <<= np.uint64(bits)
    keys |= _index_words(n)
    candidates = n
    if exclude is not None and len(exclude):
        excluded = np.asarray(exclude, dtype=np.int64)
        keys[excluded] = np.uint64(2**64 - 1)  # an index out of range raises, as in top_k
        candidates -= len({i % n for i in excluded.tolist()})  # each excluded entry once
    k = min(k, candidates)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    best = np.sort(np.partition(keys, k - 1)[:k] if k < n else keys)
    best &= np.uint64((1 << bits) - 1)
    return best.astype(np.int64)


@functools.lru_cache(maxsize=8)
def _index_words(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 as uint64 (read-only: shared by every ranking of an n-node graph)."""
    words = np.arange(n, dtype=np.uint64)
    words.setflags(write=False)
    return words
