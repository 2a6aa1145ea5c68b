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
        from numba import njit, types
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

    hint: Any = extending.intrinsic(prefetch_row)

    def probe(z: Any) -> None:  # pragma: no cover - compiled
        hint(z, 0)

    try:
        njit(probe)(np.zeros((1, 2)))
    except Exception:  # pragma: no cover - an LLVM without the intrinsic's name
        return None
    compiled: Callable[..., None] = hint
    return compiled


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
    _KERNEL(indptr[:2] * 0, indices[:0], z, out, 0, 1)
    steps = _compile_step_once()
    if steps is not None:
        clip_rows, walk_rows = steps
        one = np.zeros(1, dtype=np.float64)
        clip_rows(z, one, one, one, z.copy(), 0, 0)
        no = np.zeros(1, dtype=np.bool_)
        slots = np.full(2, -1, dtype=np.int64)
        walk_rows(indptr, indices, z, z.copy(), one, one, no, one, no, slots, one, one,
                  np.zeros((0, 1), dtype=np.int64), slots, one, slots, out, 0, 0)  # fmt: skip
    noise = noise_kernel()
    if noise is not None:
        noise(np.zeros(2), np.zeros(1, np.int64), 1.0, np.zeros(1))
    if _GATHER is not None:
        _GATHER(out, np.zeros(1, np.int64), np.zeros((1, 1)), 0, 0)


StepKernels = tuple[Callable[..., None], Callable[..., None]]


def _compile_step() -> StepKernels | None:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover
        return None
    prefetch = _prefetch_row() or _no_prefetch()
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
        (exact: a power of two) and rounded to an integer, plus the integer noise
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
                        prefetch(z, indices[jj + ahead])
                        prefetch(z, indices[jj + ahead + 1])
                        prefetch(z, indices[jj + ahead + 2])
                        prefetch(z, indices[jj + ahead + 3])
                    ra = z[indices[jj]]
                    rb = z[indices[jj + 1]]
                    rc = z[indices[jj + 2]]
                    rd = z[indices[jj + 3]]
                    for k in range(width):
                        acc[k] = (((acc[k] + ra[k]) + rb[k]) + rc[k]) + rd[k]
                    jj += 4
                while jj < end:
                    if jj + ahead < last:
                        prefetch(z, indices[jj + ahead])
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
                        g = grids[k]
                        units = np.int64(np.rint(v / g)) + noise[q, i]
                        limit = limits[k]
                        if units > limit:
                            units = limit
                        elif units < -limit:
                            units = -limit
                        out[i, k] = np.float64(units) * g

    clip = njit(nogil=True, cache=True, fastmath=False)(clip_rows)
    walk = njit(nogil=True, cache=True, fastmath=False)(walk_rows)
    return clip, walk


_STEP: StepKernels | None = _compile_step()


def step_kernels() -> StepKernels | None:
    """(clip_rows, walk_rows) compiled, or None without numba."""
    return _STEP


def _compile_step_once() -> StepKernels | None:
    return _STEP


def _compile_noise() -> Callable[..., None] | None:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover
        return None

    def pair_sums(exps: Any, words: Any, scale: float, out: Any) -> None:  # pragma: no cover
        """out[i] = xi1_i + xi2_i of one column from its 2n exponentials and sign words.

        Draw t is ``exps[t] * (-scale if sign bit t else scale)``, xi1 the first n (t = i),
        xi2 the next n (t = n + i), exactly as :func:`service.mechanisms.randomness.step_noise`
        computes them from the same exponentials and raw words: sign bit t is bit
        ``7 - t % 8`` of byte ``t // 8`` of the words read as little-endian bytes (numpy's
        ``unpackbits``, big bit order)."""
        n = out.shape[0]
        s = scale
        for i in range(n):
            t = i
            bit = (words[t >> 6] >> ((t & 56) | (7 - (t & 7)))) & 1
            a = exps[t] * (s * (1.0 - 2.0 * bit))  # +-s exactly, without a branch
            t = n + i
            bit = (words[t >> 6] >> ((t & 56) | (7 - (t & 7)))) & 1
            b = exps[t] * (s * (1.0 - 2.0 * bit))
            out[i] = a + b

    compiled: Callable[..., None] = njit(nogil=True, cache=True, fastmath=False)(pair_sums)
    return compiled


_NOISE: Callable[..., None] | None = _compile_noise()


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


def noise_kernel() -> Callable[..., None] | None:
    """``pair_sums(exps, words, scale, out)`` compiled (one column's xi1 + xi2), or None."""
    return _NOISE


#: PCG64DXSM's 64-bit "cheap" LCG multiplier (numpy's ``PCG_CHEAP_MULTIPLIER_128``).
PCG_CHEAP_MULTIPLIER = 0xDA942042E4DD58B5

#: ``draw_exponentials(state, exps, words)``: see :func:`_compile_draws`.
DrawKernel = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _compile_draws() -> DrawKernel | None:
    """numpy's float64 ``standard_exponential`` (ziggurat) and ``random_raw`` on an inlined
    PCG64DXSM, compiled: the same values from the same generator state, without numpy's
    indirect call per 64-bit word. None if numba, its copy of numpy's ziggurat tables or
    LLVM's 128-bit integers are not available (numpy's own functions are used then)."""
    try:
        ir: Any = importlib.import_module("llvmlite.ir")
        extending: Any = importlib.import_module("numba.extending")
        tables: Any = importlib.import_module("numba.np.random._constants")
        from numba import njit, types
    except ImportError:  # pragma: no cover
        return None
    ke = np.asarray(tables.ke_double, dtype=np.uint64)
    we = np.asarray(tables.we_double, dtype=np.float64)
    fe = np.asarray(tables.fe_double, dtype=np.float64)
    tail_start = float(tables.ziggurat_exp_r)
    if ke.shape != (256,) or we.shape != (256,) or fe.shape != (256,):  # pragma: no cover
        return None
    u64 = types.uint64

    def pcg_next(typingctx: Any, hi: Any, lo: Any, inc_hi: Any, inc_lo: Any) -> Any:
        # pragma: no cover - compiled
        """(state', output) of one PCG64DXSM step: the DXSM output of the 128-bit state
        (hi, lo), then state' = state * multiplier + inc (mod 2^128), as numpy's
        ``pcg_cm_random_r``."""
        triple: Any = types.UniTuple
        sig = triple(u64, 3)(u64, u64, u64, u64)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            i64, i128 = ir.IntType(64), ir.IntType(128)
            h, lo, ih, il = args
            mult = ir.Constant(i64, PCG_CHEAP_MULTIPLIER - (1 << 64))
            out = builder.xor(h, builder.lshr(h, ir.Constant(i64, 32)))
            out = builder.mul(out, mult)
            out = builder.xor(out, builder.lshr(out, ir.Constant(i64, 48)))
            out = builder.mul(out, builder.or_(lo, ir.Constant(i64, 1)))

            def wide(high: Any, low: Any) -> Any:
                shifted = builder.shl(builder.zext(high, i128), ir.Constant(i128, 64))
                return builder.or_(shifted, builder.zext(low, i128))

            state = builder.mul(wide(h, lo), builder.zext(mult, i128))
            state = builder.add(state, wide(ih, il))
            new_lo = builder.trunc(state, i64)
            new_hi = builder.trunc(builder.lshr(state, ir.Constant(i128, 64)), i64)
            return context.make_tuple(builder, signature.return_type, [new_hi, new_lo, out])

        return sig, codegen

    step: Any = extending.intrinsic(pcg_next)

    def rejected(hi: Any, lo: Any, ih: Any, il: Any, idx: Any, x: float) -> Any:
        # pragma: no cover - compiled
        """numpy's ``standard_exponential_unlikely`` and its fresh tries, until a value is
        kept: (value, hi, lo). The tail beyond the last layer is r - log1p(-U), U a 53-bit
        uniform (numpy's ``next_double``)."""
        while True:
            hi, lo, r = step(hi, lo, ih, il)
            u = (r >> 11) * (1.0 / 9007199254740992.0)
            if idx == 0:
                return tail_start - np.log1p(-u), hi, lo
            if (fe[idx - 1] - fe[idx]) * u + fe[idx] < np.exp(-x):
                return x, hi, lo
            hi, lo, r = step(hi, lo, ih, il)
            ri = r >> 3
            idx = ri & 0xFF
            ri >>= 8
            x = ri * we[idx]
            if ri < ke[idx]:
                return x, hi, lo

    slow = njit(nogil=True, cache=True, fastmath=False)(rejected)

    def draw_exponentials(state: Any, exps: Any, words: Any) -> None:  # pragma: no cover
        """exps = numpy's standard_exponential(len(exps)), then words = random_raw(len(words))
        from the PCG64DXSM state ``state`` = [state_hi, state_lo, inc_hi, inc_lo], which is
        advanced in place as numpy's would be."""
        hi = state[0]
        lo = state[1]
        ih = state[2]
        il = state[3]
        for i in range(exps.shape[0]):
            hi, lo, r = step(hi, lo, ih, il)
            ri = r >> 3
            idx = ri & 0xFF
            ri >>= 8
            x = ri * we[idx]
            if ri >= ke[idx]:  # 1.1% of draws
                x, hi, lo = slow(hi, lo, ih, il, idx, x)
            exps[i] = x
        for j in range(words.shape[0]):
            hi, lo, r = step(hi, lo, ih, il)
            words[j] = r
        state[0] = hi
        state[1] = lo

    compiled: DrawKernel = njit(nogil=True, cache=True, fastmath=False)(draw_exponentials)
    return compiled


_DRAWS: DrawKernel | None = _compile_draws()


def draw_kernel() -> DrawKernel | None:
    """The compiled PCG64DXSM exponential and raw-word sampler (compiled on first call), or
    None; :func:`service.mechanisms.randomness.draw_step_randomness` checks it against numpy
    before using it."""
    return _DRAWS
