"""``blended``'s ranked top, drawn lazily: exactly the law of :func:`service.mechanisms.blended.
blend` on the full draw followed by the served ranking, without drawing every node's count.

The nodes. Explicit: the seed, its friends, and the candidates with a common neighbour (their
counts drawn as the full draw draws them). Lazy, the set Z of the others: count 0 and the
candidates' noise scale, so their levels ``N_v`` are i.i.d. with the rounded Laplace law and
their released counts are ``g N_v``. A blend scores v in Z as ``a g N_v + b z_v`` (a, b >= 0),
``z_v`` the public standardized degree; :func:`service.mechanisms.blended.mix` computes it, and
it is non-decreasing in each argument, also in floating point.

The regions. The nodes are ordered by d~ (public, once per graph version:
:func:`service.mechanisms.blended.degree_standard`). Positions ``[0, H)`` are the dense region:
every node of Z there has been drawn. Positions ``[H, n)`` are the sparse region, with a
threshold T: the nodes of Z there not drawn yet are exactly those with ``N_v < T``, and given
everything drawn they are i.i.d. ``N | N < T`` (the lemma of docs/privacy.md, "The lazy top-k":
a range's count is Binomial(R, p), which nodes a uniform subset, their levels i.i.d. in the
range, the others i.i.d. below it). So every node not drawn scores at most
``U(a, b) = a g (T - 1) + b z[order[H]]`` under every blend: below it, nothing can change
which nodes lead.

Two moves, chosen from what was drawn (they change the cost, never the law): lower T (a
binomial count of the sparse region's undrawn nodes in ``[T', T)``, a uniform subset of them,
their levels), or move H up (the nodes of Z that enter the dense region are drawn from
``N | N < T``). A statistic that reads the top r of some set under a blend (a, b) is settled
once r known nodes of that set score strictly above ``U(a, b)``, or nothing is left undrawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.graph.model import Graph
from service.mechanisms.blended import (
    NO_SIGNAL_WEIGHT_CAP,
    TOP_DEPTH,
    VALIDATION_DEPTH,
    WEIGHTS,
    DegreeStandard,
    choose_weight,
    coefficients,
    counts_carry_signal,
    degree_standard,
    final_shift,
    mix,
    ranked_first,
    recovery_gain,
    recovery_gains,
    score_noise,
    top_reliability,
)
from service.mechanisms.common_neighbours import noisy_neighbourhood, require_personalized
from service.mechanisms.hold_out import settled_tops
from service.mechanisms.lazy_top_k import (
    LevelLaw,
    binomial_count,
    distinct_uniform,
    lazy_rank_to_index,
    range_levels,
    range_probability_bits,
)
from service.mechanisms.postprocess import round_to_grid, score_grid
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.ranking_kernels import kth_largest
from service.privacy.laplace import TwoScalePlan
from service.privacy.modes import Mode

__all__ = ["BlendedDraw", "BlendedTop", "LazyCandidates", "blended_draw", "blended_top"]

#: The smallest number of nodes a move may draw (below it the fixed costs dominate: each
#: lowering of T is an exact binomial count of the R undrawn nodes of the sparse region, nearly
#: n: about log2 R draws of Binomial(u, 1/2), those above u = 2^14 by rejection in O(sqrt u),
#: 0.09-0.15 ms a count from 100k to 10M nodes; before, popcounts of about 2 R / 64 raw words,
#: 0.75-0.8 ms at 10M: docs/notes/performance-exact-binomial-2026-11-29.md). At 2048 a default
#: query on 100k to 1M nodes makes about one lowering instead of six (256: 256, 256, 256, 256,
#: 512, 1024 nodes and four doublings of H) and draws as many nodes in all
#: (docs/notes/performance-scale-http-2026-11-29.md). A cost, never the law: any move is.
MIN_BLOCK = 2048


def _merged(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The sorted union of two disjoint sorted arrays of distinct positions (``np.union1d``
    without its hashing: the callers' arrays never share a value; a stable sort merges the two
    runs)."""
    return np.sort(np.concatenate([first, second]), kind="stable")


class LazyCandidates:
    """The candidates' released counts, drawn lazily: the explicit ones and the drawn nodes of
    Z as ``ids`` / ``values`` (c~) / ``z`` (standardized d~), and the state (H, T) bounding the
    rest (module docstring)."""

    def __init__(
        self,
        rng: np.random.Generator,
        law: LevelLaw,
        grid: float,
        standard: DegreeStandard,
        excluded: np.ndarray,
        ids: np.ndarray,
        values: np.ndarray,
    ) -> None:
        self.rng = rng
        self.law = law
        self.grid = grid
        self.standard = standard
        self.n = standard.order.shape[0]
        self.excluded = np.sort(standard.position[excluded]).astype(np.int64)  # not in Z
        self.ids = ids.astype(np.int64)
        self.values = values.astype(np.float64)
        self.z = standard.z(self.ids)
        self.head = 0  # H
        self.threshold: int | None = None  # T (None: +inf, nothing drawn in the sparse region)
        self.sparse_drawn = np.zeros(0, dtype=np.int64)  # positions >= H drawn, sorted
        # undrawn() and z_head(), kept until a move changes them (None: not known)
        self._undrawn: int | None = None
        self._z_head: float | None = None

    def undrawn(self) -> int:
        """R: the nodes of Z in the sparse region not drawn yet."""
        if self._undrawn is None:
            after = self.excluded.shape[0] - int(np.searchsorted(self.excluded, self.head))
            self._undrawn = int((self.n - self.head) - after - self.sparse_drawn.shape[0])
        return self._undrawn

    def z_head(self) -> float:
        """The standardized degree at H (the largest of any node not yet in the dense region)."""
        if self._z_head is None:
            head = self.standard.order[self.head : self.head + 1]
            self._z_head = float(self.standard.z(head)[0])
        return self._z_head

    def bound_terms(self) -> tuple[int, float | None, float]:
        """What :meth:`bound` is made of: R, ``g (T - 1)`` (None: T is +inf) and the
        standardized degree at H (R = 0: nothing is left, the other two are not read)."""
        undrawn = self.undrawn()
        if undrawn == 0:
            return 0, None, 0.0
        top = None if self.threshold is None else float(self.threshold - 1) * self.grid
        return undrawn, top, self.z_head()

    def bound(self, a: float, b: float) -> float:
        """U(a, b): no undrawn node scores above it under the blend (a, b); -inf if none is
        left."""
        undrawn, top, z_head = self.bound_terms()
        if undrawn == 0:
            return -math.inf
        if top is None and a > 0.0:
            return math.inf
        # mix's formula on one node, in Python floats: the same two products and sum, each
        # rounded to double as numpy rounds them
        return a * (0.0 if top is None else top) + b * z_head

    def _add(self, positions: np.ndarray, levels: np.ndarray) -> None:
        nodes = self.standard.order[positions].astype(np.int64)
        self.ids = np.concatenate([self.ids, nodes])
        self.values = np.concatenate([self.values, levels.astype(np.float64) * self.grid])
        self.z = np.concatenate([self.z, self.standard.z(nodes)])

    def extend(self, head: int) -> None:
        """Move H up to ``head``: draw the nodes of Z entering the dense region (i.i.d.
        N | N < T, the law of every undrawn node of the sparse region)."""
        head = min(int(head), self.n)
        if head <= self.head:
            return
        free = np.ones(head - self.head, dtype=bool)  # the span's nodes of Z not drawn yet
        for taken in (self.excluded, self.sparse_drawn):
            inside = taken[(taken >= self.head) & (taken < head)]
            free[inside - self.head] = False
        fresh = np.flatnonzero(free).astype(np.int64) + self.head
        levels = range_levels(self.rng, self.law, fresh.shape[0], None, self.threshold)
        self._add(fresh, levels)
        self.sparse_drawn = self.sparse_drawn[self.sparse_drawn >= head]
        self.head = head
        self._undrawn = self._z_head = None

    def lower(self, threshold: int | None) -> None:
        """Lower T to ``threshold`` (None: -inf, draw every undrawn node): the number of the R
        undrawn nodes in [T', T) is Binomial(R, P(T' <= N < T) / P(N < T)), exactly; which
        ones a uniform subset; their levels i.i.d. in [T', T)."""
        remaining = self.undrawn()
        if threshold is not None and self.threshold is not None:
            threshold = min(threshold, self.threshold - 1)
        if remaining == 0:
            self.threshold = threshold if threshold is not None else self.threshold
            return
        if threshold is None:
            count = remaining
        else:
            digits = range_probability_bits(
                self.law, None, self.threshold, threshold, self.threshold
            )
            count = binomial_count(self.rng, remaining, digits)
        # a uniform subset, in ascending order: its levels are i.i.d. and drawn apart from it,
        # so the order they are paired in does not change the law (sorted, the positions are
        # found by a search that walks forward, and come sorted)
        ranks = np.sort(distinct_uniform(self.rng, remaining, count))
        taken = _merged(self.excluded[self.excluded >= self.head], self.sparse_drawn)
        positions = lazy_rank_to_index(taken - self.head, ranks) + self.head
        levels = range_levels(self.rng, self.law, count, threshold, self.threshold)
        self._add(positions, levels)
        self.sparse_drawn = _merged(self.sparse_drawn, positions)
        self.threshold = threshold
        self._undrawn = remaining - count

    def advance(self, a: float, b: float, kth: float) -> None:
        """One move towards ``U(a, b) < kth`` (``kth`` -inf: too few known nodes yet)."""
        remaining = self.undrawn()
        if remaining == 0:  # pragma: no cover - a settled statistic does not ask
            return
        budget = max(MIN_BLOCK, self.head)
        if a <= 0.0:  # the noise does not move this blend: only the degrees' order does
            self.extend(max(2 * self.head, MIN_BLOCK))
            return
        top = self.threshold
        s_top = self.law.tail_estimate(top)
        if kth == -math.inf:
            wanted = s_top + min(1.0, budget / remaining) * (1.0 - s_top)
            self.lower(None if budget >= remaining else self.law.level_estimate(wanted))
            return
        z_head = self.z_head()
        needed = math.floor((kth - b * z_head) / (a * self.grid))  # a g (T' - 1) + b z_H < kth
        if top is not None:
            needed = min(needed, top - 1)
        expected = remaining * (self.law.tail_estimate(needed) - s_top) / max(1.0 - s_top, 1e-300)
        if expected <= budget:
            self.lower(needed)
            return
        # too many at once: draw a budget's worth from the top, and widen the dense region
        wanted = s_top + min(1.0, budget / remaining) * (1.0 - s_top)
        partial = self.law.level_estimate(wanted)
        if top is None or partial < top:
            self.lower(partial)
        if b > 0.0 and self.head < self.n:
            self.extend(max(2 * self.head, MIN_BLOCK))
        elif top is not None and partial >= top:
            self.lower(top - 1)


def _kth(scores: np.ndarray, r: int) -> float:
    """The r-th largest of ``scores`` (-inf if there are fewer)."""
    if r <= 0:
        return math.inf
    if scores.shape[0] < r:
        return -math.inf
    return kth_largest(scores, r)


def floor_of(scores: np.ndarray, known: np.ndarray | None, r: int) -> float:
    """A value at most the r-th largest of ``scores``: the smallest of ``scores[known]`` when
    ``known`` holds r positions (at least r scores reach it), else -inf. The r largest scores,
    with every tie of the r-th, are among those at least it; the hold-out check passes the
    last weight's top r, whose blends under the next weight are close to its top."""
    if known is None or r <= 0 or known.shape[0] < r:
        return -math.inf
    return float(scores[known].min())


def _above(scores: np.ndarray, floor: float) -> np.ndarray | None:
    """The positions of the scores at least ``floor`` (None: all of them)."""
    return None if floor == -math.inf else np.flatnonzero(scores >= floor)


def _settle(
    state: LazyCandidates, a: float, b: float, r: int, fixed: np.ndarray | None = None
) -> np.ndarray:
    """Draw until the top r of (``fixed`` scores and) the candidates under (a, b) are known;
    returns the known candidates' scores."""
    if r <= 0:
        return mix(a, state.values, b, state.z)
    every, _ = _settled(state, a, b, r, fixed, None)
    return every if fixed is None else every[fixed.shape[0] :]


def _settled(
    state: LazyCandidates,
    a: float,
    b: float,
    r: int,
    fixed: np.ndarray | None,
    known: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`_settle` for r >= 1, returning the pool's scores (``fixed``, then the
    candidates'; the pool only grows at its end) and the positions of those at least
    :func:`floor_of` (None: all), whose r-th largest settles it. ``known``: r positions of the
    pool whose r-th largest score bounds the top's from below, so that only the scores reaching
    it are partitioned (the same r-th largest)."""
    while True:
        scores = mix(a, state.values, b, state.z)
        every = scores if fixed is None else np.concatenate([fixed, scores])
        above = _above(every, floor_of(every, known, r))
        kth = _kth(every if above is None else every[above], r)
        if state.undrawn() == 0 or kth > state.bound(a, b):
            return every, above
        state.advance(a, b, kth)


def _ranked_first_in(
    scores: np.ndarray, indices: np.ndarray, r: int, above: np.ndarray | None
) -> np.ndarray:
    """:func:`service.mechanisms.blended.ranked_first` (positions of the r best, ties by
    ``indices``) read from the scores at ``above`` (None: all), which hold the r best and every
    tie of the r-th (:func:`floor_of`): the same answer."""
    if above is None:
        return ranked_first(scores, indices, r)
    first: np.ndarray = above[ranked_first(scores[above], indices[above], r)]
    return first


def _hold_out_gains(
    state: LazyCandidates,
    friends: np.ndarray,
    friend_values: np.ndarray,
    friend_z: np.ndarray,
    r: int,
    r_counts: float,
    r_degrees: float,
    counts_scale: float,
) -> np.ndarray:
    """The hold-out check: under each weight of the grid, the recovery gain of the pool's top r
    (friends first, then the candidates), drawing until each top is settled. The settled
    weights are read in one compiled pass (:func:`service.mechanisms.hold_out.settled_tops`);
    a weight that is not settled yet draws here, as one weight at a time would, and the pass
    goes on from the next one with the grown pool."""
    weights = [coefficients(float(w), r_counts, r_degrees, counts_scale) for w in WEIGHTS]
    a_s = np.array([a for a, _ in weights])
    b_s = np.array([b for _, b in weights])
    nf = friends.shape[0]
    tops = np.empty((len(weights), r), dtype=np.int64)
    gains = np.empty(len(weights))
    start = 0
    while start < len(weights):
        ids = np.concatenate([friends, state.ids])
        values = np.concatenate([friend_values, state.values])
        z = np.concatenate([friend_z, state.z])
        stop = settled_tops(a_s, b_s, values, z, ids, r, start, state.bound_terms(), tops)
        if stop > start:  # the pool's first nf are the friends
            gains[start:stop] = recovery_gains(tops[start:stop] < nf)
        if stop == len(weights):
            break
        a, b = weights[stop]
        last = tops[stop - 1] if stop > 0 else None
        scores, above = _settled(state, a, b, r, mix(a, friend_values, b, friend_z), last)
        ids = np.concatenate([friends, state.ids])
        tops[stop] = _ranked_first_in(scores, ids, r, above)
        gains[stop] = recovery_gain(tops[stop] < nf)
        start = stop + 1
    return gains


@dataclass(frozen=True)
class BlendedTop:
    """The served top: ``indices`` and ``scores`` (rounded to ``grid``, clipped at 0), best
    first, as :func:`service.mechanisms.postprocess.ranked_indices` ranks the full draw's
    :func:`service.mechanisms.blended.blend`; and the statistics the answer states."""

    indices: np.ndarray
    scores: np.ndarray
    grid: float
    weight: float
    reliability_counts: float
    reliability_degrees: float
    counts_signal: bool


def blended_top(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    degrees: np.ndarray,
    degrees_scale: float,
    k: int,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    grid: float | None = None,
) -> BlendedTop:
    """The top ``k`` (the seed excluded) of ``blend(graph, seed, c~, degrees, b_c, b_d,
    depth=k - d(seed))`` for this query's two-scale c~, ranked as ``ranked_indices`` ranks it
    on ``score_grid`` of its noise: exactly the law of the full draw, drawing noise for the
    friends, the candidates with a common neighbour and only as many other nodes as the
    statistics and the ranked top need (module docstring; docs/privacy.md)."""
    return blended_draw(graph, seed, plan, degrees, degrees_scale, k, rng, mode, grid=grid).top


@dataclass(frozen=True)
class BlendedDraw:
    """:func:`blended_top`'s answer (``top``) with what it drew: the friends' released counts
    and the candidates' state (for tests that complete the draw and compare)."""

    top: BlendedTop
    friends: np.ndarray
    friend_values: np.ndarray
    candidates: LazyCandidates


def blended_draw(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    degrees: np.ndarray,
    degrees_scale: float,
    k: int,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    grid: float | None = None,
) -> BlendedDraw:
    """:func:`blended_top` with what it drew."""
    require_personalized(mode, "blended")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = graph.n
    rng = rng if rng is not None else fresh_generator()
    standard = degree_standard(degrees, degrees_scale)
    noisy = noisy_neighbourhood(graph, seed, plan, rng, grid)
    hood, grid, (s_c, t_c) = noisy.hood, noisy.grid, noisy.candidate_ratio
    friends, explicit = hood.friends, hood.explicit
    candidate_values, friend_values = noisy.candidate_values, noisy.friend_values
    state = LazyCandidates(
        rng, LevelLaw(s_c, t_c), grid, standard, hood.excluded, explicit, candidate_values
    )
    friend_z = standard.z(friends)
    nf = friends.shape[0]
    m = n - 1 - nf

    # the counts' statistics: the top r candidates by c~ (a = 1, b = 0)
    r = min(TOP_DEPTH, m)
    top_counts = _settle(state, 1.0, 0.0, r)
    top = np.sort(top_counts)[::-1][:r]
    r_counts = top_reliability(top, plan.candidate_scale, m)
    signal = counts_carry_signal(top, plan.candidate_scale, m)
    r_degrees = standard.reliability

    # the hold-out check: the top min(d_s, 50) of the pool under each weight
    depth_h = min(nf, VALIDATION_DEPTH, n - 1)
    weight = 0.5
    if depth_h > 0:
        gains = _hold_out_gains(state, friends, friend_values, friend_z, depth_h, r_counts,
                                r_degrees, plan.candidate_scale)  # fmt: skip
        weight = choose_weight(gains)
    if not signal:
        weight = min(weight, NO_SIGNAL_WEIGHT_CAP)

    # the served top: the raw top `depth` candidates set low; then the rounded ranking
    a, b = coefficients(weight, r_counts, r_degrees, plan.candidate_scale)
    depth = min(max(k - nf, 0), m)
    friend_mixed = mix(a, friend_values, b, friend_z)
    mixed = _settle(state, a, b, max(depth, 1)) if m > 0 else np.zeros(0)
    # the smallest blend of the ranked top `depth` is the depth-th largest (ties or not)
    served_min = np.array([kth_largest(mixed, depth)]) if depth > 0 else mixed[:0]
    pool_max = float(np.concatenate([friend_mixed, mixed]).max(initial=-math.inf))
    low, high = final_shift(friend_mixed, served_min, pool_max if n > 1 else 0.0)
    noise = score_noise(a, b, plan.candidate_scale, degrees_scale, standard.spread)
    sgrid = score_grid(noise)
    friend_scores = round_to_grid(friend_mixed - low + 1.0 + (high - low + 1.0), sgrid)
    keep = min(int(k), n - 1)
    while True:  # ranked as served: rounded, clipped at 0, ties by index
        rounded = round_to_grid(mixed - low + 1.0, sgrid)
        every = np.maximum(np.concatenate([friend_scores, rounded]), 0.0)
        kth = _kth(every, keep)
        limit = state.bound(a, b)
        ceiling = max(float(round_to_grid(np.array([limit - low + 1.0]), sgrid)[0]), 0.0)
        if state.undrawn() == 0 or kth > ceiling:
            break
        state.advance(a, b, (kth - sgrid) + low - 1.0)  # a raw target below the rounded kth
        mixed = mix(a, state.values, b, state.z)
    ids = np.concatenate([friends, state.ids])
    first = ranked_first(every, ids, keep)
    answer = BlendedTop(ids[first], every[first], sgrid, weight, r_counts, r_degrees, signal)
    return BlendedDraw(answer, friends, friend_values, state)
