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
        for i in range(lo, hi):
            for k in range(width):
                out[i, k] = 0.0
            for jj in range(indptr[i], indptr[i + 1]):
                j = indices[jj]
                for k in range(width):
                    out[i, k] += z[j, k]

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
