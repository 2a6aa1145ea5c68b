"""Compiled forms of the count rankings' small array steps: the same numbers as the numpy they
replace, without the fixed cost of a dozen numpy calls on a few thousand values each.

- :func:`ranked_positions`: the positions of the r best scores, ties by index, as
  ``np.lexsort`` over the scores at least the r-th largest ranks them
  (:func:`service.mechanisms.blended.ranked_first`).
- :func:`kth_largest`: the r-th largest score, the value ``np.partition`` reads
  (:func:`service.mechanisms.lazy_blend`'s ``_kth``).
- :func:`first_distinct`: the first ``count`` distinct values of a stream, in stream order, as
  ``np.unique(..., return_index=True)`` finds them
  (:func:`service.mechanisms.lazy_top_k.distinct_uniform`).
- :func:`geometric_levels`: the levels of a range from rounded Laplace draws, element by
  element as :func:`service.mechanisms.lazy_top_k.range_levels` maps them.

None of them draws: the randomness stays with the callers, which consume the generator as
before, so an answer from a given generator is the same bit for bit. numba's fastmath is off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = ["first_distinct", "geometric_levels", "kth_largest", "ranked_positions", "warm_up"]

#: Runs of equal scores up to this long are put in order by insertion (no allocation).
SHORT_RUN = 16


def _kth_largest(scores: Any, r: int) -> Any:  # pragma: no cover - compiled
    """The r-th largest (1 <= r <= len): a quickselect on a copy (Hoare's partition around
    the middle element; equal values are split evenly, and an ordered run costs no more)."""
    a = scores.copy()
    k = a.shape[0] - r  # its position in ascending order
    lo, hi = 0, a.shape[0] - 1
    while lo < hi:
        pivot = a[(lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break  # a[j + 1 .. i - 1] all equal the pivot
    return a[k]


def _ranked_positions(scores: Any, indices: Any, r: int) -> Any:  # pragma: no cover - compiled
    size = scores.shape[0]
    # the scores at least the r-th largest: the r best with every tie of the r-th
    part = np.flatnonzero(scores >= _KTH(scores, r)) if r < size else np.arange(size)
    # lexsort((indices, -scores)) over part ranks by score descending, then index, then
    # position: sort by score alone, then each run of equal scores by (index, position)
    ranked = part[np.argsort(-scores[part])]
    start = 0
    while start < r:  # only the runs that reach the first r
        stop = start + 1
        while stop < ranked.shape[0] and scores[ranked[stop]] == scores[ranked[start]]:
            stop += 1
        if stop - start > SHORT_RUN:
            run = np.sort(ranked[start:stop])  # by position, then stably by index
            ranked[start:stop] = run[np.argsort(indices[run], kind="mergesort")]
        else:  # insertion sort by (index, position)
            for i in range(start + 1, stop):
                p = ranked[i]
                j = i
                while j > start and (
                    indices[ranked[j - 1]] > indices[p]
                    or (indices[ranked[j - 1]] == indices[p] and ranked[j - 1] > p)
                ):
                    ranked[j] = ranked[j - 1]
                    j -= 1
                ranked[j] = p
        start = stop
    return ranked[:r].astype(np.int64)


def _first_distinct(stream: Any, count: int) -> Any:  # pragma: no cover - compiled
    size = stream.shape[0]
    slots = 16
    while slots < 2 * size:
        slots *= 2
    table = np.full(slots, -1, dtype=np.int64)  # open addressing; values are >= 0
    out = np.empty(min(count, size), dtype=np.int64)
    found = 0
    mask = np.uint64(slots - 1)
    for i in range(size):
        if found == out.shape[0]:
            break
        v = stream[i]
        h = (np.uint64(v) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
        j = h & mask
        while table[j] != -1 and table[j] != v:
            j = (j + np.uint64(1)) & mask
        if table[j] == -1:
            table[j] = v
            out[found] = v
            found += 1
    return out[:found]


def _geometric_levels(
    z: Any, a: int, b: int, above: bool, bounded: bool
) -> Any:  # pragma: no cover - compiled
    n = 0
    for i in range(z.shape[0]):
        if z[i] != 0:
            n += 1
    out = np.empty(n, dtype=np.int64)
    j = 0
    for i in range(z.shape[0]):
        if z[i] == 0:
            continue
        g = abs(z[i]) - 1  # geometric, ratio exp(-gamma)
        if bounded:
            g = g % (b - a)
        out[j] = a + g if above else (b - 1) - g
        j += 1
    return out


_JIT = njit(nogil=True, cache=True, fastmath=False)
_KTH: Callable[..., float] = _JIT(_kth_largest)
_RANKED: Callable[..., np.ndarray] = _JIT(_ranked_positions)
_DISTINCT: Callable[..., np.ndarray] = _JIT(_first_distinct)
_LEVELS: Callable[..., np.ndarray] = _JIT(_geometric_levels)


def ranked_positions(scores: np.ndarray, indices: np.ndarray, r: int) -> np.ndarray:
    """Positions (into ``scores``, float64) of the ``min(r, len)`` best by score descending,
    ties by ``indices`` (int64) ascending, then by position: ``np.lexsort((indices[p],
    -scores[p]))`` over the ascending positions ``p`` of the scores at least the r-th largest."""
    size = scores.shape[0]
    r = min(int(r), size)
    if r <= 0:
        return np.zeros(0, dtype=np.int64)
    return _RANKED(
        np.ascontiguousarray(scores, dtype=np.float64),
        np.ascontiguousarray(indices, dtype=np.int64),
        r,
    )


def kth_largest(scores: np.ndarray, r: int) -> float:
    """The r-th largest of ``scores`` (float64), 1 <= r <= its length: the value
    ``np.partition(scores, len - r)[len - r]`` reads."""
    size = scores.shape[0]
    if not 1 <= r <= size:
        raise ValueError(f"r must be in [1, {size}], got {r}")
    return float(_KTH(np.ascontiguousarray(scores, dtype=np.float64), int(r)))


def first_distinct(stream: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` distinct values of ``stream`` (non-negative int64) in stream order;
    fewer if it holds fewer."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    return _DISTINCT(np.ascontiguousarray(stream, dtype=np.int64), int(count))


def geometric_levels(z: np.ndarray, a: int | None, b: int | None) -> np.ndarray:
    """For each nonzero level ``z`` (int64) in order, with ``g = |z| - 1``: ``a + g`` (``a +
    g % (b - a)`` when ``b`` is finite) for a range above 0 (``a >= 1``), else ``(b - 1) - g``
    (``(b - 1) - g % (b - a)`` when ``a`` is finite) for a range below it (``b <= 0``)."""
    above = a is not None and a >= 1
    if not above and (b is None or b > 0):
        raise ValueError(f"the range [{a}, {b}) lies neither above 0 nor below it")
    return _LEVELS(
        np.ascontiguousarray(z, dtype=np.int64),
        0 if a is None else int(a),
        0 if b is None else int(b),
        above,
        a is not None and b is not None,
    )


def warm_up() -> int:
    """Compile (or load from numba's cache) each kernel's one variant: the service's supervisor
    does it before it forks its workers. Returns how many values the three calls gave."""
    scores, ids = np.array([1.0, 0.5]), np.array([1, 0], dtype=np.int64)
    ranked = ranked_positions(scores, ids, 1)
    kth_largest(scores, 1)
    distinct = first_distinct(np.array([3, 3, 1], dtype=np.int64), 2)
    levels = geometric_levels(np.array([0, -2, 3], dtype=np.int64), 1, None)
    return int(ranked.shape[0] + distinct.shape[0] + levels.shape[0])
