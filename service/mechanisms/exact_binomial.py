"""Binomial(u, 1/2) exactly, in time that grows like sqrt(u) rather than u.

:func:`binomial_half` draws the number of ones among u fair bits. For small u it counts them
(the popcount of u fresh raw bits, ``u / 64`` words); above :data:`POPCOUNT_LIMIT` it samples
the law by rejection, with O(sqrt u) float work an attempt and about 3.2 attempts
(docs/privacy.md, "The exact Binomial(u, 1/2) sampler").

The rejection. Odd u is Binomial(u - 1, 1/2) plus one fair bit. For u = 2M the offset
``d = k - M`` has weights ``r(d) = C(2M, M + d) / C(2M, M) = prod_{j=1}^{|d|} (M - j + 1) /
(M + j)`` on ``|d| <= M``, and ``r(d) <= exp(-d^2 / (M + |d|)) <= exp(-d^2 / (2M))``. With the
step ``s = ceil(sqrt(2M))`` the staircase ``g(d) = 2^-J``, ``J = floor(d / s)`` for ``d >= 0``
and ``J = floor((-d - 1) / s)`` for ``d < 0``, dominates r (level 0: r <= 1; level J >= 1:
``d^2 / (2M) >= J^2 s^2 / (2M) >= J^2 >= J ln 2``). An attempt draws a fair sign bit, the level
J (the number of ones before the first zero of fair bits: P(J) = 2^-(J + 1)), an offset ``o``
uniform in ``[0, s)`` (a raw word at or above ``2^64 mod s``, mod s) and so
``d = J s + o`` or ``d = -(J s + o) - 1``, each d with probability ``g(d) / (4 s)``; it rejects
``|d| > M`` and accepts with probability ``r(d) 2^J <= 1``, so an accepted d has probability
proportional to ``r(d)``, the law of ``k - M``. The acceptance rate is
``4^M / (C(2M, M) 4 s) -> sqrt(pi / 2) / 4 = 0.313``.

The acceptance is exact. It compares a uniform ``U = 0.w1 w2 ...`` (raw words) with
``A = r(d) 2^J``. The kernel computes ``r`` as a float product of the factors, each an exact
quotient of integers below 2^50 rounded once and multiplied in with one more rounding, so the
computed partial product of i factors is within a factor ``(1 +- 2^-53)^(2i)`` of the true one;
it rejects once ``partial (1 + eta_i) < w1 2^-(64 + J)`` (the factors are below 1: r is at
most every partial product) and accepts at the end if ``product (1 - eta) >= (w1 + 1)
2^-(64 + J)``, with ``eta_i = (2 i + 8) 2^-52``, which covers those roundings and the three of
the comparison. Anything else (and ``w1 = 0``, ``J > 900``, where a float could underflow) is
decided by :func:`exact_accept` with Python integers: ``A = perm(M, a) 2^J / perm(M + a, a)``,
``a = |d|``, against U extended by further words until they settle it. No float enters the law.

The words are the caller's generator's raw words (a fresh OS-entropy generator per request in
the service), read in order as one stream: the draw is a function of the stream, so when the
buffer runs out the attempt is taken again from its first word with more words appended.
"""

from __future__ import annotations

import math

import numpy as np

from service.mechanisms.exact_words import jit

__all__ = [
    "POPCOUNT_LIMIT",
    "acceptance_rate",
    "binomial_half",
    "binomial_half_popcount",
    "binomial_half_rejection",
    "envelope_level",
    "exact_accept",
    "ratio",
    "settle_slack",
    "step_width",
]

#: Up to this u, :func:`binomial_half` counts u raw bits; above it, the rejection sampler
#: (benchmarks/exact_binomial_speed.py: the two cost the same, about 4 us, near u = 2^12 to
#: 2^13; at 2^14 the rejection sampler is 1.2x faster, at 2^16 1.9x).
POPCOUNT_LIMIT = 1 << 14
#: Levels above this go to the exact path (2^-(64 + J) stays a normal float below it).
MAX_FLOAT_LEVEL = 900
#: u must stay below this: the factors' integers are then exact in float64.
MAX_TRIALS = 1 << 50
#: Raw words drawn at a time for the rejection sampler (an attempt reads about three).
BUFFER_WORDS = 32

# kernel statuses
ACCEPTED = 0
EXHAUSTED = 1
UNSETTLED = 2

#: eta_i = (2 i + ETA_MARGIN) 2^-52: the float acceptance test's relative error bound
#: (module docstring); the tests replace :func:`settle_slack` to force the exact path.
ETA_MARGIN = 8


def settle_slack() -> float:
    """How much wider than proven the float test's error bound is (1: as proven; the tests
    make it infinite to send every attempt to :func:`exact_accept`)."""
    return 1.0


def step_width(m: int) -> int:
    """The envelope's step ``s = ceil(sqrt(2 m))`` for u = 2m."""
    return math.isqrt(2 * m - 1) + 1


def ratio(m: int, d: int) -> tuple[int, int]:
    """``r(d) = C(2m, m + d) / C(2m, m)`` as (numerator, denominator), |d| <= m."""
    a = abs(d)
    return math.perm(m, a), math.perm(m + a, a)


def envelope_level(m: int, d: int) -> int:
    """The envelope's level J at d: ``g(d) = 2^-J``, and an attempt proposes d with
    probability ``2^-J / (4 s)``."""
    s = step_width(m)
    return d // s if d >= 0 else (-d - 1) // s


def acceptance_rate(m: int) -> float:
    """An attempt's probability of acceptance for u = 2m: ``4^m / C(2m, m) / (4 s)``."""
    log_mass = 2 * m * math.log(2) - (math.lgamma(2 * m + 1) - 2 * math.lgamma(m + 1))
    return math.exp(log_mass) / (4 * step_width(m))


@jit
def _attempts(
    words: np.ndarray, pos: int, m: int, s: int, skip: np.uint64, slack: float
) -> tuple[int, int, int, int, int]:  # pragma: no cover - compiled
    """Attempts from ``words[pos:]`` until one is accepted or cannot be settled in floats.
    Returns (status, position after the words read, d, level J, the attempt's first word):
    ``ACCEPTED`` with d; ``UNSETTLED`` with d, J and the position after U's first word
    (``words[pos - 1]``); ``EXHAUSTED`` with the attempt's first word as the position."""
    n = words.shape[0]
    one = np.uint64(1)
    unit = 2.0**-52
    while True:
        start = pos
        if pos >= n:
            return EXHAUSTED, start, 0, 0, start
        w = words[pos]
        pos += 1
        negative = (w & one) == one
        w = w >> one
        left = 63
        level = 0
        exhausted = False
        while (w & one) == one:  # J: the ones before the first zero
            level += 1
            w = w >> one
            left -= 1
            if left == 0:
                if pos >= n:
                    exhausted = True
                    break
                w = words[pos]
                pos += 1
                left = 64
        if exhausted:
            return EXHAUSTED, start, 0, 0, start
        while True:  # the offset: a word at or above 2^64 mod s, mod s
            if pos >= n:
                return EXHAUSTED, start, 0, 0, start
            w = words[pos]
            pos += 1
            if w >= skip:
                break
        offset = int(w % np.uint64(s))
        if level > m // s:  # |d| >= J s > m
            continue
        a = level * s + offset
        if negative:
            a += 1
        if a > m:
            continue
        d = -a if negative else a
        if pos >= n:
            return EXHAUSTED, start, 0, 0, start
        uw = words[pos]
        pos += 1
        if uw == np.uint64(0) or level > MAX_FLOAT_LEVEL:
            return UNSETTLED, pos, d, level, start
        scale = math.ldexp(1.0, -64 - level)
        low = float(uw) * scale  # U >= w1 2^-64, over 2^J
        product = 1.0
        mf = float(m)
        rejected = False
        for j in range(1, a + 1):
            product *= (mf - j + 1.0) / (mf + j)
            if product * (1.0 + (2 * j + ETA_MARGIN) * unit * slack) < low:
                rejected = True
                break
        if rejected:
            continue
        high = (float(uw) + 1.0) * scale  # U < (w1 + 1) 2^-64, over 2^J
        if product * (1.0 - (2 * a + ETA_MARGIN) * unit * slack) >= high:
            return ACCEPTED, pos, d, level, start
        return UNSETTLED, pos, d, level, start


def exact_accept(
    rng: np.random.Generator, words: np.ndarray, pos: int, m: int, d: int, level: int
) -> tuple[bool, np.ndarray, int]:
    """Whether ``U < r(d) 2^level``, U's first word being ``words[pos - 1]`` and its further
    words the next ones of the stream (drawn into ``words`` when needed), with integers.
    Returns (accepted, the words, the position after U's last word read)."""
    num, den = ratio(m, d)
    num <<= level
    top = int(words[pos - 1])
    bits = 64
    while True:  # U in [top / 2^bits, (top + 1) / 2^bits)
        if (top + 1) * den <= num << bits:
            return True, words, pos
        if top * den >= num << bits:
            return False, words, pos
        if pos >= words.shape[0]:
            words = np.concatenate([words, rng.bit_generator.random_raw(BUFFER_WORDS)])
        top = (top << 64) | int(words[pos])
        bits += 64
        pos += 1


def binomial_half_rejection(rng: np.random.Generator, u: int) -> int:
    """Binomial(u, 1/2) by rejection from the staircase envelope (module docstring), any
    1 <= u < 2^50."""
    if not 0 < u < MAX_TRIALS:
        raise ValueError(f"the rejection sampler takes 1 <= u < 2^50, not {u}")
    words = rng.bit_generator.random_raw(BUFFER_WORDS)
    pos = 0
    extra = 0
    if u % 2:
        extra = int(words[0] & np.uint64(1))
        pos = 1
    m = u // 2
    if m == 0:
        return extra
    s = step_width(m)
    skip = np.uint64((1 << 64) % s)
    slack = settle_slack()
    while True:
        status, after, d, level, start = _attempts(words, pos, m, s, skip, slack)
        if status == EXHAUSTED:
            words = np.concatenate([words, rng.bit_generator.random_raw(BUFFER_WORDS)])
            pos = int(start)
            continue
        pos = int(after)
        if status == UNSETTLED:
            accepted, words, pos = exact_accept(rng, words, pos, m, int(d), int(level))
            if not accepted:
                continue
        return m + int(d) + extra


def binomial_half_popcount(rng: np.random.Generator, u: int) -> int:
    """Binomial(u, 1/2): the number of ones among u fresh raw bits (u / 64 words)."""
    words = rng.bit_generator.random_raw((u + 63) // 64)
    spare = (-u) % 64
    if spare:
        words[-1] &= np.uint64((1 << (64 - spare)) - 1)
    return int(np.bitwise_count(words).sum())


def binomial_half(rng: np.random.Generator, u: int) -> int:
    """Binomial(u, 1/2) exactly: the popcount up to :data:`POPCOUNT_LIMIT`, rejection above."""
    if u <= POPCOUNT_LIMIT:
        return binomial_half_popcount(rng, u)
    return binomial_half_rejection(rng, u)
