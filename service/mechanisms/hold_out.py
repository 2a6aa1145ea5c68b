"""``blended``'s hold-out check over its grid of weights in one compiled pass.

Under each weight w of the grid the check reads the top r of the pool (the seed's friends,
then the candidates drawn so far) by the blend ``a_w c~ + b_w z_d`` and asks whether it is
settled: whether its r-th largest score is strictly above ``U(a_w, b_w)``, the bound no undrawn
node can pass (:class:`service.mechanisms.lazy_blend.LazyCandidates`), or nothing is left to
draw. :func:`settled_tops` does, for the weights from ``start`` on, exactly what
:func:`service.mechanisms.lazy_blend.blended_draw` does with numpy per weight:

- the blend element by element as :func:`service.mechanisms.blended.mix` (one product of each
  term, then their sum, each rounded in float64; numba's fastmath is off, so no product is
  fused with the sum),
- the top r as :func:`service.mechanisms.blended.ranked_first` ranks it (score descending,
  ties by node id ascending), in one pass that keeps the r best so far in order; its last
  is the r-th largest score,
- the bound as ``LazyCandidates.bound`` computes it,

and stops at the first weight that is not settled, so the caller draws more for that weight
(the draw's order of moves, and so its answer from a given generator, are unchanged). The
numbers are the same, so the chosen weight is; only the per-weight overhead of some fifteen
numpy calls on a pool of a few thousand nodes is gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = ["settled_tops", "warm_up"]


def _settled_tops(
    a_s: Any,
    b_s: Any,
    values: Any,
    z: Any,
    ids: Any,
    r: int,
    start: int,
    undrawn: int,
    threshold_value: float,
    has_threshold: bool,
    z_head: float,
    tops: Any,
) -> int:  # pragma: no cover - compiled
    size = values.shape[0]
    scores = np.empty(size)
    chosen = np.empty(r, dtype=np.int64)
    for w in range(start, a_s.shape[0]):
        a = a_s[w]
        b = b_s[w]
        for i in range(size):
            scores[i] = a * values[i] + b * z[i]
        count = 0  # the r best so far by (score descending, id ascending), ranked
        for i in range(size):
            s = scores[i]
            if count == r:
                p = chosen[r - 1]
                if not (s > scores[p] or (s == scores[p] and ids[i] < ids[p])):
                    continue
                j = r - 1
            else:
                j = count
                count += 1
            while j > 0:
                p = chosen[j - 1]
                if scores[p] > s or (scores[p] == s and ids[p] < ids[i]):
                    break
                chosen[j] = p
                j -= 1
            chosen[j] = i
        kth = scores[chosen[r - 1]]  # the r-th largest score
        if undrawn > 0:
            if not has_threshold:
                bound = math.inf if a > 0.0 else a * 0.0 + b * z_head
            else:
                bound = a * threshold_value + b * z_head
            if not kth > bound:
                return w
        for j in range(r):
            tops[w, j] = chosen[j]
    return int(a_s.shape[0])


_COMPILED: Callable[..., int] = njit(nogil=True, cache=True, fastmath=False)(_settled_tops)


def settled_tops(
    a_s: np.ndarray,
    b_s: np.ndarray,
    values: np.ndarray,
    z: np.ndarray,
    ids: np.ndarray,
    r: int,
    start: int,
    bound_state: tuple[int, float | None, float],
    tops: np.ndarray,
) -> int:
    """For the weights ``start, start + 1, ...`` (coefficients ``a_s``, ``b_s``), the positions
    of the pool's top ``r`` (``values``: c~, ``z``: z_d, ``ids``: node ids; 1 <= r <= the pool's
    size), written to ``tops[w]``, until the first weight whose top is not settled; returns
    that weight (``len(a_s)``: all settled).

    ``bound_state`` is ``(undrawn, threshold_value, z_head)``: the number of nodes not drawn
    yet, ``g (T - 1)`` (None: T is +inf) and the standardized degree at H, from which
    ``U(a, b)`` is computed as ``LazyCandidates.bound`` computes it."""
    size = values.shape[0]
    if not 1 <= r <= size:
        raise ValueError(f"the top's size must be in [1, {size}], got {r}")
    undrawn, threshold_value, z_head = bound_state
    return _COMPILED(
        np.ascontiguousarray(a_s, dtype=np.float64),
        np.ascontiguousarray(b_s, dtype=np.float64),
        np.ascontiguousarray(values, dtype=np.float64),
        np.ascontiguousarray(z, dtype=np.float64),
        np.ascontiguousarray(ids, dtype=np.int64),
        int(r),
        int(start),
        int(undrawn),
        0.0 if threshold_value is None else float(threshold_value),
        threshold_value is not None,
        float(z_head),
        tops,
    )


def warm_up() -> int:
    """Compile (or load from numba's cache) the pass's one variant: the service's supervisor
    does it before it forks its workers, so no worker's first ``blended`` answer waits for it.
    Returns the pass's answer on a pool of one node (1: its one weight settled)."""
    tops = np.empty((1, 1), dtype=np.int64)
    one, zero = np.ones(1), np.zeros(1)
    ids = np.zeros(1, dtype=np.int64)
    return settled_tops(one, one, zero, zero, ids, 1, 0, (0, None, 0.0), tops)
