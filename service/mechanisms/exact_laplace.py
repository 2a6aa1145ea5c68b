"""An exact sampler of the rounded Laplace law, from uniform random integers only.

For a rational ``gamma = s / t`` (positive Python ints) :func:`rounded_laplace` draws
``N = round(L / gamma)`` with ``L ~ Lap(1)`` (density ``exp(-|x|) / 2``). So ``g * N`` has exactly
the law of ``round_g(b L)``, ``b L ~ Lap(b)`` rounded to the nearest multiple of ``g``, when
``gamma = g / b``: a count release ``c + g N`` (``c`` a multiple of ``g``) has exactly the law of
``round_g(c + Lap(b))``, post-processing of the exact Laplace mechanism. The proof is in full in
docs/privacy.md, "The Laplace sampler and its stated delta"; in short:

- ``|L| = E ~ Exp(1)`` is drawn exactly, with only the binary digits a decision needs, then
  ``|N| = floor((floor(2 t E) + s) / (2 s))`` and a uniform sign bit.
- ``z = floor(2^m E)`` (``m = FRACTION_BITS``, 6) is ``#{i in 1..J: U < T_i}`` for one uniform
  ``U`` and the thresholds ``T_i = exp(-i / 2^m)`` (``J = TABLE_LENGTH``, 1280; exact binary
  expansions, :mod:`service.mechanisms.exp_thresholds`); when ``U < T_J`` (probability
  ``e^-20``) the draw adds ``J`` and inverts a fresh uniform (memorylessness).
- the remainder ``y = 2^m E - z``, independent of ``z``, has density ``e^(-y / 2^m) / const`` on
  [0, 1): a uniform ``y`` accepted when von Neumann's chain ``y 2^-m > u_1 > u_2 > ...`` breaks
  at an odd index, each ``u_j`` led by an ``m``-bit gate from a reservoir (a nonzero gate
  breaks it: ``y`` is accepted at its first gate with probability ``1 - 2^-m``); a rejected
  ``y`` is drawn again, ``z`` kept.
- with ``z = 2^m k + r``, ``floor(2 t E) = 2 t k + floor((2 t r + floor(2 t y)) / 2^m)``; when
  ``gamma > 2^-m`` and every ``E`` in ``[z, z + 1) / 2^m`` gives the same ``|N|``, ``y`` is not
  drawn. ``floor(2 t y)`` is ``h`` or ``h + 1`` with ``2 t w1 = h 2^64 + l`` (``w1`` the first word
  of ``y``): ``h`` when ``l <= 2^64 - 2t``, otherwise (probability ``2t / 2^64``) ``h + 1`` exactly
  when ``0.w2 w3 ... >= (2^64 - l) / (2t)``.

Every comparison is exact: a uniform is the binary expansion ``0.w1 w2 ...`` of raw 64-bit
words drawn lazily, and a comparison whose first words are equal goes on with the SAME
uniform's next words, never a fresh uniform's (:mod:`service.mechanisms.exact_words`). No
floating-point value enters the law, and there is no floating-point fast path (the obvious one
is not exact).
The guide to the table only chooses which comparisons to make; the kernel's branch-free usual
draw and :func:`_draw`, which handles every draw, read the same words in the same order and
compute the same function. A draw reads about 2.14 raw words when ``y`` is needed (gamma <=
2^-6), about 1.02 when ``z`` alone decides (gamma 1 or 5/2).

Buffering. When the buffer of raw words, a uniform's scratch of further words or the table's
words of a threshold runs out in the middle of a draw, the draw is rewound to its first word
and drawn again from the same words with more of what ran out: every draw is a deterministic
function of one stream of raw words, and the law is that of an infinite stream.

Guards. ``2 t (k + 1) + s`` must fit in 64 bits: ``k`` above ``(2^64 - 1 - s) / (2t) - 1 >= 1534``
(probability below ``e^-1534`` per draw) makes :func:`rounded_laplace` raise
:class:`OverflowError` rather than return a value off the law. Values of ``|N|`` at or above
``2^53`` (probability ``e^{-gamma 2^53}``, below ``e^{-8}`` only when gamma is within a factor 1000
of the smallest allowed ``2^-50``) are exact int64s but not exact float64s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from service.errors import InvalidParameter
from service.mechanisms.exact_bernoulli import (
    bernoulli_exp,
    bernoulli_ratio,
    bernoulli_scaled,
    mul_high_low,
    uniform_below,
)
from service.mechanisms.exact_words import (
    DEEP,
    DIGITS,
    EXHAUSTED,
    OK,
    carry,
    jit,
    jit_inline,
    next_gate,
    threshold_tie,
    von_neumann_chain,
)
from service.mechanisms.exp_thresholds import ExpTable, exp_table

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

# kernel status codes (state[2]): those of exact_words (OK 0, EXHAUSTED 1, DEEP 3, DIGITS 4)
# and this one
_OVERFLOW = 2

#: Raw words per draw the wrapper asks for (a draw reads about 2.1 at small gamma, fewer at
#: large gamma).
_WORDS_PER_DRAW = 2.2
#: Most raw words the wrapper holds at once (512 KiB).
_MAX_CHUNK = 1 << 16
#: Words of a uniform beyond its first that the scratch array holds at first.
_SCRATCH_WORDS = 4


# --- the kernel -------------------------------------------------------------------------
# Compiled without numba's reference counting (``_nrt=False``): the kernel allocates nothing.
# The draw loop keeps its state (buffer position, bit reservoir) in local variables and reads
# the state arrays only at entry and on return. The rare paths (a uniform's first word equal
# to a threshold's, a remainder whose gate bits are all zero, a cell boundary of floor(2 t y)
# inside y's first word) are separate calls, to the kernels of exact_words. All integer
# arithmetic on words is in uint64 (numba would turn a uint64/int64 mix into float64).


@jit_inline
def _thresholds_above(
    w: np.uint64, guide: np.ndarray, guide_shift: np.uint64, first: np.ndarray
) -> np.int64:  # pragma: no cover
    """``a = #{i in 1..J: first[i] > w}`` for a word ``w >= first[J]``: the guide's cell of
    ``w`` bounds it, ``lo <= a <= hi <= J - 1``, and a binary search finds the largest ``a`` in
    ``[lo, hi]`` with ``first[a] > w`` (``first[lo] > w``; ``first`` strictly decreasing). Most
    cells are one or two thresholds wide (``hi <= lo + 1``): one comparison decides them."""
    packed = np.int64(guide[w >> guide_shift])
    lo = packed & np.int64(0xFFFF)
    b = packed >> np.int64(16)
    a = lo + np.int64(first[lo + np.int64(1)] > w)  # lo <= J - 1
    if b > lo + np.int64(1):  # about 2% of the words: a wider cell
        while a < b:  # the largest a in [a, b] with first[a] > w
            mid = (a + b + np.int64(1)) >> np.int64(1)
            if first[mid] > w:
                a = mid
            else:
                b = mid - np.int64(1)
    return a


@jit_inline
def _magnitude(
    z: np.uint64, high: np.uint64, m: np.uint64, two_t: np.uint64, s: np.uint64,
    s_shift: np.int64,
) -> np.int64:  # fmt: skip  # pragma: no cover
    """|N| = floor((floor(2 t E) + s) / (2 s)) for E in the cell ``z`` of width 2^-m with
    ``floor(2 t y) = high``: floor(2 t E) = 2 t k + floor((2 t r + high) / 2^m), z = 2^m k + r
    (floor(2 t E) + s < 2^64 under the guard on k); a shift when 2s is a power of two."""
    one = np.uint64(1)
    total = (z >> m) * two_t + (((z & ((one << m) - one)) * two_t + high) >> m) + s
    if s_shift >= 0:
        return np.int64(total >> np.uint64(s_shift))
    return np.int64(total // (s + s))


@jit_inline
def _cell_magnitude(
    z: np.uint64, m: np.uint64, two_t: np.uint64, s: np.uint64, s_shift: np.int64
) -> np.int64:  # pragma: no cover
    """|N| when every E in the cell ``z`` gives the same one (floor(2 t y) takes the values
    0 .. 2t - 1 and |N| is monotone in it), else -1: y need not be drawn."""
    low_end = _magnitude(z, np.uint64(0), m, two_t, s, s_shift)
    high_end = _magnitude(z, two_t - np.uint64(1), m, two_t, s, s_shift)
    return low_end if low_end == high_end else np.int64(-1)


#: (the signed draw, position, reservoir, bits left, status)
_DrawResult = tuple[np.int64, np.int64, np.uint64, np.int64, np.int64]


@jit
def _draw(
    words: np.ndarray, pos: np.int64, reservoir: np.uint64, left: np.int64, scratch: np.ndarray,
    first: np.ndarray, deeper: np.ndarray, guide: np.ndarray, m: np.uint64,
    guide_shift: np.uint64, s: np.uint64, t: np.uint64, s_shift: np.int64, coarse: bool,
    max_k: np.uint64,
) -> _DrawResult:  # fmt: skip  # pragma: no cover
    """One draw from word ``pos`` (module docstring), every path: the tail of z, ties with a
    threshold's first word, the chain of a remainder whose gate is zero, a cell boundary of
    floor(2 t y) inside y's first word. The kernel's fast path computes the same thing when
    none of them occurs. A status other than ``OK`` leaves the draw unfinished."""
    n_words = words.shape[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    two_t = t + t
    room = zero - two_t  # 2^64 - 2t
    length = np.int64(first.shape[0] - 1)
    length_u = np.uint64(length)
    edge = first[length]
    status = np.int64(OK)
    # z = floor(2^m E): the index of the uniform among the thresholds T_i = exp(-i / 2^m)
    z = zero
    while True:
        if pos >= n_words:
            return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
        w = words[pos]
        pos += 1
        if w < edge:  # U < T_J: z >= J, and z - J is drawn afresh (memoryless)
            z += length_u
            if (z >> m) > max_k:
                return np.int64(0), pos, reservoir, left, np.int64(_OVERFLOW)
            continue
        a = _thresholds_above(w, guide, guide_shift, first)
        if first[a + 1] == w:  # a + 1 <= J since w >= first[J]
            less, pos, status = threshold_tie(words, pos, deeper, a + np.int64(1))
            if status != OK:
                return np.int64(0), pos, reservoir, left, status
            if less:
                a += np.int64(1)
        z += np.uint64(a)
        if (z >> m) > max_k:
            return np.int64(0), pos, reservoir, left, np.int64(_OVERFLOW)
        if a < length:
            break
    magnitude = _cell_magnitude(z, m, two_t, s, s_shift) if coarse else np.int64(-1)
    if magnitude < 0:
        # the remainder y, density e^(-y / 2^m) / const on [0, 1): a uniform accepted when
        # its gate (m bits of the reservoir) is not all zero, else by the chain
        while True:
            if pos >= n_words:
                return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
            y = words[pos]
            pos += 1
            y_depth = np.int64(1)
            gate, pos, reservoir, left, drawn = next_gate(words, pos, reservoir, left, m)
            if not drawn:
                return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
            if gate != zero:
                break
            accepted, y_depth, pos, reservoir, left, status = von_neumann_chain(
                words, pos, scratch, y, reservoir, left, m
            )
            if status != OK:
                return np.int64(0), pos, reservoir, left, status
            if accepted:
                break
        high, low = mul_high_low(two_t, y)
        if low > room:
            up, pos, status = carry(words, pos, scratch, y_depth, low, two_t)
            if status != OK:
                return np.int64(0), pos, reservoir, left, status
            if up:
                high += one
        magnitude = _magnitude(z, high, m, two_t, s, s_shift)
    if left == 0:
        if pos >= n_words:
            return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
        reservoir = words[pos]
        pos += 1
        left = np.int64(64)
    negative = np.int64(reservoir & one)  # the sign: -magnitude when 1
    reservoir = reservoir >> one
    left -= 1
    return (magnitude ^ -negative) + negative, pos, reservoir, left, np.int64(OK)


@jit
def _rounded_laplace_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, scratch: np.ndarray,
    first: np.ndarray, deeper: np.ndarray, guide: np.ndarray, m: np.uint64,
    guide_shift: np.uint64, s: np.uint64, t: np.uint64, s_shift: np.int64, coarse: bool,
    max_k: np.uint64, out: np.ndarray, start: np.int64,
) -> np.int64:  # fmt: skip  # pragma: no cover
    """Fill ``out[start:]``; returns the index of the first draw not made (``out.shape[0]``
    when done). state = (next word, bits left in the reservoir ``bits[0]``, status). On
    running out of words, of scratch or of threshold words the state is rewound to that
    draw's first word. ``s_shift``: log2(2s) when 2s is a power of two, else -1; ``coarse``:
    try to decide |N| from z alone (gamma > 2^-m).

    The usual draw (no tail, no tie, a guide cell with at most two candidates, a nonzero
    gate, no cell boundary inside y's first word, four words left in the buffer) is computed
    here without a call; any other draw is computed again from its first word by
    :func:`_draw`, which reads the same words the same way."""
    n_words = words.shape[0]
    pos = state[0]
    left = state[1]
    reservoir = bits[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    two_t = t + t
    room = zero - two_t  # 2^64 - 2t
    length = np.int64(first.shape[0] - 1)
    edge = first[length]
    small_k = (np.uint64(length) >> m) <= max_k  # no z of the table leaves the guard
    count = out.shape[0]
    i = start
    status = np.int64(OK)
    fine = small_k and not coarse
    while i < count:
        if fine and pos + 4 <= n_words:
            # gamma <= 2^-m: U and y, the gate, the sign, read without a branch on them
            w = words[pos]
            y = words[pos + 1]
            p = pos + 2
            a = _thresholds_above(w, guide, guide_shift, first)
            gate, p, res, bits_left, _ = next_gate(words, p, reservoir, left, m)
            if bits_left == 0:
                res = words[p]
                p += 1
                bits_left = np.int64(64)
            z = np.uint64(a)
            high, low = mul_high_low(two_t, y)
            magnitude = _magnitude(z, high, m, two_t, s, s_shift)
            # not the usual draw: U < T_J, a tie with a threshold, a zero gate, a boundary
            usual = (
                (w >= edge)
                & (first[min(a + np.int64(1), length)] != w)
                & (gate != zero)
                & (low <= room)
            )
            if usual:
                negative = np.int64(res & one)
                out[i] = (magnitude ^ -negative) + negative
                pos = p
                reservoir = res >> one
                left = bits_left - 1
                i += 1
                continue
        elif small_k and pos + 4 <= n_words:
            w = words[pos]
            a = _thresholds_above(w, guide, guide_shift, first)
            if w >= edge and first[a + np.int64(1)] != w:  # a <= J - 1 since w >= first[J]
                z = np.uint64(a)
                p = pos + 1
                res = reservoir
                bits_left = left
                magnitude = _cell_magnitude(z, m, two_t, s, s_shift) if coarse else np.int64(-1)
                usual = True
                if magnitude < 0:
                    y = words[p]
                    p += 1
                    gate, p, res, bits_left, _ = next_gate(words, p, res, bits_left, m)
                    high, low = mul_high_low(two_t, y)
                    usual = (gate != zero) & (low <= room)
                    magnitude = _magnitude(z, high, m, two_t, s, s_shift)
                if usual:
                    if bits_left == 0:
                        res = words[p]
                        p += 1
                        bits_left = np.int64(64)
                    negative = np.int64(res & one)
                    out[i] = (magnitude ^ -negative) + negative
                    pos = p
                    reservoir = res >> one
                    left = bits_left - 1
                    i += 1
                    continue
        value, next_pos, next_reservoir, next_left, status = _draw(
            words, pos, reservoir, left, scratch, first, deeper, guide, m, guide_shift, s, t,
            s_shift, coarse, max_k,
        )  # fmt: skip
        if status != OK:
            break  # the state stays at the draw's first word (pos, reservoir, left)
        out[i] = value
        pos, reservoir, left = next_pos, next_reservoir, next_left
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
    if type(s) is int and type(t) is int:  # plain ints (the samplers' own): checked once each
        return _checked_int_ratio(s, t)
    return _checked_int_ratio(_positive_int("s", s), _positive_int("t", t))


@functools.lru_cache(maxsize=64)
def _checked_int_ratio(s: int, t: int) -> tuple[int, int]:
    """(s, t), checked (a refusal is not cached: it raises again)."""
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

    def __init__(self, rng: np.random.Generator, chunk: int, scratch: int) -> None:
        self.rng = rng
        self.chunk = chunk
        # random_raw's new array as it is (no copy: it is uint64 and contiguous already)
        self.words = np.ascontiguousarray(rng.bit_generator.random_raw(chunk), dtype=np.uint64)
        self.state = np.zeros(3, dtype=np.int64)
        self.bits = np.zeros(1, dtype=np.uint64)
        self.scratch = np.zeros((3, scratch), dtype=np.uint64)

    def refill(self) -> None:
        """Keep the unread tail (the unfinished draw's words) and append fresh words; a draw
        that ran out of scratch gets twice as much (one that ran out of threshold words is
        handled by the caller, with a deeper table)."""
        if self.state[2] == DEEP:
            self.scratch = np.zeros((3, 2 * self.scratch.shape[1]), dtype=np.uint64)
        elif self.state[2] == EXHAUSTED:
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
        self.state[2] = OK


def _chunk_for(count: int) -> int:
    return max(64, min(_MAX_CHUNK, int(count * _WORDS_PER_DRAW) + 64))


def _max_k(s: int, t: int) -> int:
    """The largest integer part k of E with 2t (k + 1) + s < 2^64."""
    return (_U64_MAX - s) // (2 * t) - 1


def _fill(
    rng: np.random.Generator, s: int, t: int, out: np.ndarray, chunk: int,
    max_k: int | None = None, scratch: int = _SCRATCH_WORDS, table: ExpTable | None = None,
) -> None:  # fmt: skip
    """Fill ``out`` with draws from chunks of ``chunk`` raw words; ``max_k`` (tests only)
    lowers the overflow guard on k, ``scratch`` (tests only) the scratch words at first,
    ``table`` (tests only) replaces the table of thresholds."""
    if out.shape[0] == 0:
        return
    stream = _Stream(rng, chunk, scratch)
    if table is None:
        table = exp_table()
    bound = _max_k(s, t)
    limit = bound if max_k is None else min(max_k, bound)
    m = table.fraction_bits
    two_s = 2 * s
    s_shift = two_s.bit_length() - 1 if two_s & (two_s - 1) == 0 else -1
    coarse = (s << m) > t  # gamma > 2^-m: z alone often decides |N|
    done = 0
    while True:
        done = int(
            _rounded_laplace_kernel(
                stream.words, stream.state, stream.bits, stream.scratch, table.first,
                table.deeper, table.guide, np.uint64(m), np.uint64(64 - table.guide_bits),
                np.uint64(s), np.uint64(t), np.int64(s_shift), coarse, np.uint64(limit), out,
                np.int64(done),
            )
        )  # fmt: skip
        if stream.state[2] == _OVERFLOW:
            raise OverflowError(
                "an exact Laplace draw left the 64-bit range (probability below e^-1534)"
            )
        if done == out.shape[0]:
            return
        if stream.state[2] == DIGITS:
            table = exp_table(
                table.fraction_bits, table.first.shape[0] - 1, table.guide_bits, 2 * table.words
            )
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
    return _reduced_ratio(float(grid), float(scale))


@functools.lru_cache(maxsize=256)
def _reduced_ratio(grid: float, scale: float) -> tuple[int, int]:
    """:func:`gamma_ratio` of two valid floats, kept: a process asks for the same few (its
    plans' scales on their grids), and the exact fractions cost more than the draws of a small
    neighbourhood."""
    ratio = Fraction(grid) / Fraction(scale)
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
