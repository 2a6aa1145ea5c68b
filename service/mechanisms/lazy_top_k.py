"""The top of m i.i.d. rounded-Laplace draws, sampled exactly without drawing the other ones.

A count ranking adds ``g N_v`` (``N_v = round(L_v / gamma)``, the exact sampler of
:mod:`service.mechanisms.exact_laplace`) to every node's count, nearly all of them 0. Those m
zero-count nodes ("lazy" nodes) all have the same public baseline, so what they contribute to a
top-k ranked with ties by index is only: which of them have the largest levels ``N_v``, those
levels, and (for ``friends_of_friends``' shift) the smallest level. :func:`lazy_top` samples
exactly those, from the exact joint law of "draw all m, sort", in time that grows with m only
through the binomial counts' Binomial(u, 1/2) draws, O(sqrt m) float work each (no longer
``2 m / 64`` raw words; docs/privacy.md, "The lazy top-k").

The law. Write ``S(j) = P(N >= j)``: ``S(j) = h^(2j - 1) / 2`` for ``j >= 1`` and
``S(j) = 1 - h^(1 - 2j) / 2`` for ``j <= 0``, with ``h = exp(-gamma / 2)`` (``|N| >= j`` iff
``|L| >= (j - 1/2) gamma``, and the sign is an independent fair bit). Levels are integers; a
range ``[a, b)`` may have ``a = -inf`` or ``b = +inf`` (None).

The descent. Start with the R = m nodes, i.i.d. ``N | lower <= N < T`` with ``T = +inf``.
Choose ``T' < T`` (any function of what was drawn so far: the choice only affects the cost).
The number of the R nodes in ``[T', T)`` is ``Binomial(R, p)`` with
``p = (S(T') - S(T)) / (S(lower) - S(T))``; which nodes they are is a uniform subset of the R;
their levels are i.i.d. ``N | T' <= N < T``; and the other ones are, given all that, i.i.d.
``N | lower <= N < T'``. Repeat with ``T = T'`` until at least ``need`` nodes are drawn (or a
``floor`` level is reached, below which the ranking cannot tell the levels apart). Every node
not drawn is then below every drawn one.

Exactness. ``Binomial(R, p)`` is the number of R uniforms below ``p``, found digit by digit:
the uniforms whose first i - 1 binary digits equal p's are undecided; their i-th digits are
``Binomial(u, 1/2)`` ones (:mod:`service.mechanisms.exact_binomial`: the popcount of u fresh
raw bits for small u, an exact rejection sampler with O(sqrt u) float work above); those with
digit 0 where p has a 1 are below p, those with digit 1 where p has a 0 are above it, and the
rest stay undecided. p's
digits are computed with rigorous interval arithmetic on integers (``exp(-x)`` for rational x
by its alternating Taylor series, which brackets it, then squarings rounded outwards), with more
precision whenever an interval does not settle a digit (p is irrational: a non-constant rational
function of the transcendental h). A level given ``[a, b)`` with ``a >= 1`` is
``a + ((|N| - 1) mod (b - a))`` with N drawn given ``N != 0`` (``|N| - 1`` given ``|N| >= 1`` is
geometric with ratio ``exp(-gamma)``, memorylessness of the exponential; a geometric reduced
mod L is the geometric truncated to ``[0, L)``); with ``b <= 0`` the mirror image; a range
across 0 is drawn by rejection from N itself. The nodes are the first distinct values of a
stream of exactly uniform integers (64-bit words below the largest multiple of R, mod R): a
uniformly random sequence of distinct nodes, split into the ranges' blocks in drawing order.
No floating-point value enters the law: floats only choose the thresholds.

The randomness is the caller's generator (a fresh OS-entropy one in the service).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from service.mechanisms.exact_bernoulli import exp_neg_bounds
from service.mechanisms.exact_binomial import binomial_half
from service.mechanisms.exact_laplace import rounded_laplace
from service.mechanisms.ranking_kernels import first_distinct, geometric_levels

__all__ = [
    "LazyTop",
    "LevelLaw",
    "binomial_count",
    "distinct_uniform",
    "exp_neg_bounds",
    "lazy_rank_to_index",
    "lazy_top",
    "range_levels",
    "range_probability_bits",
]

#: Bits of the first interval computation of a probability (doubled when a digit is unsettled).
START_PRECISION = 128
#: Beyond this precision a digit still unsettled is an error (p would be rational: never).
MAX_PRECISION = 1 << 14


@dataclass(frozen=True)
class LevelLaw:
    """N = round(L / gamma), L ~ Lap(1), gamma = s / t."""

    s: int
    t: int

    def tail_estimate(self, j: int | None) -> float:
        """A float estimate of S(j) = P(N >= j), 0 for None (+inf): it chooses thresholds and
        sizes batches, never the law."""
        if j is None:
            return 0.0
        gamma = self.s / self.t
        if j >= 1:
            return 0.5 * math.exp(-gamma * (j - 0.5))
        return 1.0 - 0.5 * math.exp(-gamma * (0.5 - j))

    def level_estimate(self, v: float) -> int:
        """A level j with S(j) about ``v`` (the inverse of :meth:`tail_estimate`, ``v`` held in
        [1e-300, 1 - 1e-16]; for thresholds only)."""
        gamma = self.s / self.t
        v = min(max(v, 1e-300), 1.0 - 1e-16)
        if v <= 0.5:
            return math.floor(0.5 + math.log(1.0 / (2.0 * v)) / gamma)
        return math.floor(0.5 - math.log(1.0 / (2.0 * (1.0 - v))) / gamma)

    def tail(self, j: int | None, precision: int, *, lower: bool) -> tuple[int, int]:
        """S(j) = P(N >= j) as (lo, hi) over 2^precision; j None is -inf (``lower``: 1) or
        +inf (0)."""
        one = 1 << precision
        if j is None:
            return (one, one) if lower else (0, 0)
        if j >= 1:  # h^(2j - 1) / 2 = exp(-(2j - 1) gamma / 2) / 2
            lo, hi = exp_neg_bounds(Fraction((2 * j - 1) * self.s, 2 * self.t), precision)
            return lo >> 1, (hi + 1) >> 1
        lo, hi = exp_neg_bounds(Fraction((1 - 2 * j) * self.s, 2 * self.t), precision)
        return one - ((hi + 1) >> 1), one - (lo >> 1)


#: Intervals of range probabilities kept per process (a service's queries at one epsilon ask
#: for the same few ranges: on 1M nodes 498 of 548 lowerings asked for one).
INTERVALS_KEPT = 1024


@functools.lru_cache(maxsize=INTERVALS_KEPT)
def _probability_interval(
    law: LevelLaw, ends: tuple[int | None, int | None, int | None, int | None], precision: int
) -> tuple[int, int, int]:
    """``(precision', lo, hi)``: ``lo / 2^precision' <= p <= hi / 2^precision'`` for ``p =
    P(a2 <= N < b2) / P(a <= N < b)`` (``ends = (a, b, a2, b2)``), precision' >= ``precision``
    (doubled while the denominator's interval reaches 0). A function of its arguments only:
    kept, so that a range asked for again costs no big-integer arithmetic."""
    a, b, a2, b2 = ends
    while True:
        if precision > MAX_PRECISION:  # pragma: no cover - p is irrational
            raise RuntimeError("a probability's digits did not settle")
        s_a = law.tail(a, precision, lower=True)
        s_b = law.tail(b, precision, lower=False)
        s_a2 = law.tail(a2, precision, lower=True)
        s_b2 = law.tail(b2, precision, lower=False)
        num_lo, num_hi = max(0, s_a2[0] - s_b2[1]), s_a2[1] - s_b2[0]
        den_lo, den_hi = s_a[0] - s_b[1], s_a[1] - s_b[0]
        if den_lo > 0:
            break
        precision *= 2  # pragma: no cover - a range of tiny probability
    one = 1 << precision
    lo = min(one, (num_lo << precision) // den_hi)
    hi = min(one, -((-(num_hi << precision)) // den_lo))
    return precision, lo, hi


class range_probability_bits:  # noqa: N801 - used like a function returning digits
    """The binary digits of ``p = P(a2 <= N < b2) / P(a <= N < b)`` (``[a2, b2)`` inside
    ``[a, b)``, None for an infinite end), computed exactly, on demand."""

    def __init__(
        self, law: LevelLaw, a: int | None, b: int | None, a2: int | None, b2: int | None
    ) -> None:
        self.law = law
        self.ends = (a, b, a2, b2)
        self._compute(START_PRECISION)

    def _compute(self, precision: int) -> None:
        self.precision, self.lo, self.hi = _probability_interval(self.law, self.ends, precision)

    def bit(self, i: int) -> int:
        """Digit i >= 1 of p (p = 0.d1 d2 d3 ... in binary)."""
        while True:
            shift = self.precision - i
            if shift >= 8:
                lo, hi = self.lo >> shift, self.hi >> shift
                if lo == hi:
                    return lo & 1
            self._compute(2 * self.precision)


def binomial_count(rng: np.random.Generator, trials: int, digits: range_probability_bits) -> int:
    """Binomial(``trials``, p) exactly: how many of ``trials`` uniforms are below p, decided
    digit by digit (module docstring)."""
    below = 0
    undecided = trials
    i = 0
    while undecided:
        i += 1
        ones = binomial_half(rng, undecided)
        if digits.bit(i):
            below += undecided - ones
            undecided = ones
        else:
            undecided -= ones
    return below


#: The most draws one batch of :func:`range_levels` asks for beyond twice what it lacks (a
#: range of small probability takes several batches instead of one huge one).
LEVEL_BATCH_LIMIT = 1 << 16


def _acceptance(law: LevelLaw, a: int | None, b: int | None, one_sided: bool) -> float:
    """A float estimate of the share of draws of N that :func:`range_levels` keeps: P(N != 0)
    for a range on one side of 0, else P(a <= N < b) (sizes batches only, never the law)."""
    if one_sided:
        return math.exp(-law.s / law.t / 2.0)
    return (1.0 if a is None else law.tail_estimate(a)) - law.tail_estimate(b)


def _batch_for(missing: int, accepted: float) -> int:
    """Draws for one batch that yields ``missing`` kept ones with high probability when a draw
    is kept with probability about ``accepted`` (the mean, three standard deviations and 16
    more; at most ``LEVEL_BATCH_LIMIT`` beyond twice ``missing``: a later batch draws the
    rest). Any batch size gives the same law: the draws are i.i.d. and the first ``count``
    kept ones are taken."""
    mean = missing / max(accepted, 1e-12)
    wanted = math.ceil(mean + 3.0 * math.sqrt(mean)) + 16
    return int(min(wanted, max(16, 2 * missing) + LEVEL_BATCH_LIMIT))


def range_levels(
    rng: np.random.Generator, law: LevelLaw, count: int, a: int | None, b: int | None
) -> np.ndarray:
    """``count`` i.i.d. draws of N given ``a <= N < b`` (None: an infinite end), int64."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    if a is not None and b is not None and b - a == 1:
        return np.full(count, a, dtype=np.int64)
    one_sided = (a is not None and a >= 1) or (b is not None and b <= 0)
    accepted = _acceptance(law, a, b, one_sided)
    parts: list[np.ndarray] = []
    have = 0
    while have < count:
        batch = _batch_for(count - have, accepted)
        z = rounded_laplace(rng, law.s, law.t, batch)
        if one_sided:  # |N| - 1 is geometric
            x = geometric_levels(z, a, b)
        else:  # across 0: rejection from N itself
            keep = np.ones(z.shape[0], dtype=bool)
            if a is not None:
                keep &= z >= a
            if b is not None:
                keep &= z < b
            x = z[keep]
        parts.append(x.astype(np.int64))
        have += x.shape[0]
    return np.concatenate(parts)[:count]


def distinct_uniform(rng: np.random.Generator, m: int, count: int) -> np.ndarray:
    """The first ``count`` distinct values of a stream of i.i.d. uniform integers in [0, m),
    in stream order: a uniformly random sequence of ``count`` distinct values (int64)."""
    if count > m:
        raise ValueError(f"cannot draw {count} distinct values below {m}")
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    limit = (1 << 64) - ((1 << 64) % m)  # accept words below the largest multiple of m
    stream = np.zeros(0, dtype=np.int64)
    while True:
        words = rng.bit_generator.random_raw(count + count // 4 + 16)
        if limit < 1 << 64:
            words = words[words < np.uint64(limit)]
        stream = np.concatenate([stream, (words % np.uint64(m)).astype(np.int64)])
        distinct = first_distinct(stream, count)
        if distinct.shape[0] == count:
            return distinct


def lazy_rank_to_index(excluded: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The node index of each lazy rank: the ``ranks``-th (0-based) index of [0, n) not in the
    sorted, distinct ``excluded``."""
    excluded = np.asarray(excluded, dtype=np.int64)
    below = excluded - np.arange(excluded.shape[0], dtype=np.int64)  # lazy nodes below each
    ranks = np.asarray(ranks, dtype=np.int64)
    return ranks + np.searchsorted(below, ranks, side="right")


def _next_threshold(
    law: LevelLaw, top: int | None, lower: int | None, remaining: int, wanted: int
) -> int | None:
    """A threshold below ``top`` whose range holds about ``wanted`` of the ``remaining``
    nodes, by float estimates (the choice only affects the cost, never the law); None: take
    them all (the threshold -inf)."""
    base_top = law.tail_estimate(top)
    base_low = 1.0 if lower is None else law.tail_estimate(lower)
    v = base_top + min(1.0, wanted / max(remaining, 1)) * (base_low - base_top)
    if wanted >= remaining or v >= 1.0 - 1e-9:
        return None
    guess = law.level_estimate(v)
    if top is not None:
        if top >= 2:
            guess = max(1, min(guess, top - 1))
        elif top == 1:
            guess = 0
        else:
            guess = min(guess, top - 1)
    if lower is not None:
        guess = max(guess, lower)
    return guess


@dataclass(frozen=True)
class LazyTop:
    """What the lazy nodes contribute: ``ranks`` (lazy ranks, a uniformly random sequence of
    distinct ones) and their ``levels``, every lazy node not listed being below ``threshold``
    (and at or above ``lower``); ``floored``: the descent stopped at the floor level before
    ``need`` nodes, so the unlisted ones are all below the floor; ``minimum``: the smallest
    level of all m nodes (None unless asked for, or m = 0)."""

    ranks: np.ndarray
    levels: np.ndarray
    threshold: int | None
    floored: bool
    minimum: int | None = None


def _descend(
    rng: np.random.Generator,
    law: LevelLaw,
    m: int,
    need: int,
    lower: int | None,
    floor: int | None,
) -> tuple[list[np.ndarray], int | None, bool]:
    """The levels of the top of m i.i.d. N | N >= lower, by ranges from the top, until at
    least min(need, m) are drawn or the threshold reaches ``floor``."""
    need = min(need, m)
    top: int | None = None
    drawn: list[np.ndarray] = []
    have = 0
    while have < need:
        if floor is not None and top is not None and top <= floor:
            return drawn, top, True
        remaining = m - have
        deficit = need - have
        wanted = deficit + 2.0 * math.sqrt(deficit) + 4.0
        below = _next_threshold(law, top, lower, remaining, math.ceil(wanted))
        if below is None or (lower is not None and below <= lower):
            below = lower
            count = remaining  # the whole rest of the range
        else:
            count = binomial_count(
                rng, remaining, range_probability_bits(law, lower, top, below, top)
            )
        drawn.append(range_levels(rng, law, count, below, top))
        have += count
        if below is None:  # pragma: no cover - the loop ends: every node is drawn
            break
        top = below
    return drawn, top, False


def lazy_top(
    rng: np.random.Generator,
    s: int,
    t: int,
    m: int,
    need: int,
    *,
    floor: int | None = None,
    minimum: bool = False,
) -> LazyTop:
    """The top ``need`` (at least; ties kept whole) of m i.i.d. levels N = round(L / gamma),
    gamma = s / t, as an exact sample of the joint law of the full draw's order statistics
    (module docstring).

    ``floor``: stop descending once the threshold is at or below it (levels below ``floor``
    are indistinguishable to the caller: the clipped ranking). ``minimum``: also draw the
    smallest of the m levels (by the same descent on -N over the nodes left below the
    threshold)."""
    law = LevelLaw(int(s), int(t))
    if m <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return LazyTop(empty, empty, None, False, None)
    drawn, threshold, floored = _descend(rng, law, m, max(need, 1 if minimum else 0), None, floor)
    levels = np.concatenate(drawn) if drawn else np.zeros(0, dtype=np.int64)
    ranks = distinct_uniform(rng, m, levels.shape[0])
    smallest: int | None = None
    if minimum:
        rest = m - levels.shape[0]
        if rest == 0:
            smallest = int(levels.min())
        else:  # the rest are i.i.d. N | N < threshold: their minimum is -max of -N | -N >= 1 - T
            assert threshold is not None and not floored
            mirrored, _, _ = _descend(rng, law, rest, 1, 1 - threshold, None)
            smallest = -int(np.concatenate(mirrored).max())
    return LazyTop(ranks, levels, threshold, floored, smallest)
