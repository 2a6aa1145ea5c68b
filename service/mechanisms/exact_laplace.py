"""An exact sampler of the rounded Laplace law, from uniform random integers only.

For a rational ``gamma = s / t`` (positive Python ints) :func:`rounded_laplace` draws
``N = round(L / gamma)`` with ``L ~ Lap(1)`` (density ``exp(-|x|) / 2``). So ``g * N`` has exactly
the law of ``round_g(b L)``, ``b L ~ Lap(b)`` rounded to the nearest multiple of ``g``, when
``gamma = g / b``: a count release ``c + g N`` (``c`` a multiple of ``g``) has exactly the law of
``round_g(c + Lap(b))``, post-processing of the exact Laplace mechanism (docs/privacy.md,
"The Laplace sampler and its stated delta").

The algorithm draws ``|L| = E ~ Exp(1)`` itself, exactly, as an integer part ``k`` and a
fractional part ``x`` in [0, 1) whose binary digits are drawn only as far as a decision needs
them, then rounds: ``N = +-|N|`` with a uniform sign bit and

    |N| = floor(E t / s + 1/2) = floor((floor(2 t E) + s) / (2 s)),
    floor(2 t E) = 2 t k + floor(2 t x)

(``floor(z / m) = floor(floor(z) / m)`` for a positive integer ``m``; ties ``|L| = (j + 1/2)
gamma`` have measure zero).

The exponential is von Neumann's (1951): a trial draws uniforms ``x, u1, u2, ...`` in [0, 1)
while ``x > u1 > u2 > ...``; ``n`` is the index of the first ``u_n`` not below its predecessor.
``P(n > m) = x^m / m!``, so ``P(n odd | x) = sum_m even (x^m / m! - x^(m+1) / (m+1)!) = e^-x``.
An odd ``n`` accepts ``x``: the accepted ``x`` has density ``e^-x / (1 - e^-1)`` on [0, 1). An
even ``n`` (probability ``e^-1`` per trial) adds one to ``k`` and starts a fresh trial: ``k`` is
geometric, ``P(k) = e^-k (1 - e^-1)``, independent of ``x``, and ``k + x ~ Exp(1)``. A draw
reads about 4.3 raw words: 1.58 trials of ``e`` uniforms each, and a sign bit.

Each uniform is the binary expansion ``0.w1 w2 w3 ...`` of raw 64-bit words ``w1, w2, ...``
drawn lazily: two uniforms are compared word by word, drawing further words of both while they
are equal (probability ``2^-64`` per word), so every comparison is exact and no uniform is ever
truncated. ``floor(2 t x)`` is ``h`` or ``h + 1`` with ``2 t w1 = h 2^64 + l`` (128-bit
product): it is ``h`` when ``l <= 2^64 - 2t``, and otherwise (probability ``2t / 2^64``)
``h + 1`` exactly when ``0.w2 w3 ... >= (2^64 - l) / (2t)``, a comparison of the same uniform's
further words (those already drawn, then fresh ones) with a rational, digit by digit. So the
only randomness is the generator's raw 64-bit words and every decision is an exact integer
comparison: no floating-point value enters the law.

No floating-point fast path is used. The obvious one (accept when ``u / 2^64 < p - e``, reject
when ``u / 2^64 >= p + e`` for a float ``p ~ exp(-r)`` with error at most ``e``, and otherwise run
the exact loop on fresh words) is NOT exact: it accepts with probability
``(p - e) + 2 e p = p - e (1 - 2p)``. Here an undecided comparison always continues with more
words of the SAME uniforms.

Guards. ``2 t (k + 1) + s`` must fit in 64 bits: ``k`` above ``(2^64 - 1 - s) / (2t) - 1 >= 1534``
(probability below ``e^-1534`` per draw) makes :func:`rounded_laplace` raise
:class:`OverflowError` rather than return a value off the law. Values of ``|N|`` at or above
``2^53`` (probability ``e^{-gamma 2^53}``, below ``e^{-8}`` only when gamma is within a factor 1000
of the smallest allowed ``2^-50``) are exact int64s but not exact float64s.

Buffering. The kernel consumes a buffer of raw words. When the buffer runs out in the middle of
a draw, the kernel rewinds to the first word of that draw and returns; the wrapper keeps the
unused tail, appends fresh words, and the kernel draws again from there, reading the same words
again. The words of a uniform beyond its first are kept in a small scratch array; a draw that
would need more of them than it holds (ties on several whole words) is rewound the same way and
drawn again with a larger one. Every draw is a deterministic function of one stream of raw
words, whatever the buffer and scratch sizes, so the law is that of an infinite stream
(restarting a draw with fresh words instead would favour draws that consume few words).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
from numba import njit

from service.errors import InvalidParameter
from service.mechanisms.exact_bernoulli import (
    bernoulli_exp,
    bernoulli_ratio,
    bernoulli_scaled,
    mul_high_low,
    uniform_below,
)

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
#: t must be below this (so that 2t and the products with it fit the kernel's integers).
MAX_DENOMINATOR = 2**52
#: s must be below this.
MAX_NUMERATOR = 2**62
#: Significant bits of the mantissa of a dyadic noise scale (:func:`dyadic_scale`).
SCALE_BITS = 20

_U64_MAX = (1 << 64) - 1

# kernel status codes (state[2])
_OK = 0
_EXHAUSTED = 1
_OVERFLOW = 2
_DEEP = 3

#: Raw words per draw the wrapper asks for (a draw reads about 4.3 on average).
_WORDS_PER_DRAW = 4.4
#: Most raw words the wrapper holds at once (512 KiB).
_MAX_CHUNK = 1 << 16
#: Words of a uniform beyond its first that the scratch array holds at first.
_SCRATCH_WORDS = 4


# --- the kernel -------------------------------------------------------------------------
# Compiled without numba's reference counting (``_nrt=False``): the kernel allocates nothing.
# The draw loop keeps its state (buffer position, sign reservoir) in local variables and
# reads the state arrays only at entry and on return. The usual von Neumann trial (about 99%
# of them: a chain of at most 3 uniforms below x, no tie) is read from five words at once
# without a branch per word; the other trials (longer chains, ties between uniforms) and a
# cell boundary inside the first word of x are separate calls, which compute the same thing.
# All integer arithmetic is in uint64 (numba would turn a uint64/int64 mix into float64).
_Function = TypeVar("_Function", bound=Callable[..., Any])
_NJIT: Any = njit


def _jit(function: _Function) -> _Function:
    compiled: _Function = _NJIT(nogil=True, cache=True, _nrt=False, error_model="numpy")(function)
    return compiled


def _jit_inline(function: _Function) -> _Function:
    compiled: _Function = _NJIT(
        nogil=True, cache=True, _nrt=False, error_model="numpy", inline="always"
    )(function)
    return compiled


@_jit
def _tie(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray, p: np.int64, p_depth: np.int64,
    c: np.int64,
) -> tuple[bool, np.int64, np.int64, np.int64, np.int64]:  # fmt: skip  # pragma: no cover
    """The new uniform (slot ``c``) equals the previous one (slot ``p``, ``p_depth`` words
    known) on the first word: compare their further words, drawing those not yet drawn.
    Word ``i >= 1`` of slot j is ``scratch[j, i - 1]``. Returns (new < previous, the new
    one's known words, the previous one's known words, position, status)."""
    cap = scratch.shape[1]
    n = words.shape[0]
    i = 1
    while True:
        if i > cap:
            return False, np.int64(0), p_depth, pos, np.int64(_DEEP)
        if i >= p_depth:
            if pos >= n:
                return False, np.int64(0), p_depth, pos, np.int64(_EXHAUSTED)
            scratch[p, i - 1] = words[pos]
            pos += 1
            p_depth = np.int64(i + 1)
        if pos >= n:
            return False, np.int64(0), p_depth, pos, np.int64(_EXHAUSTED)
        new = words[pos]
        pos += 1
        scratch[c, i - 1] = new
        old = scratch[p, i - 1]
        if new != old:
            return new < old, np.int64(i + 1), p_depth, pos, np.int64(_OK)
        i += 1


@_jit
def _carry(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray, x_depth: np.int64, low: np.uint64,
    two_t: np.uint64,
) -> tuple[bool, np.int64, np.int64]:  # fmt: skip  # pragma: no cover
    """Whether f = 0.w2 w3 ... (the words of x after the first: ``scratch[0]`` for the
    ``x_depth - 1`` already drawn, then fresh ones) is >= (2^64 - low) / (2t), given
    low > 2^64 - 2t. Returns (the answer, position, status)."""
    n = words.shape[0]
    one = np.uint64(1)
    c = np.uint64(0) - low  # in (0, 2t): compare f with c / (2t)
    i = 1
    while True:
        if c == np.uint64(0):
            return True, pos, np.int64(_OK)
        q = np.uint64(0)  # q, c = divmod(c 2^64, 2t), bit by bit (c < 2t < 2^53)
        for _ in range(64):
            c = c << one
            q = q << one
            if c >= two_t:
                c -= two_t
                q |= one
        if i < x_depth:
            w = scratch[0, i - 1]
        else:
            if pos >= n:
                return False, pos, np.int64(_EXHAUSTED)
            w = words[pos]
            pos += 1
        if w != q:
            return w > q, pos, np.int64(_OK)
        i += 1


@_jit
def _trial(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray
) -> tuple[bool, np.uint64, np.int64, np.int64, np.int64]:  # pragma: no cover
    """One von Neumann trial from word ``pos``, any chain length, ties drawn out: (accepted,
    first word of x, words of x known, position, status). The kernel runs the usual trial
    (chain below x of at most 3, no tie among the next 5 words) itself, the same way."""
    n_words = words.shape[0]
    x = words[pos]  # the caller checked pos < n_words
    pos += 1
    x_depth = np.int64(1)
    previous = x  # first word of the previous uniform of the chain
    p = np.int64(0)  # its scratch slot (0: x itself)
    p_depth = np.int64(1)
    odd = True  # the index of the uniform drawn next is odd
    while True:
        if pos >= n_words:
            return False, x, x_depth, pos, np.int64(_EXHAUSTED)
        word = words[pos]
        pos += 1
        if word < previous:
            previous = word
            p = np.int64(1)
            p_depth = np.int64(1)
            odd = not odd
            continue
        if word > previous:
            return odd, x, x_depth, pos, np.int64(_OK)
        c = np.int64(2) if p == 1 else np.int64(1)
        less, c_depth, p_depth, pos, status = _tie(words, pos, scratch, p, p_depth, c)
        if status != _OK:
            return False, x, x_depth, pos, status
        if p == 0:
            x_depth = p_depth
        if not less:
            return odd, x, x_depth, pos, np.int64(_OK)
        previous = word
        p = c
        p_depth = c_depth
        odd = not odd


@_jit
def _rounded_laplace_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, scratch: np.ndarray,
    s: np.uint64, t: np.uint64, max_k: np.uint64, out: np.ndarray, start: np.int64,
) -> np.int64:  # fmt: skip  # pragma: no cover
    """Fill ``out[start:]``; returns the index of the first draw not made (``out.shape[0]``
    when done). state = (next word, bits left in the sign reservoir ``bits[0]``, status). On
    running out of words or of scratch the state is rewound to that draw's first word."""
    n_words = words.shape[0]
    pos = state[0]
    left = state[1]
    reservoir = bits[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    two_t = t + t
    room = zero - two_t  # 2^64 - 2t
    two_s = s + s
    halve = s == one
    count = out.shape[0]
    i = start
    status = np.int64(_OK)
    while i < count:
        first, first_left, first_reservoir = pos, left, reservoir
        k = zero
        x = zero
        x_depth = np.int64(1)
        while True:  # von Neumann trials until one accepts x
            if pos + 5 <= n_words:  # the usual trial: a chain of at most 3 below x, no tie
                x = words[pos]
                w1, w2, w3, w4 = words[pos + 1], words[pos + 2], words[pos + 3], words[pos + 4]
                tie = (w1 == x) | (w2 == w1) | (w3 == w2) | (w4 == w3)
                d1 = w1 < x
                d2 = d1 & (w2 < w1)
                d3 = d2 & (w3 < w2)
                if not (tie | (d3 & (w4 < w3))):
                    # the chain breaks at n = 1 + d1 + d2 + d3, read without branching
                    n = np.int64(1) + np.int64(d1) + np.int64(d2) + np.int64(d3)
                    pos += n + 1
                    x_depth = np.int64(1)
                    if n & 1:
                        break
                    k += one
                    if k > max_k:
                        status = np.int64(_OVERFLOW)
                        break
                    continue
            if pos >= n_words:
                status = np.int64(_EXHAUSTED)
                break
            accepted, x, x_depth, pos, status = _trial(words, pos, scratch)
            if status != _OK or accepted:
                break
            k += one
            if k > max_k:
                status = np.int64(_OVERFLOW)
                break
        if status == _OK:
            high, low = mul_high_low(two_t, x)
            if low > room:
                up, pos, status = _carry(words, pos, scratch, x_depth, low, two_t)
                if up:
                    high += one
        if status == _OK and left == 0:
            if pos >= n_words:
                status = np.int64(_EXHAUSTED)
            else:
                reservoir = words[pos]
                pos += 1
                left = np.int64(64)
        if status != _OK:
            if status != _OVERFLOW:
                pos, left, reservoir = first, first_left, first_reservoir
            break
        total = k * two_t + high + s  # floor(2 t E) + s < 2^64
        magnitude = np.int64(total >> one) if halve else np.int64(total // two_s)
        negative = (reservoir & one) == one
        reservoir = reservoir >> one
        left -= 1
        out[i] = -magnitude if negative else magnitude
        i += 1
    state[0] = pos
    state[1] = left
    state[2] = status
    bits[0] = reservoir
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


def _raw_words(rng: np.random.Generator, out: np.ndarray) -> None:
    """``out[:] = rng.bit_generator.random_raw(len(out))``."""
    out[:] = rng.bit_generator.random_raw(out.shape[0])


class _Stream:
    """A generator's raw words, in chunks, and the kernel's state over them."""

    def __init__(self, rng: np.random.Generator, chunk: int) -> None:
        self.rng = rng
        self.chunk = chunk
        self.words = np.empty(chunk, dtype=np.uint64)
        _raw_words(rng, self.words)
        self.state = np.zeros(3, dtype=np.int64)
        self.bits = np.zeros(1, dtype=np.uint64)
        self.scratch = np.zeros((3, _SCRATCH_WORDS), dtype=np.uint64)

    def refill(self) -> None:
        """Keep the unread tail (the unfinished draw's words) and append fresh words; a draw
        that ran out of scratch gets twice as much."""
        if self.state[2] == _DEEP:
            self.scratch = np.zeros((3, 2 * self.scratch.shape[1]), dtype=np.uint64)
        else:
            start = int(self.state[0])
            kept = self.words.shape[0] - start
            if kept + self.chunk != self.words.shape[0]:
                words = np.empty(kept + self.chunk, dtype=np.uint64)
                words[:kept] = self.words[start:]
                self.words = words
            else:
                self.words[:kept] = self.words[start:].copy()
            _raw_words(self.rng, self.words[kept:])
            self.state[0] = 0
        self.state[2] = _OK


def _chunk_for(count: int) -> int:
    return max(64, min(_MAX_CHUNK, int(count * _WORDS_PER_DRAW) + 64))


def _max_k(s: int, t: int) -> int:
    """The largest integer part k of E with 2t (k + 1) + s < 2^64."""
    return (_U64_MAX - s) // (2 * t) - 1


def _fill(
    rng: np.random.Generator, s: int, t: int, out: np.ndarray, chunk: int,
    max_k: int | None = None, scratch: int = _SCRATCH_WORDS,
) -> None:  # fmt: skip
    """Fill ``out`` with draws from chunks of ``chunk`` raw words; ``max_k`` (tests only)
    lowers the overflow guard on k, ``scratch`` (tests only) the scratch words at first."""
    if out.shape[0] == 0:
        return
    stream = _Stream(rng, chunk)
    stream.scratch = np.zeros((3, scratch), dtype=np.uint64)
    bound = _max_k(s, t)
    limit = bound if max_k is None else min(max_k, bound)
    done = 0
    while True:
        done = int(
            _rounded_laplace_kernel(
                stream.words, stream.state, stream.bits, stream.scratch, np.uint64(s),
                np.uint64(t), np.uint64(limit), out, np.int64(done),
            )
        )  # fmt: skip
        if stream.state[2] == _OVERFLOW:
            raise OverflowError(
                "an exact Laplace draw left the 64-bit range (probability below e^-1534)"
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
        per = np.full(int(count), float(scales))  # type: ignore[arg-type]
    else:
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
