"""An exact sampler of the rounded Laplace law, from uniform random integers only.

For a rational ``gamma = s / t`` (positive Python ints) :func:`rounded_laplace` draws
``N = round(L / gamma)`` with ``L ~ Lap(1)`` (density ``exp(-|x|) / 2``). So ``g * N`` has exactly
the law of ``round_g(b L)``, ``b L ~ Lap(b)`` rounded to the nearest multiple of ``g``, when
``gamma = g / b``: a count release ``c + g N`` (``c`` a multiple of ``g``) has exactly the law of
``round_g(c + Lap(b))``, post-processing of the exact Laplace mechanism (docs/privacy.md,
"The Laplace sampler and its stated delta").

The law (ties ``|L| = (j + 1/2) gamma`` have measure zero):

- ``P(N = 0) = P(|L| < gamma / 2) = 1 - e^{-gamma/2}``;
- otherwise (probability ``e^{-gamma/2}``) ``|N| = 1 + Y`` with ``P(Y = j) = (1 - e^{-gamma})
  e^{-j gamma}``: given ``|L| >= gamma / 2``, ``|L| - gamma / 2 ~ Exp(1)`` (memorylessness) and
  ``Y = floor((|L| - gamma / 2) / gamma)`` is geometric with ratio ``e^{-gamma}``; the sign of
  ``L`` is uniform and independent of ``|L|``.

The algorithm (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential
Privacy", Algorithms 1 and 2):

1. ``Z ~ Bernoulli(exp(-s / (2t)))``; if ``Z = 0``, ``N = 0``.
2. Geometric part: repeat ``U`` uniform in ``{0, ..., t-1}`` until ``Bernoulli(exp(-U / t))``
   accepts it; ``V`` = the number of successes of ``Bernoulli(exp(-1))`` before the first
   failure; ``X = U + t V`` has ``P(X = x)`` proportional to ``e^{-x/t}``, and
   ``Y = floor(X / s)`` has ``P(Y = j)`` proportional to ``e^{-j s/t}``.
3. A uniform sign bit: ``N = +-(1 + Y)``.

``Bernoulli(exp(-r))`` for a rational ``r = a / b`` in [0, 1] is CKS Algorithm 1: ``K`` = the
first ``k >= 1`` with ``Bernoulli(r / k) = 0``, and the result is ``K`` odd; for ``r > 1``,
``floor(r)`` draws of ``Bernoulli(exp(-1))`` (stopping at the first failure) and one of
``Bernoulli(exp(-(r - floor(r))))``. ``Bernoulli(a / m)`` is ``uniform(m) < a``, with
``uniform(m)`` exactly uniform on ``{0, ..., m-1}`` by Lemire's multiply-and-reject method on
raw 64-bit words. So the only randomness is the generator's raw 64-bit words, and every
decision is an exact integer comparison: no floating-point value enters the law.

No floating-point fast path is used. The obvious one (accept when ``u / 2^64 < p - e``, reject
when ``u / 2^64 >= p + e`` for a float ``p ~ exp(-r)`` with error at most ``e``, and otherwise run
the exact loop on fresh words) is NOT exact: it accepts with probability
``(p - e) + 2 e p = p - e (1 - 2p)``. An exact one has to finish the comparison of the SAME
uniform ``u`` with ``exp(-r)`` to more bits than a float carries in the undecided cell.

Overflow guards. ``uniform(b k)`` in CKS Algorithm 1 needs ``b k < 2^64``; when it would not
fit (``k >= 2^11`` for ``b < 2^53``, probability below ``1 / 2048!``) ``Bernoulli(a / (b k))`` is
drawn as the product of the independent ``Bernoulli(a / b)`` and ``Bernoulli(1 / k)``, which is
exact. ``X = U + t V`` must fit in an int64: ``V`` above ``(2^63 - t) / t >= 2^11 - 1`` (probability
below ``e^{-2047}`` per draw) makes :func:`rounded_laplace` raise :class:`OverflowError` rather
than return a value off the law. Values of ``|N|`` at or above ``2^53`` (probability
``e^{-gamma 2^53}``, below ``e^{-8}`` only when gamma is within a factor 1000 of the smallest
allowed ``2^-50``) are exact int64s but not exact float64s.

Buffering. The kernel consumes a buffer of raw words. When the buffer runs out in the middle
of a draw, the kernel rewinds to the first word of that draw and returns; the wrapper appends
fresh words to the unused tail and the kernel draws again from there, reading the same words
again: every draw is a deterministic function of one stream of raw words, whatever the
buffer size, so the law is that of an infinite stream (restarting a draw with fresh words
instead would favour draws that consume few words).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
from numba import njit

from service.errors import InvalidParameter

__all__ = [
    "MAX_DENOMINATOR",
    "MAX_NUMERATOR",
    "MIN_GAMMA",
    "SCALE_BITS",
    "bernoulli_exp",
    "bernoulli_ratio",
    "bernoulli_scaled",
    "dyadic_scale",
    "gamma_ratio",
    "grid_laplace",
    "rounded_laplace",
    "uniform_below",
]

#: Smallest gamma = s / t accepted (grid / scale).
MIN_GAMMA = Fraction(1, 2**50)
#: t must be below this (so that 2t and the Bernoulli denominators fit the kernel's integers).
MAX_DENOMINATOR = 2**52
#: s must be below this.
MAX_NUMERATOR = 2**62
#: Significant bits of the mantissa of a dyadic noise scale (:func:`dyadic_scale`).
SCALE_BITS = 20

_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1

# kernel status codes (state[2])
_OK = 0
_EXHAUSTED = 1
_OVERFLOW = 2

#: Largest range drawn from 32 bits rather than a whole word.
_HALF_WORD_LIMIT = 1 << 24
#: Raw words per draw the wrapper asks for (a draw uses about 11 on average).
_WORDS_PER_DRAW = 12
#: Most raw words the wrapper holds at once (8 MiB).
_MAX_CHUNK = 1 << 20


# --- the kernel -------------------------------------------------------------------------
# Compiled without numba's reference counting (``_nrt=False``): the kernel allocates nothing,
# and the atomic reference-count updates of the array arguments at every helper call made it
# twenty times slower.
_Function = TypeVar("_Function", bound=Callable[..., Any])
_NJIT: Any = njit


def _jit(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False)(function)
    return compiled


def _jit_inline(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False, inline="always")(function)
    return compiled


# state: int64[3] = (next word, bits left in the sign reservoir, status); bits: uint64[1]
# (the sign reservoir). Every helper checks the status after each word it reads and returns
# at once when the buffer ran out (the caller rewinds the whole draw).


@_jit_inline
def _next_word(words: np.ndarray, state: np.ndarray) -> Any:  # pragma: no cover
    pos = state[0]
    if pos >= words.shape[0]:
        state[2] = _EXHAUSTED
        return np.uint64(0)
    state[0] = pos + 1
    return words[pos]


@_jit_inline
def _mul_high_low(a: np.uint64, b: np.uint64) -> tuple[np.uint64, np.uint64]:  # pragma: no cover
    """The 128-bit product a * b as (high, low) 64-bit halves."""
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


@_jit_inline
def _uniform_below(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, m: np.uint64
) -> Any:  # pragma: no cover
    """Exactly uniform on {0, ..., m-1} (m >= 1): Lemire's multiply-and-reject method, on 32
    bits of the reservoir when m <= 2^24 (rejecting at most 2^-8 of them), on a whole word
    otherwise (both exact for any m the path takes; the split only saves words)."""
    if m <= np.uint64(_HALF_WORD_LIMIT):
        mask = np.uint64(0xFFFFFFFF)
        while True:
            x = _take_bits(words, state, bits, 32)
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
        high, low = _mul_high_low(word, m)
        if low < m:
            threshold = (np.uint64(0) - m) % m
            if low < threshold:
                continue
        return high


@_jit_inline
def _bernoulli_ratio(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, m: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(a / m), 0 <= a <= m, m >= 1 (no randomness used when a is 0 or m)."""
    if a == np.uint64(0):
        return False
    if a >= m:
        return True
    return _uniform_below(words, state, bits, m) < a


@_jit_inline
def _bernoulli_scaled(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, b: np.uint64, k: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(a / (b k)), 0 <= a <= b, b, k >= 1: one uniform on {0..bk-1} when b k fits
    in 64 bits, otherwise the product of Bernoulli(a / b) and Bernoulli(1 / k) (exact too)."""
    if (b >> np.uint64(32)) == np.uint64(0) and (k >> np.uint64(32)) == np.uint64(0):
        return _bernoulli_ratio(words, state, bits, a, b * k)  # b k < 2^64
    high, product = _mul_high_low(b, k)
    if high == np.uint64(0):
        return _bernoulli_ratio(words, state, bits, a, product)
    if not _bernoulli_ratio(words, state, bits, a, b) or state[2] != _OK:
        return False
    return _bernoulli_ratio(words, state, bits, np.uint64(1), k)


@_jit
def _bernoulli_exp_unit(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, b: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(exp(-a / b)) for 0 <= a <= b (CKS Algorithm 1)."""
    one = np.uint64(1)
    k = one
    while True:
        success = _bernoulli_scaled(words, state, bits, a, b, k)
        if state[2] != _OK:
            return False
        if not success:
            return (k & one) == one
        k += one


@_jit
def _bernoulli_exp(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, a: np.uint64, b: np.uint64
) -> Any:  # pragma: no cover
    """Bernoulli(exp(-a / b)) for a >= 0, b >= 1: floor(a / b) factors exp(-1), then the
    fractional part."""
    one = np.uint64(1)
    whole = a // b
    i = np.uint64(0)
    while i < whole:
        if not _bernoulli_exp_unit(words, state, bits, one, one):
            return False
        if state[2] != _OK:
            return False
        i += one
    return _bernoulli_exp_unit(words, state, bits, a - whole * b, b)


@_jit_inline
def _take_bits(
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


@_jit
def _one_draw(
    words: np.ndarray,
    state: np.ndarray,
    bits: np.ndarray,
    s: np.uint64,
    t: np.uint64,
    max_v: np.int64,
) -> np.int64:  # pragma: no cover
    """One N = round(L / (s / t)); the caller checks ``state[2]``."""
    if not _bernoulli_exp(words, state, bits, s, t + t):
        return np.int64(0)
    if state[2] != _OK:
        return np.int64(0)
    while True:  # U uniform on {0..t-1}, accepted with probability exp(-U / t)
        u = _uniform_below(words, state, bits, t)
        if state[2] != _OK:
            return np.int64(0)
        accepted = _bernoulli_exp_unit(words, state, bits, u, t)
        if state[2] != _OK:
            return np.int64(0)
        if accepted:
            break
    v = np.int64(0)
    one = np.uint64(1)
    while True:  # V: successes of Bernoulli(exp(-1)) before the first failure
        success = _bernoulli_exp_unit(words, state, bits, one, one)
        if state[2] != _OK:
            return np.int64(0)
        if not success:
            break
        v += 1
        if v > max_v:
            state[2] = _OVERFLOW
            return np.int64(0)
    x = np.int64(u) + np.int64(t) * v
    y = x // np.int64(s)
    negative = _take_bits(words, state, bits, 1) == np.uint64(1)
    if state[2] != _OK:
        return np.int64(0)
    return -(y + 1) if negative else y + 1


@_jit
def _rounded_laplace_kernel(
    words: np.ndarray,
    state: np.ndarray,
    bits: np.ndarray,
    s: np.uint64,
    t: np.uint64,
    max_v: np.int64,
    out: np.ndarray,
    start: np.int64,
) -> np.int64:  # pragma: no cover
    """Fill ``out[start:]``; returns the index of the first draw not made (``out.shape[0]``
    when done). On running out of words the state is rewound to that draw's first word."""
    i = start
    n = out.shape[0]
    while i < n:
        pos, left, reservoir = state[0], state[1], bits[0]
        value = _one_draw(words, state, bits, s, t, max_v)
        if state[2] == _EXHAUSTED:
            state[0], state[1], bits[0] = pos, left, reservoir
            return i
        if state[2] != _OK:
            return i
        out[i] = value
        i += 1
    return i


# --- validation and the Python API ----------------------------------------------------


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) <= 0:
        raise InvalidParameter(name, f"must be a positive integer, got {value!r}")
    return int(value)


def _checked_ratio(s: object, t: object) -> tuple[int, int]:
    s, t = _positive_int("s", s), _positive_int("t", t)
    if t >= MAX_DENOMINATOR:
        raise InvalidParameter("t", f"must be below 2^52, got {t}")
    if s >= MAX_NUMERATOR:
        raise InvalidParameter("s", f"must be below 2^62, got {s}")
    if Fraction(s, t) < MIN_GAMMA:
        raise InvalidParameter("gamma", f"s / t must be at least 2^-50, got {s}/{t}")
    return s, t


class _Stream:
    """A generator's raw words, in chunks, and the kernel's state over them."""

    def __init__(self, rng: np.random.Generator, chunk: int) -> None:
        self.rng = rng
        self.chunk = chunk
        self.words = rng.bit_generator.random_raw(chunk)
        self.state = np.zeros(3, dtype=np.int64)
        self.bits = np.zeros(1, dtype=np.uint64)

    def refill(self) -> None:
        """Keep the unread tail (the unfinished draw's words) and append fresh words."""
        tail = self.words[int(self.state[0]) :]
        self.words = np.concatenate([tail, self.rng.bit_generator.random_raw(self.chunk)])
        self.state[0] = 0
        self.state[2] = _OK


def _chunk_for(count: int) -> int:
    return max(64, min(_MAX_CHUNK, count * _WORDS_PER_DRAW + 64))


def _fill(
    rng: np.random.Generator, s: int, t: int, out: np.ndarray, chunk: int,
    max_v: int | None = None,
) -> None:  # fmt: skip
    """Fill ``out`` with draws from chunks of ``chunk`` raw words; ``max_v`` (tests only)
    lowers the overflow guard on V below its int64 bound."""
    if out.shape[0] == 0:
        return
    stream = _Stream(rng, chunk)
    bound = (_I64_MAX - t) // t
    max_v = bound if max_v is None else min(max_v, bound)
    done = 0
    while True:
        done = int(
            _rounded_laplace_kernel(
                stream.words, stream.state, stream.bits, np.uint64(s), np.uint64(t),
                np.int64(max_v), out, np.int64(done),
            )
        )  # fmt: skip
        if stream.state[2] == _OVERFLOW:
            raise OverflowError(
                "an exact Laplace draw left the int64 range (probability below e^-2047)"
            )
        if done == out.shape[0]:
            return
        stream.refill()


def rounded_laplace(rng: np.random.Generator, s: int, t: int, count: int) -> np.ndarray:
    """``count`` independent draws of N = round(L / gamma), L ~ Lap(1), gamma = ``s / t``
    (positive ints, t < 2^52, s < 2^62, gamma >= 2^-50), as int64, exactly (module docstring).

    The only randomness is ``rng.bit_generator.random_raw``; a seeded generator reproduces the
    draws. In the service ``rng`` is a fresh OS-entropy generator
    (:func:`service.mechanisms.randomness.fresh_generator`)."""
    s, t = _checked_ratio(s, t)
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
        raise InvalidParameter("count", f"must be a non-negative integer, got {count!r}")
    out = np.empty(int(count), dtype=np.int64)
    _fill(rng, s, t, out, _chunk_for(int(count)))
    return out


def dyadic_scale(scale: float, bits: int = SCALE_BITS) -> float:
    """The smallest float >= ``scale`` whose mantissa has at most ``bits`` significant bits.

    Its relative excess over ``scale`` is below 2^(1 - bits); halving or doubling it stays
    dyadic with the same bits (so ``dyadic_scale(b / 2) == dyadic_scale(b) / 2``)."""
    if not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise InvalidParameter("scale", f"must be a finite number > 0, got {scale!r}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 53:
        raise InvalidParameter("bits", f"must be an integer in [1, 53], got {bits!r}")
    mantissa, exponent = math.frexp(float(scale))  # scale = mantissa 2^exponent, [0.5, 1)
    top = math.ceil(math.ldexp(mantissa, bits))  # exact: a power-of-two scaling of a float
    rounded = math.ldexp(float(top), exponent - bits)
    if rounded < scale or not math.isfinite(rounded):  # pragma: no cover - subnormal/overflow
        raise InvalidParameter("scale", f"{scale!r} has no dyadic rounding with {bits} bits")
    return rounded


def gamma_ratio(grid: float, scale: float) -> tuple[int, int]:
    """(s, t), reduced, with s / t == ``grid / scale`` exactly (floats are dyadic rationals),
    checked as :func:`rounded_laplace` requires it."""
    for name, value in (("grid", grid), ("scale", scale)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise InvalidParameter(name, f"must be a finite number > 0, got {value!r}")
    ratio = Fraction(float(grid)) / Fraction(float(scale))
    return _checked_ratio(ratio.numerator, ratio.denominator)


def grid_laplace(
    rng: np.random.Generator, scales: float | Sequence[float] | np.ndarray, grid: float,
    count: int | None = None,
) -> np.ndarray:  # fmt: skip
    """Noise on the grid ``g`` (a power of two): coordinate i is ``g N_i``, N_i exact from
    :func:`rounded_laplace` with gamma = g / dyadic_scale(scales[i]), so that it has exactly
    the law of ``round_g(Lap(b'_i))`` with ``b'_i = dyadic_scale(scales[i]) >= scales[i]``.

    ``scales`` is one scale for ``count`` coordinates, or one per coordinate; a scale of 0
    means no noise (0). Coordinates sharing a scale are drawn together, the distinct scales
    in increasing order; float64 results (exact: |N| < 2^53 but with the probability the
    module docstring gives)."""
    _power_of_two_grid(grid)
    if np.ndim(scales) == 0:
        if count is None:
            raise InvalidParameter("count", "is required with a single scale")
        scale = float(scales)  # type: ignore[arg-type]
        if not math.isfinite(scale) or scale < 0:
            raise InvalidParameter("scales", "must be finite and >= 0")
        if scale == 0.0:
            return np.zeros(int(count), dtype=np.float64)
        s, t = gamma_ratio(grid, dyadic_scale(scale))
        drawn: np.ndarray = rounded_laplace(rng, s, t, int(count)).astype(np.float64)
        drawn *= grid
        return drawn
    per = np.asarray(scales, dtype=np.float64)
    if not np.all(np.isfinite(per)) or np.any(per < 0):
        raise InvalidParameter("scales", "must be finite and >= 0")
    out = np.zeros(per.shape[0], dtype=np.float64)
    for scale in np.unique(per):
        if scale == 0.0:
            continue
        where = np.flatnonzero(per == scale)
        s, t = gamma_ratio(grid, dyadic_scale(float(scale)))
        out[where] = rounded_laplace(rng, s, t, where.shape[0]).astype(np.float64) * grid
    return out


def _power_of_two_grid(grid: float) -> None:
    if (
        not isinstance(grid, int | float)
        or not math.isfinite(grid)
        or grid <= 0
        or math.frexp(grid)[0] != 0.5
    ):
        raise InvalidParameter("grid", f"must be a positive power of two, got {grid!r}")


# --- the helpers, exposed for tests ------------------------------------------------------


def _run(rng: np.random.Generator, draw: object) -> int:
    """Run one compiled helper on a fresh stream until it has words enough."""
    stream = _Stream(rng, 256)
    while True:
        value = draw(stream.words, stream.state, stream.bits)  # type: ignore[operator]
        if stream.state[2] == _OK:
            return int(value)
        stream.state[:] = 0
        stream.bits[0] = 0
        stream.refill()  # pragma: no cover - 256 words are plenty for one helper call


def uniform_below(rng: np.random.Generator, m: int) -> int:
    """One exactly uniform integer in {0, ..., m-1} (1 <= m < 2^64)."""
    if not 1 <= m <= _U64_MAX:
        raise InvalidParameter("m", f"must be in [1, 2^64), got {m}")
    return _run(rng, lambda w, st, bi: _uniform_below(w, st, bi, np.uint64(m)))


def bernoulli_ratio(rng: np.random.Generator, a: int, m: int) -> bool:
    """One Bernoulli(a / m) draw, 0 <= a <= m < 2^64."""
    if not 0 <= a <= m or not 1 <= m <= _U64_MAX:
        raise InvalidParameter("a", f"need 0 <= a <= m < 2^64, got {a}/{m}")
    return bool(
        _run(rng, lambda w, st, bi: _bernoulli_ratio(w, st, bi, np.uint64(a), np.uint64(m)))
    )


def bernoulli_scaled(rng: np.random.Generator, a: int, b: int, k: int) -> bool:
    """One Bernoulli(a / (b k)) draw as CKS Algorithm 1 makes it (0 <= a <= b < 2^64,
    1 <= k < 2^64), including the product form used when b k does not fit in 64 bits."""
    if not 0 <= a <= b <= _U64_MAX or not 1 <= k <= _U64_MAX:
        raise InvalidParameter("a", f"need 0 <= a <= b < 2^64 and 1 <= k < 2^64, got {a}, {b}, {k}")
    return bool(
        _run(
            rng,
            lambda w, st, bi: _bernoulli_scaled(
                w, st, bi, np.uint64(a), np.uint64(b), np.uint64(k)
            ),
        )
    )


def bernoulli_exp(rng: np.random.Generator, a: int, b: int) -> bool:
    """One Bernoulli(exp(-a / b)) draw, 0 <= a < 2^64, 1 <= b < 2^53."""
    if not 0 <= a <= _U64_MAX or not 1 <= b < 2**53:
        raise InvalidParameter("a", f"need 0 <= a < 2^64 and 1 <= b < 2^53, got {a}/{b}")
    return bool(_run(rng, lambda w, st, bi: _bernoulli_exp(w, st, bi, np.uint64(a), np.uint64(b))))
