"""The block sparse product A Z for a 0/1 adjacency in CSR form, compiled with numba.

For a dense block Z (n x B, C order) row i of A Z is the sum of the rows Z[j] over the
neighbours j of i, taken in CSR order, each column summed sequentially in float64 (no
reassociation: numba's fastmath is off), so the rounding analysis of docs/privacy.md holds
as for scipy's kernel. Being 0/1, A needs no multiplications. The function releases the GIL;
the operator runs one call per row block on its threads. Without numba, scipy's product is
used (about half as fast for blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

RowsKernel = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int], None]


def _compile() -> RowsKernel | None:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency; kept for odd platforms
        return None

    def sum_neighbour_rows(
        indptr: Any, indices: Any, z: Any, out: Any, lo: int, hi: int
    ) -> None:  # pragma: no cover - compiled
        width = out.shape[1]
        acc = np.zeros(width)
        for i in range(lo, hi):
            if width == 1:  # a scalar accumulator: several times faster than a buffer
                total = 0.0
                for jj in range(indptr[i], indptr[i + 1]):
                    total += z[indices[jj], 0]
                out[i, 0] = total
                continue
            for k in range(width):
                acc[k] = 0.0
            for jj in range(indptr[i], indptr[i + 1]):
                row = z[indices[jj]]
                for k in range(width):
                    acc[k] += row[k]
            for k in range(width):
                out[i, k] = acc[k]

    compiled: RowsKernel = njit(nogil=True, cache=True, fastmath=False)(sum_neighbour_rows)
    return compiled


_KERNEL: RowsKernel | None = _compile()


def block_kernel() -> RowsKernel | None:
    """The compiled row kernel, or None without numba."""
    return _KERNEL


def warm_up(indptr: np.ndarray, indices: np.ndarray) -> None:
    """Compile (or load from numba's cache) for these index dtypes before traffic arrives."""
    if _KERNEL is None:
        return
    z = np.zeros((1, 2), dtype=np.float64)
    out = np.zeros((1, 2), dtype=np.float64)
    _KERNEL(indptr[:2] * 0, indices[:0], z, out, 0, 1)
    steps = _compile_step_once()
    if steps is not None:
        clip_rows, walk_rows = steps
        one = np.zeros(1, dtype=np.float64)
        clip_rows(z, one, one, one, z.copy(), z.copy(), 0, 0)
        walk_rows(indptr, indices, z, z.copy(), np.zeros(1, dtype=np.bool_), one, out, 0, 0)


StepKernels = tuple[Callable[..., None], Callable[..., None]]


def _compile_step() -> StepKernels | None:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover
        return None

    def clip_rows(
        x: Any, degrees: Any, inv_degree: Any, etas: Any, clipped: Any, z: Any, lo: int, hi: int
    ) -> None:  # pragma: no cover - compiled
        """clipped = min(max(x, 0), eta_k d_i); z = clipped / d (as clipped * (1/d))."""
        width = x.shape[1]
        for i in range(lo, hi):
            for k in range(width):
                v = x[i, k]
                if v < 0.0:
                    v = 0.0
                t = etas[k] * degrees[i]
                if v > t:
                    v = t
                clipped[i, k] = v
                z[i, k] = v * inv_degree[i]

    def walk_rows(
        indptr: Any,
        indices: Any,
        z: Any,
        clipped: Any,
        isolated: Any,
        betas: Any,
        out: Any,
        lo: int,
        hi: int,
    ) -> None:  # pragma: no cover - compiled
        """out = beta (A z + c (+ c if isolated)) / 2, in the order of WalkOperator.apply."""
        width = out.shape[1]
        acc = np.zeros(width)
        for i in range(lo, hi):
            if width == 1:  # a scalar accumulator: several times faster than a buffer
                total = 0.0
                for jj in range(indptr[i], indptr[i + 1]):
                    total += z[indices[jj], 0]
                acc[0] = total
            else:
                for k in range(width):
                    acc[k] = 0.0
                for jj in range(indptr[i], indptr[i + 1]):
                    row = z[indices[jj]]
                    for k in range(width):
                        acc[k] += row[k]
            for k in range(width):
                v = acc[k]
                if isolated[i]:
                    v += clipped[i, k]
                v += clipped[i, k]
                v *= 0.5
                v *= betas[k]
                out[i, k] = v

    clip = njit(nogil=True, cache=True, fastmath=False)(clip_rows)
    walk = njit(nogil=True, cache=True, fastmath=False)(walk_rows)
    return clip, walk


_STEP: StepKernels | None = _compile_step()


def step_kernels() -> StepKernels | None:
    """(clip_rows, walk_rows) compiled, or None without numba."""
    return _STEP


def _compile_step_once() -> StepKernels | None:
    return _STEP
