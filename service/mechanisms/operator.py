"""The lazy random-walk operator W = (I + A D^-1) / 2 of a graph, as a fast sparse kernel.

The product A Z is the only O(|E|) work of a diffusion step. Z is a float64 vector or a dense
float64 block (n x B, one column per query); the adjacency is split into row blocks, one per
thread (scipy's sparse kernels release the GIL) when the pass is large enough to gain from it
(:data:`SPLIT_WORK`), and every product accumulates in float64.

Why float64 (docs/privacy.md, "Floating point and the sensitivity bound"): the calibration
assumes a per-step distortion of at most rho = 2 beta eta. A float32 kernel measured 1.00004 rho
on an adversarial bipartite graph; float64 stays within rho there (tests/test_float_safety.py).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import scipy.sparse as sp

from service.graph.model import Graph
from service.mechanisms.exact_laplace import rounded_laplace
from service.mechanisms.floored_pushflowcap import warm_up_floored_kernel
from service.mechanisms.kernels import (
    block_kernel,
    gather_kernel,
    step_kernels,
    walk_column_kernel,
    warm_up,
)
from service.mechanisms.pushflowcap import warm_up_kernel
from service.mechanisms.randomness import fresh_generator

#: An empty noise block: a step without noisy columns.
_NO_NOISE = np.zeros((0, 1), dtype=np.int64)
#: No noise for a one-column block's walk pass (:func:`service.mechanisms.kernels.walk_column`).
_NO_COLUMN_NOISE = np.zeros(0, dtype=np.int64)
#: No next step's clip pass for it to write.
_NO_FLOATS = np.zeros(0, dtype=np.float64)


#: Below this many stored entries times columns, a pass over the rows runs on the calling thread:
#: handing half of the rows to the second thread costs more than it saves. One block step's
#: passes (``fused_step``), one thread against two, uncontended: 140 nodes / 1,400 entries
#: 17-34 us against 76-102 us at widths 1-64; 2,000 nodes / 40,000 entries, width 4: 166 against
#: 254 us, width 64: 449 against 432 us; ego-Facebook (176,468 entries), width 1: 255 against
#: 265 us, width 4: 566 against 453 us. With another Python thread busy, each hand-off also
#: waits for the GIL: ego-Facebook width 1, 10.6 ms against 40.7 ms. A pass over the rows' own
#: values (the clip pass, the column gather) counts rows times columns instead. A split pass runs
#: its last row block on the calling thread, so it wakes one pool thread, not two: on a graph the
#: size of ego-Facebook at width 16 (``benchmarks/engine_profile.py``), a sparse step's CPU went
#: from 1.76-1.81 to 1.38-1.56 ms warm and from 1.36-1.39 to 1.17-1.25 ms cold.
SPLIT_WORK = 400_000


def default_threads() -> int:
    return max(1, min(2, os.cpu_count() or 1))


#: Byte alignment of the dense blocks: one cache line, so that a row of 8 float64 columns is one
#: line (numpy's large allocations are only 16-byte aligned: a 256-byte row then spans 5 lines).
BLOCK_ALIGNMENT = 64


def aligned_block(rows: int, columns: int) -> np.ndarray:
    """An uninitialised C-ordered float64 (rows x columns) array starting on a cache line."""
    size = rows * columns
    slack = BLOCK_ALIGNMENT // 8
    buffer = np.empty(size + slack, dtype=np.float64)
    start = (-buffer.ctypes.data % BLOCK_ALIGNMENT) // 8
    return buffer[start : start + size].reshape(rows, columns)


class StepWorkspace:
    """Reusable n x B buffers of one block step (clipped / d, result), cache-line aligned, so
    that a block of steady width allocates (and page-faults) nothing per step. (The clipped
    block itself is not stored: the walk kernel recomputes a row's own clipped value.)

    A block of one column also keeps ``z_next``: its walk pass writes the next step's clipped
    / d there, and ``clipped_for`` records which result (the array object, never written
    again before the next step reads it) and which (seed, eta, personalized) it belongs to."""

    def __init__(self) -> None:
        self.z: np.ndarray
        self.out: np.ndarray
        self.z_next: np.ndarray
        self.clipped_for: tuple[np.ndarray, tuple[int, float, bool]] | None
        self.clear()

    def clear(self) -> None:
        """Drop the buffers."""
        self.z = self.out = self.z_next = np.empty((0, 0), dtype=np.float64)
        self.clipped_for = None

    def fits(self, x: np.ndarray) -> bool:
        """Make the buffers x's shape (reallocating if it changed); False if ``x`` is one."""
        if self.out.shape != x.shape:
            self.clear()  # the old buffers go before the new ones are allocated
            self.z, self.out = (aligned_block(*x.shape) for _ in "zo")
            if x.shape[1] == 1:
                self.z_next = aligned_block(*x.shape)
        return not any(np.may_share_memory(x, b) for b in (self.z, self.out, self.z_next))

    def holds_clipped(self, x: np.ndarray, key: tuple[int, float, bool]) -> bool:
        """Whether ``z`` holds the clipped / d of the one-column result ``x`` for ``key``."""
        return self.clipped_for is not None and (
            self.clipped_for[0] is x and self.clipped_for[1] == key
        )

    def clipped_next(self, out: np.ndarray, key: tuple[int, float, bool]) -> None:
        """The walk pass that wrote ``out`` wrote its clipped / d into ``z_next``: the next
        step's ``z``."""
        self.z, self.z_next = self.z_next, self.z
        self.clipped_for = (out, key)

    def swap(self, x: np.ndarray) -> None:
        """Take ``x`` (no longer needed, same shape) as the next step's result buffer."""
        if x.shape == self.out.shape and x.dtype == np.float64 and x.flags.c_contiguous:
            self.out = x
        else:
            self.out = aligned_block(*self.out.shape)


class WalkOperator:
    """Applies W = (I + P) / 2 with P = A D^-1; a node of degree 0 keeps its mass (W e_i = e_i)."""

    def __init__(self, graph: Graph, threads: int | None = None, *, compact: bool = True) -> None:
        self.n = graph.n
        # float64 degrees and 1/degree: the graph's own arrays (shared pages when it was
        # mapped from a snapshot), not a copy per process
        self.degrees = graph.float_degrees
        self.inv_degree = graph.inverse_degrees
        self.isolated = np.flatnonzero(graph.degrees == 0)
        self.threads = threads or default_threads()
        # row blocks with about the same number of stored entries each (power-law graphs)
        targets = np.linspace(0, int(graph.indptr[-1]), self.threads + 1)
        bounds = np.searchsorted(graph.indptr, targets, side="left").clip(0, self.n)
        bounds[0], bounds[-1] = 0, self.n
        self._rows = [(int(lo), int(hi)) for lo, hi in itertools.pairwise(bounds)]
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        self._entries = int(graph.indptr[-1])
        self._indptr = graph.indptr
        # 16-bit indices on graphs of at most COMPACT_INDEX_NODES (service/graph/model.py);
        # compact=False: the graph's own at any size (the kernels' variant for larger graphs,
        # which compile_kernels compiles on the demo graph)
        self._indices = graph.compact_indices if compact else graph.indices
        self._kernel = block_kernel()
        self._step = step_kernels()
        self._gather = gather_kernel()
        self._walk_column = walk_column_kernel()
        self._isolated_mask = np.ascontiguousarray(graph.degrees == 0)
        # With the compiled kernel the graph's own (read-only, possibly shared) index arrays
        # are all it reads: no per-process copy, no float data array. Without it, scipy needs
        # CSR row blocks with a data array of ones.
        self._blocks: list[tuple[int, int, sp.csr_matrix]] = []
        if self._kernel is not None:
            warm_up(graph.indptr, self._indices)
            self._warm_up_walk_column()
            warm_up_kernel(graph.indptr, graph.indices)  # PushFlowCap's
            warm_up_floored_kernel(graph.indptr, graph.indices)  # with the floor (DP-IE answers)
            rounded_laplace(fresh_generator(), 1, 1 << 20, 4)  # compiles the noise sampler once
        else:  # pragma: no cover - numba is a dependency
            for lo, hi in self._rows:
                indptr = graph.indptr[lo : hi + 1] - graph.indptr[lo]
                indices = graph.indices[graph.indptr[lo] : graph.indptr[hi]]
                data = np.ones(indices.shape[0], dtype=np.float64)
                block = sp.csr_matrix((data, indices, indptr), shape=(hi - lo, self.n))
                self._blocks.append((lo, hi, block))

    def _warm_up_walk_column(self) -> None:
        """Compiles (or loads from numba's cache) the one-column walk pass for this graph's
        arrays, with and without noise, over no rows."""
        if self._walk_column is None:  # pragma: no cover - numba is a dependency
            return
        column = np.zeros((self.n, 1))
        for noise in (_NO_COLUMN_NOISE, np.zeros((1, self.n), dtype=np.int64)[0]):
            for z_next in (_NO_FLOATS, column[:, 0]):
                self._walk_column(self._indptr, self._indices, column[:, 0], column[:, 0],
                                  self.degrees, 1.0, self._isolated_mask, 0.5, 0, np.nan, 0.5,
                                  noise, 1.0, 0, column[:, 0], self.inv_degree, z_next,
                                  0, 0)  # fmt: skip

    @property
    def row_blocks(self) -> list[tuple[int, int]]:
        return list(self._rows)

    @property
    def pool(self) -> ThreadPoolExecutor | None:
        return self._pool

    def splits(self, width: int, *, per_row: bool = False) -> bool:
        """Whether a pass over the rows of a block of ``width`` columns is split over the
        threads (:data:`SPLIT_WORK`); each row's values are the same either way. A pass that
        reads each stored entry counts entries times columns; one that reads only the rows'
        own values (``per_row``: the clip pass, the column gather) counts rows times columns."""
        work = self.n if per_row else self._entries
        return self._pool is not None and work * max(width, 1) >= SPLIT_WORK

    def adjacency_product(self, z: np.ndarray) -> np.ndarray:
        """A z for a float64 vector (n,) or C-ordered block (n, B), in float64."""
        z = np.ascontiguousarray(z, dtype=np.float64)
        out = np.empty(z.shape, dtype=np.float64)
        kernel = self._kernel
        if kernel is not None:
            rows = z.reshape(self.n, -1)
            self._on_rows(kernel, self._indptr, self._indices, rows, out.reshape(self.n, -1),
                          width=rows.shape[1])  # fmt: skip
            return out
        if self._pool is None:  # pragma: no cover - numba is a dependency
            for lo, hi, block in self._blocks:
                out[lo:hi] = block @ z
            return out
        futures = [
            (lo, hi, self._pool.submit(block.__matmul__, z)) for lo, hi, block in self._blocks
        ]
        for lo, hi, future in futures:
            out[lo:hi] = future.result()
        return out

    def fused_step(
        self,
        x: np.ndarray,
        *,
        seeds: np.ndarray,
        betas: np.ndarray,
        etas: np.ndarray,
        personalized: np.ndarray,
        workspace: StepWorkspace | None = None,
        noise: np.ndarray | None = None,
        slots: np.ndarray | None = None,
        grids: np.ndarray | None = None,
        limits: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """phi(f(x)) for a block in two compiled passes over the rows (both threads), with the
        same operations in the same order as the unfused path; None without numba.

        With ``noise`` (S x n int64, C order), ``slots`` (one per column, -1 for none),
        ``grids`` and ``limits`` (one per column), column k with ``slots[k] >= 0`` takes the
        grid step (:func:`service.mechanisms.grid_noise.grid_step`) with the integer noise
        ``noise[slots[k]]``, in the same pass, after its seed's ``1 - beta``. With ``workspace`` the
        intermediate blocks and the result are its buffers (the result is ``workspace.out``;
        ``x`` must not be one of them)."""
        kernels = self._step
        if kernels is None or x.ndim != 2:
            return None
        clip_rows, walk_rows = kernels
        x = np.ascontiguousarray(x, dtype=np.float64)
        if workspace is not None and workspace.fits(x):
            z, out = workspace.z, workspace.out
        else:
            z, out = np.empty_like(x), np.empty_like(x)
        width = x.shape[1]
        etas = np.ascontiguousarray(etas, dtype=np.float64)
        if width == 1 and self._walk_column is not None:  # a lone query: 1-D, scalars
            return self._one_column_step(
                clip_rows, self._walk_column, x, z, out, workspace, etas,
                seed=int(seeds[0]), beta=float(betas[0]),
                personalized=bool(personalized[0]), noise=noise, slots=slots, grids=grids,
                limits=limits,
            )  # fmt: skip
        betas = np.ascontiguousarray(betas, dtype=np.float64)
        seeds = np.ascontiguousarray(seeds, dtype=np.int64)
        self._on_rows(clip_rows, x, self.degrees, self.inv_degree, etas, z, width=width,
                      per_row=True)  # fmt: skip
        seed_clipped = np.full(width, np.nan)
        p = np.flatnonzero(personalized)
        if p.size:  # the seed's threshold is 1 in personalized mode
            c = np.minimum(np.maximum(x[seeds[p], p], 0.0), 1.0)
            seed_clipped[p] = c
            z[seeds[p], p] = c * self.inv_degree[seeds[p]]
        if noise is None or slots is None or grids is None or limits is None:
            noise, slots = _NO_NOISE, np.full(width, -1, dtype=np.int64)
            grids, limits = np.ones(width), np.zeros(width, dtype=np.int64)
        else:
            noise, slots, grids, limits = self._checked_noise(noise, slots, grids, limits, width)
        seed_rows = np.zeros(self.n, dtype=np.bool_)
        seed_rows[seeds] = True
        self._on_rows(walk_rows, self._indptr, self._indices, z, x, self.degrees, etas,
                      self._isolated_mask, betas, seed_rows, seeds, seed_clipped, 1.0 - betas,
                      noise, slots, grids, limits, out, width=width)  # fmt: skip
        return out

    def _checked_noise(
        self,
        noise: np.ndarray,
        slots: np.ndarray,
        grids: np.ndarray,
        limits: np.ndarray,
        width: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The noise arguments of :meth:`fused_step`, C-ordered, or ValueError."""
        if noise.dtype != np.int64:
            raise ValueError("the grid step's noise is integer (int64) grid units")
        noise = np.ascontiguousarray(noise)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        grids = np.ascontiguousarray(grids, dtype=np.float64)
        limits = np.ascontiguousarray(limits, dtype=np.int64)
        if (
            noise.shape[1] != self.n
            or slots.shape != (width,)
            or grids.shape != (width,)
            or limits.shape != (width,)
            or slots.max() >= len(noise)
        ):
            raise ValueError("noise must be S x n with one slot in [-1, S) per column")
        return noise, slots, grids, limits

    def _one_column_step(
        self,
        clip_rows: Callable[..., None],
        walk_column: Callable[..., None],
        x: np.ndarray,
        z: np.ndarray,
        out: np.ndarray,
        workspace: StepWorkspace | None,
        etas: np.ndarray,
        *,
        seed: int,
        beta: float,
        personalized: bool,
        noise: np.ndarray | None,
        slots: np.ndarray | None,
        grids: np.ndarray | None,
        limits: np.ndarray | None,
    ) -> np.ndarray:
        """fused_step for a block of one column: the one-column walk pass, which also writes
        the next step's clip pass when the result is the workspace's (``clipped_next``), so
        that a chain of steps through one workspace runs one pass a step."""
        key = (seed, float(etas[0]), personalized)
        clipped = workspace is not None and z is workspace.z and workspace.holds_clipped(x, key)
        if not clipped:
            self._on_rows(clip_rows, x, self.degrees, self.inv_degree, etas, z, width=1,
                          per_row=True)  # fmt: skip
        seed_clipped = np.nan
        if personalized:  # the seed's threshold is 1 in personalized mode
            c = np.minimum(np.maximum(x[seed, 0], 0.0), 1.0)
            seed_clipped = float(c)
            if not clipped:
                z[seed, 0] = c * self.inv_degree[seed]
        noise_row, grid, limit = _NO_COLUMN_NOISE, 1.0, 0
        if noise is not None and slots is not None and grids is not None and limits is not None:
            noise, slots, grids, limits = self._checked_noise(noise, slots, grids, limits, 1)
            if slots[0] >= 0:
                noise_row, grid, limit = noise[slots[0]], float(grids[0]), int(limits[0])
        chained = workspace is not None and out is workspace.out
        z_next = workspace.z_next[:, 0] if workspace is not None and chained else _NO_FLOATS
        self._on_rows(walk_column, self._indptr, self._indices, z[:, 0], x[:, 0],
                      self.degrees, key[1], self._isolated_mask, beta, seed, seed_clipped,
                      1.0 - beta, noise_row, grid, limit, out[:, 0], self.inv_degree, z_next,
                      width=1)  # fmt: skip
        if workspace is not None and chained:
            workspace.clipped_next(out, key)
        return out

    def columns(
        self, block: np.ndarray, columns: list[int], scratch: np.ndarray | None = None
    ) -> list[np.ndarray]:
        """Copies of the given columns of a C-ordered block (n x B), read in one pass over its
        rows (both threads) rather than one strided pass per column; through ``scratch``
        (C-ordered, at least len(columns) x n, overwritten) if given."""
        if not columns:
            return []
        if self._gather is None or block.ndim != 2 or not block.flags.c_contiguous:
            return [block[:, c].copy() for c in columns]  # pragma: no cover - without numba
        if scratch is None or scratch.shape[0] < len(columns) or scratch.shape[1] != self.n:
            scratch = np.empty((len(columns), self.n), dtype=np.float64)
        dest = scratch[: len(columns)]
        self._on_rows(self._gather, block, np.asarray(columns, dtype=np.int64), dest,
                      width=len(columns), per_row=True)  # fmt: skip
        return [row.copy() for row in dest]

    def _on_rows(
        self, kernel: Callable[..., None], *args: Any, width: int, per_row: bool = False
    ) -> None:
        """``kernel(*args, lo, hi)`` over all rows: on this thread, or split by row blocks
        when :meth:`splits` says so, the last block on this thread (the kernels release the
        GIL) and the others on the pool, so that a split pass wakes one thread fewer."""
        if self._pool is None or not self.splits(width, per_row=per_row):
            kernel(*args, 0, self.n)
            return
        *others, (lo, hi) = self._rows
        parts = [self._pool.submit(kernel, *args, a, b) for a, b in others]
        try:
            kernel(*args, lo, hi)
        finally:  # the other blocks write into the same buffers: wait for all of them first
            for part in parts:
                part.exception()  # waits; raises nothing (below, result() does)
        for part in parts:
            part.result()

    def apply(self, y: np.ndarray) -> np.ndarray:
        """W y for a float64 vector (n,) or block (n, B)."""
        z = y * (self.inv_degree if y.ndim == 1 else self.inv_degree[:, None])
        out = self.adjacency_product(z)
        if self.isolated.size:
            out[self.isolated] += y[self.isolated]
        out += y
        out *= 0.5
        return out


_operators: weakref.WeakKeyDictionary[Graph, WalkOperator] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def walk_operator(graph: Graph, *, threads: int | None = None) -> WalkOperator:
    """The shared operator of a graph, built on first use (with ``threads`` threads, default
    :func:`default_threads`; a process of a pool that runs one query per core passes 1)."""
    with _lock:
        op = _operators.get(graph)
        if op is None:
            op = WalkOperator(graph, threads)
            _operators[graph] = op
        return op
