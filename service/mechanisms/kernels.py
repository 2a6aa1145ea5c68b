"""The block sparse product A Z for a 0/1 adjacency in CSR form, compiled with numba.

For a dense block Z (n x B, C order) row i of A Z is the sum of the rows Z[j] over the
neighbours j of i, taken in CSR order, each column summed sequentially in float64 (no
reassociation: numba's fastmath is off), so the rounding analysis of docs/privacy.md holds
as for scipy's kernel. Being 0/1, A needs no multiplications. The function releases the GIL;
the operator runs one call per row block on its threads. Without numba, scipy's product is
used (about half as fast for blocks).

The block walk kernel takes four neighbours per pass over a row's columns, as
``acc = (((acc + z_a) + z_b) + z_c) + z_d``: the same additions in the same order as one
neighbour at a time (bit-identical sums), with a quarter of the accumulator's loads and
stores. It also prefetches the row of the neighbour ``PREFETCH_DISTANCE`` entries ahead
(a hint to the cache, which changes no value): the gathers of Z rows are what a block step
waits for on large graphs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from service.privacy.state_grid import INPUT_CLAMP

RowsKernel = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int], None]

#: How many stored entries ahead of the one being summed the walk kernel prefetches Z's row.
PREFETCH_DISTANCE = 16


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


def _prefetch_row() -> Callable[..., None] | None:
    """A compiled ``prefetch_row(z, r)``: a cache hint for the start of row r of a 2-D array
    (LLVM's ``llvm.prefetch``, read, high locality). None if this numba/LLVM cannot build it;
    the kernels then run without hints (same values, slower on large graphs)."""
    try:
        llvm: Any = importlib.import_module("llvmlite.binding")
        ir: Any = importlib.import_module("llvmlite.ir")
        cgutils: Any = importlib.import_module("numba.core.cgutils")
        extending: Any = importlib.import_module("numba.extending")
        from numba import types
    except ImportError:  # pragma: no cover
        return None
    name = "llvm.prefetch.p0" if llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"

    def prefetch_row(typingctx: Any, arr: Any, row: Any) -> Any:  # pragma: no cover - compiled
        sig = types.void(arr, row)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            aryty, rowty = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            r = context.cast(builder, args[1], rowty, types.intp)
            zero = context.get_constant(types.intp, 0)
            ptr = cgutils.get_item_pointer2(
                context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                inds=[r, zero], wraparound=False,
            )  # fmt: skip
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    hint: Callable[..., None] = extending.intrinsic(prefetch_row)
    return hint


def _probe_prefetch(z: Any) -> None:  # pragma: no cover - compiled
    """Calls the prefetch hint once: compiled (with numba's on-disk cache, so a process whose
    cache holds it does not compile it again) to check that this LLVM builds the hint."""
    _PREFETCH(z, 0)  # type: ignore[misc]  # set by _compile_step before it compiles this


def _no_prefetch() -> Callable[..., None]:  # pragma: no cover - see _prefetch_row
    from numba import njit

    def prefetch_row(z: Any, r: Any) -> None:
        pass

    compiled: Callable[..., None] = njit(inline="always")(prefetch_row)
    return compiled


def warm_up(indptr: np.ndarray, indices: np.ndarray) -> None:
    """Compile (or load from numba's cache) for these index dtypes before traffic arrives."""
    if _KERNEL is None:
        return
    z = np.zeros((1, 2), dtype=np.float64)
    out = np.zeros((1, 2), dtype=np.float64)
    # numba compiles one variant per dtype and read-only flag: the tiny arrays carry the
    # graph's (a graph's arrays are read-only), so this compiles the variant queries use
    tiny_indptr, tiny_indices = indptr[:2] * 0, indices[:0].copy()
    tiny_indptr.setflags(write=indptr.flags.writeable)
    tiny_indices.setflags(write=indices.flags.writeable)
    _KERNEL(tiny_indptr, tiny_indices, z, out, 0, 1)
    steps = _compile_step_once()
    if steps is not None:
        clip_rows, walk_rows = steps
        one = np.zeros(1, dtype=np.float64)
        clip_rows(z, one, one, one, z.copy(), 0, 0)
        no = np.zeros(1, dtype=np.bool_)
        slots = np.full(2, -1, dtype=np.int64)
        walk_rows(indptr, indices, z, z.copy(), one, one, no, one, no, slots, one, one,
                  np.zeros((0, 1), dtype=np.int64), slots, one, slots, out, 0, 0)  # fmt: skip
    if _GATHER is not None:
        _GATHER(out, np.zeros(1, np.int64), np.zeros((1, 1)), 0, 0)


StepKernels = tuple[Callable[..., None], Callable[..., None]]

#: The walk kernel's prefetch hint, read by the kernel as a global. Not a closure cell: numba
#: keys a closure's on-disk cache entry on its pickled cells, and the hint (an intrinsic)
#: pickles differently in every process, so every process missed the cache, compiled the
#: kernel again and added one more entry to the cache index.
_PREFETCH: Callable[..., None] | None = None


def _compile_step() -> StepKernels | None:
    global _PREFETCH
    try:
        from numba import njit
    except ImportError:  # pragma: no cover
        return None
    _PREFETCH = _prefetch_row()
    if _PREFETCH is not None:
        try:
            njit(cache=True)(_probe_prefetch)(np.zeros((1, 2)))
        except Exception:  # pragma: no cover - an LLVM without the intrinsic's name
            _PREFETCH = None
    _PREFETCH = _PREFETCH or _no_prefetch()
    ahead = PREFETCH_DISTANCE
    input_clamp = INPUT_CLAMP

    def clip_rows(
        x: Any, degrees: Any, inv_degree: Any, etas: Any, z: Any, lo: int, hi: int
    ) -> None:  # pragma: no cover - compiled
        """z = min(max(x, 0), eta_k d_i) / d (as clipped * (1/d))."""
        width = x.shape[1]
        for i in range(lo, hi):
            for k in range(width):
                v = x[i, k]
                if v < 0.0:
                    v = 0.0
                t = etas[k] * degrees[i]
                if v > t:
                    v = t
                z[i, k] = v * inv_degree[i]

    def walk_rows(
        indptr: Any,
        indices: Any,
        z: Any,
        x: Any,
        degrees: Any,
        etas: Any,
        isolated: Any,
        betas: Any,
        seed_rows: Any,
        seeds: Any,
        seed_clipped: Any,
        lifts: Any,
        noise: Any,
        slots: Any,
        grids: Any,
        limits: Any,
        out: Any,
        lo: int,
        hi: int,
    ) -> None:  # pragma: no cover - compiled
        """out = beta (A z + c (+ c if isolated)) / 2, in the order of WalkOperator.apply,
        then + lifts[k] (= 1 - beta_k) at column k's seed; then, on the columns with a noise
        slot (slots[k] >= 0), the grid step of service.privacy.state_grid in the same pass:
        with g = grids[k], the value clamped to [-INPUT_CLAMP, INPUT_CLAMP], divided by g
        (exact: a power of two, so multiplied by 1 / g, which is exact too) and rounded to an
        integer, plus the integer noise
        noise[slots[k], i], clamped to [-limits[k], limits[k]], times g.

        c = min(max(x, 0), eta_k d_i) is the row's own clipped value, recomputed here as the
        clip pass computes it (no clipped block is stored); at a seed whose threshold is 1
        (personalized) it is ``seed_clipped[k]``, which the caller computed. Each column of a
        row is summed over the row's neighbours in CSR order, one addition at a time; four
        neighbours share one pass over the accumulator. ``seed_rows[i]`` says whether row i
        is some column's seed (only those rows look at ``seeds``; ``seed_clipped[k]`` is NaN
        for a column whose seed has the ordinary threshold)."""
        width = out.shape[1]
        noisy = noise.shape[0] > 0
        acc = np.zeros(width)
        # 1 / g, exact: g is a power of two, so v * (1 / g) is v / g, without a division
        inverse_grids = np.zeros(width)
        for k in range(width):
            if noisy and slots[k] >= 0:
                inverse_grids[k] = 1.0 / grids[k]
        last = indptr[hi]
        for i in range(lo, hi):
            start = indptr[i]
            end = indptr[i + 1]
            if width == 1:  # a scalar accumulator: several times faster than a buffer
                total = 0.0
                for jj in range(start, end):
                    total += z[indices[jj], 0]
                acc[0] = total
            else:
                for k in range(width):
                    acc[k] = 0.0
                jj = start
                while jj + 3 < end:
                    if jj + ahead + 3 < last:
                        _PREFETCH(z, indices[jj + ahead])
                        _PREFETCH(z, indices[jj + ahead + 1])
                        _PREFETCH(z, indices[jj + ahead + 2])
                        _PREFETCH(z, indices[jj + ahead + 3])
                    ra = z[indices[jj]]
                    rb = z[indices[jj + 1]]
                    rc = z[indices[jj + 2]]
                    rd = z[indices[jj + 3]]
                    for k in range(width):
                        acc[k] = (((acc[k] + ra[k]) + rb[k]) + rc[k]) + rd[k]
                    jj += 4
                while jj < end:
                    if jj + ahead < last:
                        _PREFETCH(z, indices[jj + ahead])
                    ra = z[indices[jj]]
                    for k in range(width):
                        acc[k] += ra[k]
                    jj += 1
            d = degrees[i]
            twice = isolated[i]
            for k in range(width):
                c = x[i, k]
                if c < 0.0:
                    c = 0.0
                t = etas[k] * d
                if c > t:
                    c = t
                v = acc[k]
                if twice:
                    v += c
                v += c
                v *= 0.5
                v *= betas[k]
                out[i, k] = v
            if seed_rows[i]:
                for k in range(width):
                    if seeds[k] == i:
                        c = seed_clipped[k]
                        if c == c:  # the seed's own threshold (personalized): not NaN
                            v = acc[k]
                            if twice:
                                v += c
                            v += c
                            v *= 0.5
                            v *= betas[k]
                            out[i, k] = v
                        out[i, k] += lifts[k]
            if noisy:
                for k in range(width):
                    q = slots[k]
                    if q >= 0:
                        v = out[i, k]
                        if v > input_clamp:
                            v = input_clamp
                        elif v < -input_clamp:
                            v = -input_clamp
                        units = np.int64(np.rint(v * inverse_grids[k])) + noise[q, i]
                        limit = limits[k]
                        if units > limit:
                            units = limit
                        elif units < -limit:
                            units = -limit
                        out[i, k] = np.float64(units) * grids[k]

    clip = njit(nogil=True, cache=True, fastmath=False)(clip_rows)
    walk = njit(nogil=True, cache=True, fastmath=False)(walk_rows)
    return clip, walk


_STEP: StepKernels | None = _compile_step()


def step_kernels() -> StepKernels | None:
    """(clip_rows, walk_rows) compiled, or None without numba."""
    return _STEP


def _compile_step_once() -> StepKernels | None:
    return _STEP


def _compile_walk_column() -> Callable[..., None] | None:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover
        return None
    input_clamp = INPUT_CLAMP

    def walk_column(
        indptr: Any,
        indices: Any,
        z: Any,
        x: Any,
        degrees: Any,
        eta: float,
        isolated: Any,
        beta: float,
        seed: int,
        seed_clipped: float,
        lift: float,
        noise: Any,
        grid: float,
        limit: int,
        out: Any,
        inv_degree: Any,
        z_next: Any,
        lo: int,
        hi: int,
    ) -> None:  # pragma: no cover - compiled
        """walk_rows for a block of one column, on 1-D arrays with the column's parameters as
        scalars: the same operations in the same order, so the same values bit for bit (a
        lone query releases what its column of a block releases), without the block's
        per-column loops and buffers (15% of a width-1 pass on a 10k-node graph). ``noise``
        is the column's integer noise (n,) on a noisy step, empty on a noise-free one.

        Unless ``z_next`` is empty, it also writes the next step's clip pass of each row,
        ``z_next[i] = min(max(out[i], 0), t_i) / d_i`` (as clip_rows: times 1 / d_i), with the
        seed's threshold 1 when ``seed_clipped`` is not NaN (personalized), so that the next
        step needs no clip pass of its own. (A zero's sign there may differ from clip_rows',
        which changes no sum: the sums start at +0.0.)"""
        noisy = noise.shape[0] > 0
        clip_next = z_next.shape[0] > 0
        inverse_grid = 1.0 / grid if noisy else 0.0
        personalized = seed_clipped == seed_clipped  # not NaN: the seed's own threshold
        for i in range(lo, hi):
            total = 0.0
            for jj in range(indptr[i], indptr[i + 1]):
                total += z[indices[jj]]
            if i == seed and personalized:
                c = seed_clipped
            else:
                c = x[i]
                if c < 0.0:
                    c = 0.0
                t = eta * degrees[i]
                if c > t:
                    c = t
            v = total
            if isolated[i]:
                v += c
            v += c
            v *= 0.5
            v *= beta
            if i == seed:
                v += lift
            if noisy:
                if v > input_clamp:
                    v = input_clamp
                elif v < -input_clamp:
                    v = -input_clamp
                units = np.int64(np.rint(v * inverse_grid)) + noise[i]
                if units > limit:
                    units = limit
                elif units < -limit:
                    units = -limit
                v = np.float64(units) * grid
            out[i] = v
            if clip_next:
                if v < 0.0:
                    v = 0.0
                t = 1.0 if i == seed and personalized else eta * degrees[i]
                if v > t:
                    v = t
                z_next[i] = v * inv_degree[i]

    compiled: Callable[..., None] = njit(nogil=True, cache=True, fastmath=False)(walk_column)
    return compiled


_WALK_COLUMN: Callable[..., None] | None = _compile_walk_column()


def walk_column_kernel() -> Callable[..., None] | None:
    """``walk_column`` compiled (the walk pass of a one-column block), or None."""
    return _WALK_COLUMN


def _compile_gather() -> Callable[..., None] | None:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover
        return None

    def gather_columns(block: Any, columns: Any, dest: Any, lo: int, hi: int) -> None:
        # pragma: no cover - compiled
        """dest[q, i] = block[i, columns[q]] for rows lo..hi: one pass over the block's rows
        instead of one strided pass per column."""
        width = columns.shape[0]
        for i in range(lo, hi):
            for q in range(width):
                dest[q, i] = block[i, columns[q]]

    compiled: Callable[..., None] = njit(nogil=True, cache=True, fastmath=False)(gather_columns)
    return compiled


_GATHER: Callable[..., None] | None = _compile_gather()


def gather_kernel() -> Callable[..., None] | None:
    """``gather_columns(block, columns, dest, lo, hi)`` compiled, or None."""
    return _GATHER


def cached_kernels() -> list[Any]:
    """The compiled kernels that numba caches on disk (none without numba)."""
    return [k for k in (_KERNEL, *(_STEP or ()), _WALK_COLUMN, _GATHER) if k is not None]
