"""Exact Bernoulli and uniform draws from raw 64-bit words (Canonne, Kamath & Steinke 2020).

``Bernoulli(exp(-r))`` for a rational ``r = a / b`` in [0, 1] is CKS Algorithm 1: ``K`` = the
first ``k >= 1`` with ``Bernoulli(r / k) = 0``, and the result is ``K`` odd; for ``r > 1``,
``floor(r)`` draws of ``Bernoulli(exp(-1))`` (stopping at the first failure) and one of
``Bernoulli(exp(-(r - floor(r))))``. ``Bernoulli(a / m)`` is ``uniform(m) < a``, with
``uniform(m)`` exactly uniform on ``{0, ..., m-1}`` by Lemire's multiply-and-reject method on
raw 64-bit words. Every decision is an exact integer comparison.

``uniform(b k)`` needs ``b k < 2^64``; when it would not fit, ``Bernoulli(a / (b k))`` is drawn
as the product of the independent ``Bernoulli(a / b)`` and ``Bernoulli(1 / k)``, which is exact.

These are the exact primitives of the rounded-Laplace sampler's first version; the sampler
(:mod:`service.mechanisms.exact_laplace`) now draws its exponential by inversion against exact
thresholds and von Neumann's comparisons of uniforms instead, and these remain exact building
blocks with their own tests. :func:`exp_neg_bounds` (integer bounds on ``exp(-x)`` for a
rational ``x``) gives the sampler's thresholds and the lazy top-k's probabilities their digits.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
from numba import njit
from numba.extending import intrinsic

from service.errors import InvalidParameter

__all__ = [
    "bernoulli_exp",
    "bernoulli_ratio",
    "bernoulli_scaled",
    "exp_neg_bounds",
    "uniform_below",
]

_U64_MAX = (1 << 64) - 1

# kernel status codes (state[2])
_OK = 0
_EXHAUSTED = 1

_Function = TypeVar("_Function", bound=Callable[..., Any])
_NJIT: Any = njit


def _jit(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False)(function)
    return compiled


def _jit_inline(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False, inline="always")(function)
    return compiled


# state: int64[3] = (next word, bits left in the bit reservoir, status); bits: uint64[1]
# (the reservoir). Every helper checks the status after each word it reads and returns at
# once when the buffer ran out.


@_jit_inline
def _next_word(words: np.ndarray, state: np.ndarray) -> Any:  # pragma: no cover
    pos = state[0]
    if pos >= words.shape[0]:
        state[2] = _EXHAUSTED
        return np.uint64(0)
    state[0] = pos + 1
    return words[pos]


def _mul_128(typingctx: Any, a: Any, b: Any) -> Any:  # pragma: no cover - compiled
    """The 128-bit product of two uint64 as (high, low): one widening multiply (LLVM's i128
    ``mul``, a single instruction on 64-bit machines, where four 32-bit products and their
    carries took about 7% of a pair-sum draw)."""
    ir: Any = importlib.import_module("llvmlite.ir")
    types: Any = importlib.import_module("numba.core.types")
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        low = builder.trunc(product, ir.IntType(64))
        high = builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
        return context.make_tuple(builder, signature.return_type, [high, low])

    return sig, codegen


_MUL_128: Any = intrinsic(_mul_128)


def _wide_product(a: np.uint64, b: np.uint64) -> tuple[np.uint64, np.uint64]:  # pragma: no cover
    """The 128-bit product a * b as (high, low) 64-bit halves, by one widening multiply."""
    high, low = _MUL_128(np.uint64(a), np.uint64(b))
    return high, low


def _split_product(a: np.uint64, b: np.uint64) -> tuple[np.uint64, np.uint64]:
    """The same from four 32-bit products and their carries: what runs where numba's compiler
    is off (``NUMBA_DISABLE_JIT``, as in the wheel's test), since an intrinsic runs only
    compiled."""
    mask = np.uint64(0xFFFFFFFF)
    shift = np.uint64(32)
    a_lo, a_hi = a & mask, a >> shift
    b_lo, b_hi = b & mask, b >> shift
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> shift) + (p1 & mask) + (p2 & mask)
    high = p3 + (p1 >> shift) + (p2 >> shift) + (mid >> shift)
    low = (mid << shift) | (p0 & mask)
    return high, low


#: The 128-bit product a * b as (high, low) 64-bit halves (compiled: one widening multiply).
_COMPILED: bool = not importlib.import_module("numba.core.config").DISABLE_JIT
mul_high_low = _jit_inline(_wide_product if _COMPILED else _split_product)


@_jit_inline
def take_bits(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, count: int
) -> Any:  # pragma: no cover
    """``count`` (1 or 32) uniform bits from the reservoir; with fewer left, the rest are
    dropped (independent of everything drawn) and a whole word refills it."""
    if state[1] < count:
        word = _next_word(words, state)
        if state[2] != _OK:
            return np.uint64(0)
        bits[0] = word
        state[1] = 64
    mask = (np.uint64(1) << np.uint64(count)) - np.uint64(1)
    value = bits[0] & mask
    bits[0] = bits[0] >> np.uint64(count)
    state[1] -= count
    return value


@_jit_inline
def uniform_below_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, m: np.uint64
) -> Any:  # pragma: no cover
    """Exactly uniform on {0, ..., m-1} (m >= 1): Lemire's multiply-and-reject method, on 32
    bits of the reservoir when m <= 2^32, on a whole word otherwise."""
    if m <= np.uint64(1 << 32):
        mask = np.uint64(0xFFFFFFFF)
        while True:
            x = take_bits(words, state, bits, 32)
            if state[2] != _OK:
                return np.uint64(0)
            product = x * m  # < 2^64
            low = product & mask
            if low < m:
                threshold = (np.uint64(1 << 32) - m) % m
                if low < threshold:
                    continue
            return product >> np.uint64(32)
    while True:
        word = _next_word(words, state)
        if state[2] != _OK:
            return np.uint64(0)
        high, low = mul_high_low(word, m)
        if low < m:
            threshold = (np.uint64(0) - m) % m
            if low < threshold:
                continue
        return high


@_jit_inline
def bernoulli_ratio_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, m: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(a / m), 0 <= a <= m, m >= 1 (no randomness used when a is 0 or m)."""
    if a == np.uint64(0):
        return False
    if a >= m:
        return True
    return uniform_below_kernel(words, state, bits, m) < a


@_jit_inline
def bernoulli_scaled_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, b: np.uint64, k: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(a / (b k)), 0 <= a <= b, b, k >= 1: one uniform on {0..bk-1} when b k fits
    in 64 bits, otherwise the product of Bernoulli(a / b) and Bernoulli(1 / k) (exact too)."""
    if (b >> np.uint64(32)) == np.uint64(0) and (k >> np.uint64(32)) == np.uint64(0):
        return bernoulli_ratio_kernel(words, state, bits, a, b * k)  # b k < 2^64
    high, product = mul_high_low(b, k)
    if high == np.uint64(0):
        return bernoulli_ratio_kernel(words, state, bits, a, product)
    if not bernoulli_ratio_kernel(words, state, bits, a, b) or state[2] != _OK:
        return False
    return bernoulli_ratio_kernel(words, state, bits, np.uint64(1), k)


@_jit
def bernoulli_exp_unit_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, b: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(exp(-a / b)) for 0 <= a <= b (CKS Algorithm 1)."""
    one = np.uint64(1)
    k = one
    while True:
        success = bernoulli_scaled_kernel(words, state, bits, a, b, k)
        if state[2] != _OK:
            return False
        if not success:
            return (k & one) == one
        k += one


@_jit
def bernoulli_exp_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, b: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(exp(-a / b)) for a >= 0, b >= 1: floor(a / b) factors exp(-1), then the
    fractional part."""
    one = np.uint64(1)
    whole = a // b
    i = np.uint64(0)
    while i < whole:
        if not bernoulli_exp_unit_kernel(words, state, bits, one, one):
            return False
        if state[2] != _OK:
            return False
        i += one
    return bernoulli_exp_unit_kernel(words, state, bits, a - whole * b, b)


def _run(rng: np.random.Generator, draw: object) -> int:
    """Run one compiled helper on 256 raw words of ``rng`` (more if it runs out)."""
    words = rng.bit_generator.random_raw(256)
    while True:
        state = np.zeros(3, dtype=np.int64)
        bits = np.zeros(1, dtype=np.uint64)
        value = draw(words, state, bits)  # type: ignore[operator]
        if state[2] == _OK:
            return int(value)
        words = np.concatenate([words, rng.bit_generator.random_raw(256)])  # pragma: no cover


def uniform_below(rng: np.random.Generator, m: int) -> int:
    """One exactly uniform integer in {0, ..., m-1} (1 <= m < 2^64)."""
    if not 1 <= m <= _U64_MAX:
        raise InvalidParameter("m", f"must be in [1, 2^64), got {m}")
    return _run(rng, lambda w, st, bi: uniform_below_kernel(w, st, bi, np.uint64(m)))


def bernoulli_ratio(rng: np.random.Generator, a: int, m: int) -> bool:
    """One Bernoulli(a / m) draw, 0 <= a <= m < 2^64."""
    if not 0 <= a <= m or not 1 <= m <= _U64_MAX:
        raise InvalidParameter("a", f"need 0 <= a <= m < 2^64, got {a}/{m}")
    return bool(
        _run(rng, lambda w, st, bi: bernoulli_ratio_kernel(w, st, bi, np.uint64(a), np.uint64(m)))
    )


def bernoulli_scaled(rng: np.random.Generator, a: int, b: int, k: int) -> bool:
    """One Bernoulli(a / (b k)) draw as CKS Algorithm 1 makes it (0 <= a <= b < 2^64,
    1 <= k < 2^64), including the product form used when b k does not fit in 64 bits."""
    if not 0 <= a <= b <= _U64_MAX or not 1 <= k <= _U64_MAX:
        raise InvalidParameter("a", f"need 0 <= a <= b < 2^64 and 1 <= k < 2^64, got {a}, {b}, {k}")
    return bool(
        _run(
            rng,
            lambda w, st, bi: bernoulli_scaled_kernel(
                w, st, bi, np.uint64(a), np.uint64(b), np.uint64(k)
            ),
        )
    )


def bernoulli_exp(rng: np.random.Generator, a: int, b: int) -> bool:
    """One Bernoulli(exp(-a / b)) draw, 0 <= a < 2^64, 1 <= b < 2^53."""
    if not 0 <= a <= _U64_MAX or not 1 <= b < 2**53:
        raise InvalidParameter("a", f"need 0 <= a < 2^64 and 1 <= b < 2^53, got {a}/{b}")
    return bool(
        _run(rng, lambda w, st, bi: bernoulli_exp_kernel(w, st, bi, np.uint64(a), np.uint64(b)))
    )


# --- exp(-x) to any precision, by integer interval arithmetic --------------------------


def exp_neg_bounds(x: Fraction, precision: int) -> tuple[int, int]:
    """(lo, hi) with ``lo <= 2^precision exp(-x) <= hi``, for a rational ``x >= 0``."""
    return _exp_neg_bounds(x.numerator, x.denominator, precision)


@lru_cache(maxsize=8192)
def _exp_neg_bounds(num: int, den: int, precision: int) -> tuple[int, int]:
    if num < 0 or den <= 0:
        raise ValueError("x must be a non-negative rational")
    if num == 0:
        return 1 << precision, 1 << precision
    x = Fraction(num, den)
    # exp(-x) = exp(-y)^(2^r) with y = x / 2^r <= 1/2
    r = max(0, math.ceil(math.log2(float(x)) + 1.0)) if x > Fraction(1, 2) else 0
    while x / (1 << r) > Fraction(1, 2):  # float log2 only guesses r
        r += 1
    y = x / (1 << r)
    work = precision + r + 32  # squaring r times multiplies the relative error by about 2^r
    # alternating series with decreasing terms: the partial sum is within the next term
    total = Fraction(1)
    term = Fraction(1)
    i = 0
    bound = Fraction(1, 1 << (work + 2))
    while True:
        i += 1
        term = term * y / i
        if term < bound:
            break
        total += term if i % 2 == 0 else -term
    scale = 1 << work
    lo_f, hi_f = (total - term) * scale, (total + term) * scale
    lo = max(0, lo_f.numerator // lo_f.denominator)
    hi = -((-hi_f.numerator) // hi_f.denominator)
    for _ in range(r):
        lo = (lo * lo) >> work
        hi = -((-(hi * hi)) >> work)
    shift = work - precision
    lo >>= shift
    hi = -((-hi) >> shift)
    return lo, min(hi, 1 << precision)
