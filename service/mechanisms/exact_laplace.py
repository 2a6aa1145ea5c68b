"""Exact samplers of the rounded Laplace law and of the rounded sum of two Laplace draws,
from uniform random integers only (their compiled kernel: :mod:`service.mechanisms.laplace_kernel`).

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

The pair sum (:func:`rounded_laplace_pair_sum`): ``M = round((L1 + L2) / gamma)``, L1, L2
independent Lap(1), one draw of the sum's law rather than two draws: ``X = |L1 + L2|`` has density
``(1 + x) e^-x / 2`` and survival ``S(x) = e^-x (1 + x / 2)``, and ``|M| = floor((floor(2 t X) +
s) / (2 s))`` with a uniform sign, as above. ``z = floor(2^m X)`` inverts one uniform against
``T_i = S(i / 2^m)`` (:func:`service.mechanisms.exp_thresholds.pair_sum_table`); on the cell z
the remainder's density is proportional to ``(2^m + z + y) e^(-y / 2^m)``, so the uniform ``y``
the gate and chain accept is also accepted with probability ``(2^m + z + y) / (2^m + z + 1)``:
outright unless a uniform ``r < 1 / (2^m + z + 1)`` (16 reservoir bits decide it but in a
cell of probability ``2^-16``, then fresh words against the rational), and then exactly when a
fresh uniform is below ``y``. Past the table, ``P(X >= a + x | X >= a) = e^-x (1 + x / (2 + a))``
with ``a = J / 2^m``: the pair-sum law again with probability ``2 / (2 + a)``, Exp(1) otherwise
(drawn from the exponential table, memoryless, from there on). About 2.4 raw words a draw, one
draw where two Laplace draws took 4.3.

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
    uniform_below,
)
from service.mechanisms.exact_words import DEEP, DIGITS, EXHAUSTED, OK
from service.mechanisms.exp_thresholds import ExpTable, deeper_table, exp_table, pair_sum_table
from service.mechanisms.laplace_kernel import (
    OVERFLOW,
    rounded_laplace_kernel,
    streamed_columns_kernel,
    streamed_kernel,
)
from service.mechanisms.word_stream import fill_words

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
    "pair_sum_from_stream",
    "pair_sums_from_streams",
    "rounded_laplace",
    "rounded_laplace_pair_sum",
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

#: Raw words per draw the wrapper asks for (a draw reads about 2.1 at small gamma, fewer at
#: large gamma; a draw of the pair sum about 2.4).
_WORDS_PER_DRAW = 2.2
_PAIR_SUM_WORDS_PER_DRAW = 2.45
#: Most raw words the wrapper holds at once (512 KiB).
_MAX_CHUNK = 1 << 16
#: Words of a uniform beyond its first that the scratch array holds at first.
_SCRATCH_WORDS = 4
#: Raw words of an SFC64 stream the sampler holds at once (8 KiB: they are read while still in
#: the core's first-level cache).
_STREAM_BUFFER = 1024
#: The clamp of a draw that is not clamped.
_NO_SATURATION = 2**63 - 1


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


class _Stream:
    """Raw words in a buffer, and the kernel's state over them. The words come from a numpy
    generator (``random_raw``, a chunk at a time) or, when ``source`` is an SFC64 word stream
    (:mod:`service.mechanisms.word_stream`), from that stream: then the compiled kernel
    refills the buffer itself (:func:`~service.mechanisms.laplace_kernel.streamed_kernel`) and
    comes back only when one draw needs more words than the buffer holds."""

    def __init__(self, source: np.random.Generator | np.ndarray, chunk: int, scratch: int) -> None:
        self.source = source
        # type(), not isinstance: the tests' stand-in generators may refuse __class__
        self.sfc = source if type(source) is np.ndarray else None
        self.chunk = chunk
        if self.sfc is None:  # random_raw's new array as it is (uint64 and contiguous already)
            self.words = np.ascontiguousarray(self._raw(chunk), dtype=np.uint64)
        else:
            self.words = np.empty(chunk, dtype=np.uint64)
            fill_words(self.sfc, self.words, np.int64(0))
        self.state = np.zeros(3, dtype=np.int64)
        self.bits = np.zeros(1, dtype=np.uint64)
        self.scratch = np.zeros((3, scratch), dtype=np.uint64)

    @classmethod
    def resumed(
        cls, sfc: np.ndarray, words: np.ndarray, state: np.ndarray, bits: np.ndarray,
        scratch: np.ndarray, chunk: int,
    ) -> _Stream:  # fmt: skip
        """The stream ``sfc`` where a kernel stopped in a draw: copies of that kernel's buffer,
        state, reservoir and scratch (the kernel's own go on to other streams)."""
        stream = cls.__new__(cls)
        stream.source = stream.sfc = sfc
        stream.chunk = chunk
        stream.words = words.copy()
        stream.state = state.copy()
        stream.bits = bits.copy()
        stream.scratch = scratch.copy()
        return stream

    def _raw(self, count: int) -> np.ndarray:
        rng: np.random.Generator = self.source  # type: ignore[assignment]
        words: np.ndarray = rng.bit_generator.random_raw(count)
        return words

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
            if self.sfc is None:
                self.words[kept:] = self._raw(self.words.shape[0] - kept)
            else:
                fill_words(self.sfc, self.words, np.int64(kept))
            self.state[0] = 0
        self.state[2] = OK


def _chunk_for(count: int, per_draw: float = _WORDS_PER_DRAW) -> int:
    return max(64, min(_MAX_CHUNK, int(count * per_draw) + 64))


def _max_k(s: int, t: int) -> int:
    """The largest integer part k of X with 2t (k + 1) + s < 2^64."""
    return (_U64_MAX - s) // (2 * t) - 1


def _tail_table(table: ExpTable) -> ExpTable:
    """The table a draw reads past ``table``'s last threshold: ``table`` itself for the
    Laplace law (memoryless), the exponential table of the same shape for the pair sum."""
    if not table.pair_sum:
        return table
    return exp_table(table.fraction_bits, table.first.shape[0] - 1, table.guide_bits, table.words)


def _fill(
    source: np.random.Generator | np.ndarray, s: int, t: int, out: np.ndarray, chunk: int,
    max_k: int | None = None, scratch: int = _SCRATCH_WORDS, table: ExpTable | None = None,
    pair_sum: bool = False, saturation: int = _NO_SATURATION,
) -> None:  # fmt: skip
    """Fill ``out`` with draws (of the pair-sum law when ``pair_sum``) from chunks of ``chunk``
    raw words of ``source`` (a numpy generator, or an SFC64 word stream: see :class:`_Stream`);
    ``max_k`` (tests only) lowers the overflow guard on k, ``scratch`` (tests only) the scratch
    words at first, ``table`` (tests only) replaces the table of thresholds (a pair-sum table
    for the pair sum). From an SFC64 stream each draw is clamped to ``+-saturation``."""
    if out.shape[0] == 0:
        return
    stream = _Stream(source, chunk, scratch)
    if stream.sfc is None and saturation != _NO_SATURATION:
        raise ValueError("draws are clamped only when they come from an SFC64 stream")
    table = _law_table(table, pair_sum)
    rounding = _rounding_args(s, t, table.fraction_bits, max_k)
    _draw_into(stream, table, rounding, out, 0, pair_sum, saturation)


def _draw_into(
    stream: _Stream, table: ExpTable, rounding: _RoundingArgs, out: np.ndarray, done: int,
    pair_sum: bool, saturation: int,
) -> None:  # fmt: skip
    """Draw ``out[done:]`` from ``stream`` at its state (the kernel's state at draw ``done``:
    the first word of that draw, or where the kernel stopped in it)."""
    stopped = bool(stream.state[2] != OK)
    while True:
        if stopped:
            if stream.state[2] == OVERFLOW:
                raise OverflowError(
                    "an exact Laplace draw left the 64-bit range (probability below e^-1534)"
                )
            if stream.state[2] == DIGITS:
                table = deeper_table(table)
            stream.refill()
        if stream.sfc is None:
            done = int(
                rounded_laplace_kernel(
                    stream.words, stream.state, stream.bits, stream.scratch,
                    *_table_args(table), *rounding, pair_sum, out, np.int64(done),
                )
            )  # fmt: skip
        else:
            done = int(
                streamed_kernel(
                    stream.sfc, stream.words, stream.state, stream.bits, stream.scratch,
                    *_table_args(table), *rounding, pair_sum, out, np.int64(done),
                    np.int64(saturation),
                )
            )  # fmt: skip
        if done == out.shape[0] and stream.state[2] != OVERFLOW:
            return
        stopped = True


#: The kernel's arguments from the table: thresholds, their further words, the guide (the law's
#: and the tail's), m, the guide's shift.
_TableArgs = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.uint64, np.uint64
]
#: The kernel's arguments from gamma: s, t, log2(2s) or -1, coarse, the guard on k.
_RoundingArgs = tuple[np.uint64, np.uint64, np.int64, bool, np.uint64]


def _law_table(table: ExpTable | None, pair_sum: bool) -> ExpTable:
    """The table of thresholds of the law drawn (``table`` if given: tests only)."""
    if table is None:
        return pair_sum_table() if pair_sum else exp_table()
    if table.pair_sum != pair_sum:
        raise ValueError("the table is not of the law drawn")
    return table


def _table_args(table: ExpTable) -> _TableArgs:
    """The kernel's arguments that come from the table: its thresholds, the tail's, m and the
    guide's shift."""
    tail = _tail_table(table)
    return (
        table.first, table.deeper, table.guide, tail.first, tail.deeper, tail.guide,
        np.uint64(table.fraction_bits), np.uint64(64 - table.guide_bits),
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _rounding_args(s: int, t: int, m: int, max_k: int | None) -> _RoundingArgs:
    """The kernel's arguments that come from gamma = s / t: s, t, log2(2s) (or -1), whether
    z alone often decides |N| (gamma > 2^-m), the guard on k (lowered by ``max_k``: tests)."""
    bound = _max_k(s, t)
    limit = bound if max_k is None else min(max_k, bound)
    two_s = 2 * s
    s_shift = two_s.bit_length() - 1 if two_s & (two_s - 1) == 0 else -1
    coarse = (s << m) > t
    return np.uint64(s), np.uint64(t), np.int64(s_shift), coarse, np.uint64(limit)


def _check_saturation(saturation: int) -> None:
    if not 0 <= saturation < 2**63:
        raise InvalidParameter("saturation", f"must be in [0, 2^63), got {saturation!r}")


def _checked_count(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
        raise InvalidParameter("count", f"must be a non-negative integer, got {count!r}")
    return int(count)


def rounded_laplace(rng: np.random.Generator, s: int, t: int, count: int) -> np.ndarray:
    """``count`` independent draws of N = round(L / gamma), L ~ Lap(1), gamma = ``s / t``
    (positive ints, t < 2^52, s < 2^62, gamma >= 2^-50), as int64, exactly (module docstring).

    The only randomness is ``rng.bit_generator.random_raw``; a seeded generator reproduces the
    draws. In the service ``rng`` is a fresh OS-entropy generator
    (:func:`service.mechanisms.randomness.fresh_generator`)."""
    s, t = _checked_ratio(s, t)
    out = np.empty(_checked_count(count), dtype=np.int64)
    _fill(rng, s, t, out, _chunk_for(out.shape[0]))
    return out


def rounded_laplace_pair_sum(rng: np.random.Generator, s: int, t: int, count: int) -> np.ndarray:
    """``count`` independent draws of M = round((L1 + L2) / gamma), L1, L2 independent Lap(1),
    gamma = ``s / t`` (as :func:`rounded_laplace` requires), as int64, exactly: one draw of the
    sum's law (density ``(1 + |x|) e^-|x| / 4``), not two draws rounded apart (module
    docstring)."""
    s, t = _checked_ratio(s, t)
    out = np.empty(_checked_count(count), dtype=np.int64)
    _fill(rng, s, t, out, _chunk_for(out.shape[0], _PAIR_SUM_WORDS_PER_DRAW), pair_sum=True)
    return out


def pair_sum_from_stream(
    stream: np.ndarray, s: int, t: int, out: np.ndarray, saturation: int
) -> None:
    """``out[:]`` = draws of :func:`rounded_laplace_pair_sum`'s law, each clamped to
    ``[-saturation, saturation]``, from the SFC64 stream ``stream`` (a word stream of
    :mod:`service.mechanisms.word_stream`; it moves past every word it put in the buffer,
    read or not): the same draws as ``rounded_laplace_pair_sum`` gives from numpy's SFC64
    generator at the stream's state, clamped, with the raw words produced in compiled code."""
    s, t = _checked_ratio(s, t)
    if type(stream) is not np.ndarray or stream.dtype != np.uint64 or stream.shape != (4,):
        raise InvalidParameter("stream", "must be an SFC64 word stream: 4 uint64 words")
    _check_saturation(saturation)
    _fill(stream, s, t, out, _STREAM_BUFFER, pair_sum=True, saturation=saturation)


def pair_sums_from_streams(
    streams: np.ndarray, s: int, t: int, out: np.ndarray, rows: np.ndarray, saturation: int,
    *, buffer: int = _STREAM_BUFFER, table: ExpTable | None = None,
) -> None:  # fmt: skip
    """For every column c, ``out[rows[c]]`` = the draws :func:`pair_sum_from_stream` makes from
    the stream ``streams[c]`` (each moved on as that call moves it), for all the columns in one
    compiled call (:func:`~service.mechanisms.laplace_kernel.streamed_columns_kernel`): one call
    a column cost about 15 us of Python and of numba's dispatch, a tenth of a column's draws on
    a graph of 4,039 nodes. A column in which the kernel stops (a draw needing more words than
    the buffer, more scratch or more of the table's words, all rare) is finished here as
    :func:`pair_sum_from_stream` finishes it. ``buffer`` and ``table``: tests only."""
    s, t = _checked_ratio(s, t)
    if (
        type(streams) is not np.ndarray or streams.dtype != np.uint64 or streams.ndim != 2
        or streams.shape[1] != 4 or not streams.flags.c_contiguous
    ):  # fmt: skip
        raise InvalidParameter("streams", "must be SFC64 word streams: rows of 4 uint64 words")
    if type(out) is not np.ndarray or out.dtype != np.int64 or out.ndim != 2:
        raise InvalidParameter("out", "must be a 2-D int64 array")
    if (
        type(rows) is not np.ndarray or rows.dtype != np.int64 or rows.shape != streams.shape[:1]
        or (rows.size and not 0 <= int(rows.min()) <= int(rows.max()) < out.shape[0])
    ):  # fmt: skip
        raise InvalidParameter("rows", "must be one int64 row of out per stream")
    _check_saturation(saturation)
    count = streams.shape[0]
    if count == 0 or out.shape[1] == 0:
        return
    table = _law_table(table, pair_sum=True)
    rounding = _rounding_args(s, t, table.fraction_bits, None)
    words = np.empty(buffer, dtype=np.uint64)
    state = np.zeros(3, dtype=np.int64)
    bits = np.zeros(1, dtype=np.uint64)
    scratch = np.zeros((3, _SCRATCH_WORDS), dtype=np.uint64)
    done = np.zeros(1, dtype=np.int64)
    column = 0
    while True:
        column = int(
            streamed_columns_kernel(
                streams, rows, words, state, bits, scratch, *_table_args(table), *rounding,
                True, out, np.int64(column), np.int64(saturation), done,
            )
        )  # fmt: skip
        if column == count:
            return
        stopped = _Stream.resumed(streams[column], words, state, bits, scratch, buffer)
        _draw_into(stopped, table, rounding, out[rows[column]], int(done[0]), True, saturation)
        column += 1


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
