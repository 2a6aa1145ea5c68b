"""The compiled kernel of the exact samplers of :mod:`service.mechanisms.exact_laplace`.

It draws ``X >= 0`` exactly, with only the binary digits a decision needs, and rounds it:
``|N| = floor((floor(2 t X) + s) / (2 s))`` and a uniform sign bit, for one of two laws of ``X``
(exact_laplace's docstring and docs/privacy.md have the whole argument):

- ``X = |L|``, L ~ Lap(1): Exp(1), survival ``exp(-x)`` (the rounded Laplace law);
- ``X = |L1 + L2|``, L1, L2 independent Lap(1) (the pair-sum law): density ``(1 + x) e^-x / 2``,
  survival ``exp(-x) (1 + x / 2)``.

For both, ``z = floor(2^m X)`` is read from one uniform against the law's table of thresholds
``T_i = P(X >= i / 2^m)`` (:mod:`service.mechanisms.exp_thresholds`), and the remainder ``y = 2^m
X - z`` is a uniform accepted with probability proportional to its density on the cell:
``e^(-y / 2^m)`` (a gate of m reservoir bits, else von Neumann's chain) and, for the pair sum,
also ``(2^m + z + y) / (2^m + z + 1)`` (:func:`ratio_gate` with :data:`LINEAR_BITS` bits of the
reservoir, then a uniform against ``y``). Past the table (``X >= J / 2^m``) the Laplace law is
memoryless; the pair sum's rest is, with probability ``2^(m+1) / (2^(m+1) + J)``, the pair-sum
law again, otherwise Exp(1) (drawn from the exponential table from there on).

Compiled without numba's reference counting (``_nrt=False``): the kernel allocates nothing. The
draw loop keeps its state (buffer position, bit reservoir) in local variables and reads the
state arrays only at entry and on return. The rare paths (a uniform's first word equal to a
threshold's, a remainder whose gate bits are all zero, a cell boundary of floor(2 t y) inside
y's first word, the pair sum's linear factor past its first bits, the tail) are in
:func:`draw_one` and the kernels of exact_words. All integer arithmetic on words is in uint64
(numba would turn a uint64/int64 mix into float64).
"""

from __future__ import annotations

import numpy as np

from service.mechanisms.exact_bernoulli import mul_high_low
from service.mechanisms.exact_words import (
    EXHAUSTED,
    OK,
    carry,
    jit,
    jit_inline,
    next_gate,
    threshold_tie,
    tie,
    von_neumann_chain,
)
from service.mechanisms.word_stream import fill_words

__all__ = [
    "LINEAR_BITS",
    "OVERFLOW",
    "draw_one",
    "ratio_gate",
    "rounded_laplace_kernel",
    "streamed_columns_kernel",
    "streamed_kernel",
]

#: Kernel status (state[2]) of an integer part past the guard; the others are exact_words'
#: (OK 0, EXHAUSTED 1, DEEP 3, DIGITS 4).
OVERFLOW = 2
#: Bits of the reservoir that lead the uniform of the pair-sum law's linear factor.
LINEAR_BITS = 16


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
    """|N| = floor((floor(2 t X) + s) / (2 s)) for X in the cell ``z`` of width 2^-m with
    ``floor(2 t y) = high``: floor(2 t X) = 2 t k + floor((2 t r + high) / 2^m), z = 2^m k + r
    (floor(2 t X) + s < 2^64 under the guard on k); a shift when 2s is a power of two."""
    one = np.uint64(1)
    total = (z >> m) * two_t + (((z & ((one << m) - one)) * two_t + high) >> m) + s
    if s_shift >= 0:
        return np.int64(total >> np.uint64(s_shift))
    return np.int64(total // (s + s))


@jit_inline
def _cell_magnitude(
    z: np.uint64, m: np.uint64, two_t: np.uint64, s: np.uint64, s_shift: np.int64
) -> np.int64:  # pragma: no cover
    """|N| when every X in the cell ``z`` gives the same one (floor(2 t y) takes the values
    0 .. 2t - 1 and |N| is monotone in it), else -1: y need not be drawn."""
    low_end = _magnitude(z, np.uint64(0), m, two_t, s, s_shift)
    high_end = _magnitude(z, two_t - np.uint64(1), m, two_t, s, s_shift)
    return low_end if low_end == high_end else np.int64(-1)


@jit_inline
def _linear_bound(m: np.uint64, a: np.int64) -> np.uint64:  # pragma: no cover
    """``D = 2^m + a + 1``: on the cell ``a`` of the pair sum, the remainder ``y`` is accepted
    with probability ``(D - 1 + y) / D`` (its density is proportional to ``(2^m + a + y)
    e^(-y / 2^m)``)."""
    return (np.uint64(1) << m) + np.uint64(a) + np.uint64(1)


#: (r < num / den, position, reservoir, bits left, status)
_GateResult = tuple[bool, np.int64, np.uint64, np.int64, np.int64]


@jit
def ratio_gate(
    words: np.ndarray, pos: np.int64, reservoir: np.uint64, left: np.int64, scratch: np.ndarray,
    num: np.uint64, den: np.uint64,
) -> _GateResult:  # fmt: skip  # pragma: no cover
    """Whether a fresh uniform ``r`` is below ``num / den`` (``0 < num < den < 2^47``): ``r``'s
    first :data:`LINEAR_BITS` bits ``h`` from the reservoir decide it unless ``h den < 2^k num
    < (h + 1) den`` (k = LINEAR_BITS), and then its further bits (fresh words, after the
    reservoir's) are compared with the rational ``(2^k num - h den) / den``
    (:func:`service.mechanisms.exact_words.carry`, which never reads ``scratch`` here)."""
    h, pos, reservoir, left, drawn = next_gate(words, pos, reservoir, left, np.uint64(LINEAR_BITS))
    if not drawn:
        return False, pos, reservoir, left, np.int64(EXHAUSTED)
    scaled = num << np.uint64(LINEAR_BITS)
    low = h * den
    if low >= scaled:
        return False, pos, reservoir, left, np.int64(OK)
    if low + den <= scaled:
        return True, pos, reservoir, left, np.int64(OK)
    rest = np.uint64(0) - (scaled - low)  # carry compares with (2^64 - rest) / den
    at_least, pos, status = carry(words, pos, scratch, np.int64(1), rest, den)
    return not at_least, pos, reservoir, left, status


#: (accepted, y's known words, position, status)
_BelowResult = tuple[bool, np.int64, np.int64, np.int64]


@jit_inline
def _uniform_below_y(
    words: np.ndarray, pos: np.int64, scratch: np.ndarray, y: np.uint64, y_depth: np.int64
) -> _BelowResult:  # pragma: no cover
    """Whether a fresh uniform ``u`` is below the remainder ``y`` (first word ``y``, further
    words in ``scratch[0]``, ``y_depth`` known), drawing further words of both on a tie."""
    if pos >= words.shape[0]:
        return False, y_depth, pos, np.int64(EXHAUSTED)
    u = words[pos]
    pos += 1
    if u != y:
        return u < y, y_depth, pos, np.int64(OK)
    less, _, y_depth, pos, status = tie(words, pos, scratch, np.int64(0), y_depth, np.int64(1))
    return less, y_depth, pos, status


#: (the signed draw, position, reservoir, bits left)
_SignedResult = tuple[np.int64, np.int64, np.uint64, np.int64]


@jit_inline
def _signed(
    words: np.ndarray, pos: np.int64, reservoir: np.uint64, left: np.int64, magnitude: np.int64
) -> _SignedResult:  # pragma: no cover
    """``magnitude`` signed by the reservoir's next bit (-magnitude when it is 1), a fresh word
    taken first when no bit is left (the caller has checked that ``words[pos]`` exists)."""
    if left == 0:
        reservoir = words[pos]
        pos += 1
        left = np.int64(64)
    negative = np.int64(reservoir & np.uint64(1))
    return (magnitude ^ -negative) + negative, pos, reservoir >> np.uint64(1), left - 1


#: (the signed draw, position, reservoir, bits left, status)
_DrawResult = tuple[np.int64, np.int64, np.uint64, np.int64, np.int64]


@jit
def draw_one(
    words: np.ndarray, pos: np.int64, reservoir: np.uint64, left: np.int64, scratch: np.ndarray,
    first: np.ndarray, deeper: np.ndarray, guide: np.ndarray, tail_first: np.ndarray,
    tail_deeper: np.ndarray, tail_guide: np.ndarray, m: np.uint64, guide_shift: np.uint64,
    s: np.uint64, t: np.uint64, s_shift: np.int64, coarse: bool, max_k: np.uint64,
    pair_sum: bool,
) -> _DrawResult:  # fmt: skip  # pragma: no cover
    """One draw from word ``pos`` (module docstring), every path: the tail of z, ties with a
    threshold's first word, the chain of a remainder whose gate is zero, the pair sum's linear
    factor, a cell boundary of floor(2 t y) inside y's first word. The kernel's fast path
    computes the same thing when none of them occurs. A status other than ``OK`` leaves the
    draw unfinished. ``tail_*``: the exponential table, for the pair sum past its table (the
    same arrays as ``first``, ``deeper``, ``guide`` for the Laplace law)."""
    n_words = words.shape[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    two_t = t + t
    room = zero - two_t  # 2^64 - 2t
    length = np.int64(first.shape[0] - 1)
    status = np.int64(OK)
    # z = floor(2^m X): the index of the uniform among the thresholds, plus J for each tail
    z = zero
    linear = pair_sum  # the current piece is the pair-sum law (else Exp(1), memoryless)
    a = np.int64(0)
    while True:
        if pos >= n_words:
            return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
        w = words[pos]
        pos += 1
        table_first = first if linear else tail_first
        if w < table_first[length]:  # U < T_J: X >= J / 2^m
            a = length
        else:
            a = _thresholds_above(w, guide if linear else tail_guide, guide_shift, table_first)
            if table_first[a + 1] == w:  # a + 1 <= J since w >= first[J]
                less, pos, status = threshold_tie(
                    words, pos, deeper if linear else tail_deeper, a + np.int64(1)
                )
                if status != OK:
                    return np.int64(0), pos, reservoir, left, status
                if less:
                    a += np.int64(1)
        z += np.uint64(a)
        if (z >> m) > max_k:
            return np.int64(0), pos, reservoir, left, np.int64(OVERFLOW)
        if a < length:
            break
        if linear:  # the pair sum's rest: itself again w.p. 2^(m+1) / (2^(m+1) + J), else Exp(1)
            twice = one << (m + one)
            linear, pos, reservoir, left, status = ratio_gate(
                words, pos, reservoir, left, scratch, twice, twice + np.uint64(length)
            )
            if status != OK:
                return np.int64(0), pos, reservoir, left, status
    magnitude = _cell_magnitude(z, m, two_t, s, s_shift) if coarse else np.int64(-1)
    if magnitude < 0:
        # the remainder y: a uniform accepted when its gate (m bits of the reservoir) is not all
        # zero or the chain accepts it, and for the pair sum by its linear factor too
        while True:
            if pos >= n_words:
                return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
            y = words[pos]
            pos += 1
            y_depth = np.int64(1)
            gate, pos, reservoir, left, drawn = next_gate(words, pos, reservoir, left, m)
            if not drawn:
                return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
            if gate == zero:
                accepted, y_depth, pos, reservoir, left, status = von_neumann_chain(
                    words, pos, scratch, y, reservoir, left, m
                )
                if status != OK:
                    return np.int64(0), pos, reservoir, left, status
                if not accepted:
                    continue
            if linear:  # accepted outright unless r < 1 / D; then exactly when u < y
                below, pos, reservoir, left, status = ratio_gate(
                    words, pos, reservoir, left, scratch, one, _linear_bound(m, a)
                )
                if status != OK:
                    return np.int64(0), pos, reservoir, left, status
                if below:
                    accepted, y_depth, pos, status = _uniform_below_y(
                        words, pos, scratch, y, y_depth
                    )
                    if status != OK:
                        return np.int64(0), pos, reservoir, left, status
                    if not accepted:
                        continue
            break
        high, low = mul_high_low(two_t, y)
        if low > room:
            up, pos, status = carry(words, pos, scratch, y_depth, low, two_t)
            if status != OK:
                return np.int64(0), pos, reservoir, left, status
            if up:
                high += one
        magnitude = _magnitude(z, high, m, two_t, s, s_shift)
    if left == 0 and pos >= n_words:
        return np.int64(0), pos, reservoir, left, np.int64(EXHAUSTED)
    value, pos, reservoir, left = _signed(words, pos, reservoir, left, magnitude)
    return value, pos, reservoir, left, np.int64(OK)


@jit
def rounded_laplace_kernel(
    words: np.ndarray, state: np.ndarray, bits: np.ndarray, scratch: np.ndarray,
    first: np.ndarray, deeper: np.ndarray, guide: np.ndarray, tail_first: np.ndarray,
    tail_deeper: np.ndarray, tail_guide: np.ndarray, m: np.uint64, guide_shift: np.uint64,
    s: np.uint64, t: np.uint64, s_shift: np.int64, coarse: bool, max_k: np.uint64,
    pair_sum: bool, out: np.ndarray, start: np.int64,
) -> np.int64:  # fmt: skip  # pragma: no cover
    """Fill ``out[start:]``; returns the index of the first draw not made (``out.shape[0]``
    when done). state = (next word, bits left in the reservoir ``bits[0]``, status). On
    running out of words, of scratch or of threshold words the state is rewound to that
    draw's first word. ``s_shift``: log2(2s) when 2s is a power of two, else -1; ``coarse``:
    try to decide |N| from z alone (gamma > 2^-m); ``pair_sum``: the law of ``|L1 + L2|``
    (``first``, ``deeper``, ``guide`` its table, ``tail_*`` the exponential one).

    The usual draw (no tail, no tie, a guide cell with at most two candidates, a nonzero
    gate, for the pair sum a linear factor decided by its first bits, no cell boundary inside
    y's first word, four words left in the buffer) is computed here without a call; any other
    draw is computed again from its first word by :func:`draw_one`, which reads the same words
    the same way."""
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
    linear_bits = np.uint64(LINEAR_BITS)
    outright = one << linear_bits  # r >= 1 / D exactly when (its first bits) * D >= 2^k
    while i < count:
        if fine and pos + 4 <= n_words:
            # gamma <= 2^-m: U and y, the gate, the linear bits, the sign, read without a branch
            # on them
            w = words[pos]
            y = words[pos + 1]
            p = pos + 2
            a = _thresholds_above(w, guide, guide_shift, first)
            gate, p, res, bits_left, _ = next_gate(words, p, reservoir, left, m)
            usual = gate != zero
            if pair_sum:
                h, p, res, bits_left, _ = next_gate(words, p, res, bits_left, linear_bits)
                usual &= h * _linear_bound(m, a) >= outright
            if bits_left == 0:  # the sign's word, read before the branch on the draw
                res = words[p]
                p += 1
                bits_left = np.int64(64)
            z = np.uint64(a)
            high, low = mul_high_low(two_t, y)
            magnitude = _magnitude(z, high, m, two_t, s, s_shift)
            # not the usual draw: U < T_J, a tie with a threshold, a zero gate, a boundary
            usual &= (w >= edge) & (first[min(a + np.int64(1), length)] != w) & (low <= room)
            if usual:
                value, pos, reservoir, left = _signed(words, p, res, bits_left, magnitude)
                out[i] = value
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
                    if pair_sum:
                        h, p, res, bits_left, _ = next_gate(words, p, res, bits_left, linear_bits)
                        usual &= h * _linear_bound(m, a) >= outright
                    magnitude = _magnitude(z, high, m, two_t, s, s_shift)
                if usual:
                    value, pos, reservoir, left = _signed(words, p, res, bits_left, magnitude)
                    out[i] = value
                    i += 1
                    continue
        value, next_pos, next_reservoir, next_left, status = draw_one(
            words, pos, reservoir, left, scratch, first, deeper, guide, tail_first, tail_deeper,
            tail_guide, m, guide_shift, s, t, s_shift, coarse, max_k, pair_sum,
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


@jit
def streamed_kernel(
    stream: np.ndarray, words: np.ndarray, state: np.ndarray, bits: np.ndarray,
    scratch: np.ndarray, first: np.ndarray, deeper: np.ndarray, guide: np.ndarray,
    tail_first: np.ndarray, tail_deeper: np.ndarray, tail_guide: np.ndarray, m: np.uint64,
    guide_shift: np.uint64, s: np.uint64, t: np.uint64, s_shift: np.int64, coarse: bool,
    max_k: np.uint64, pair_sum: bool, out: np.ndarray, start: np.int64, saturation: np.int64,
) -> np.int64:  # fmt: skip  # pragma: no cover
    """:func:`rounded_laplace_kernel` over an SFC64 stream (:mod:`service.mechanisms.word_stream`)
    instead of a buffer that the caller refills: ``words[state[0]:]`` are the stream's next
    unread words, and when a draw runs out of them the unread ones move to the front and the
    rest of ``words`` is filled from ``stream``, here, so the words read are the stream's in
    order, each once. Each draw made is clamped to ``[-saturation, saturation]``. Returns the
    index of the first draw not made; ``state[2]`` says why it stopped: ``OK`` (done), the
    kernel's ``DEEP``, ``DIGITS`` or ``OVERFLOW``, or ``EXHAUSTED`` when one draw needs more
    words than ``words`` holds (the caller gives it a larger buffer). Either way the state is
    at that draw's first word, as the kernel leaves it."""
    i = start
    n_words = words.shape[0]
    while True:
        done = rounded_laplace_kernel(
            words, state, bits, scratch, first, deeper, guide, tail_first, tail_deeper,
            tail_guide, m, guide_shift, s, t, s_shift, coarse, max_k, pair_sum, out, i,
        )  # fmt: skip
        for j in range(i, done):
            out[j] = min(max(out[j], -saturation), saturation)
        i = done
        first_unread = state[0]
        if state[2] != EXHAUSTED or first_unread == 0:
            return i
        kept = n_words - first_unread
        for j in range(kept):
            words[j] = words[first_unread + j]
        fill_words(stream, words, np.int64(kept))
        state[0] = 0
        state[2] = OK


@jit
def streamed_columns_kernel(
    streams: np.ndarray, rows: np.ndarray, words: np.ndarray, state: np.ndarray,
    bits: np.ndarray, scratch: np.ndarray, first: np.ndarray, deeper: np.ndarray,
    guide: np.ndarray, tail_first: np.ndarray, tail_deeper: np.ndarray, tail_guide: np.ndarray,
    m: np.uint64, guide_shift: np.uint64, s: np.uint64, t: np.uint64, s_shift: np.int64,
    coarse: bool, max_k: np.uint64, pair_sum: bool, out: np.ndarray, column: np.int64,
    saturation: np.int64, done: np.ndarray,
) -> np.int64:  # fmt: skip  # pragma: no cover
    """:func:`streamed_kernel` for several columns in one call: from ``column`` on, row
    ``rows[c]`` of ``out`` gets its draws from the stream ``streams[c]``, each column as one
    call of :func:`streamed_kernel` on a fresh buffer makes them (``words`` filled from that
    column's stream, the state and reservoir at zero, the scratch cleared), so the draws and
    the words each stream moves past are the same. Returns the first column not finished:
    ``streams.shape[0]`` when all are; otherwise the kernel stopped in that column (``state[2]``
    says why, as :func:`streamed_kernel` leaves it), ``done[0]`` draws of it made, and its
    buffer, state, reservoir and scratch are left for the caller to finish it."""
    one_column = out.shape[1]
    for c in range(column, streams.shape[0]):
        stream = streams[c]
        row = out[rows[c]]
        fill_words(stream, words, np.int64(0))
        state[0] = 0
        state[1] = 0
        state[2] = OK
        bits[0] = np.uint64(0)
        scratch[:] = np.uint64(0)
        made = streamed_kernel(
            stream, words, state, bits, scratch, first, deeper, guide, tail_first, tail_deeper,
            tail_guide, m, guide_shift, s, t, s_shift, coarse, max_k, pair_sum, row,
            np.int64(0), saturation,
        )  # fmt: skip
        if made != one_column:
            done[0] = made
            return np.int64(c)
    return np.int64(streams.shape[0])
