"""``blended`` (personalized mode only): noisy common neighbours and DP degrees, blended by
how well each recovers the seed's own friends, standardized with public quantities only.

Inputs (the only ones that touch protected edges):

- c~ = |N(s) & N(v)| + Lap(b_c) on the candidates C = V \\ ({s} | N(s)) and + Lap(b_f) on the
  friends N(s), b_f = 2 / eps and b_c = b_f / 2: this query's two-scale release (pure eps-DP,
  charged to the seed's account exactly as one-scale counts at eps;
  :func:`service.mechanisms.common_neighbours.two_scale_common_neighbours`);
- d~ = d + Lap(2 / eps_d): the graph version's one DP degree release (``popular``; charged
  once to the graph-wide exposure; :mod:`service.mechanisms.popular`).

Everything else is post-processing of (c~, d~) with the seed's own neighbour list N(s), which
the personalized model leaves unprotected (the answer goes to s, who knows their friends). This
module defines the blend by the full draw (:func:`blend`: every node's value); the service
computes the same function's ranked top lazily, from the noisy counts of the few nodes that can
reach it (:mod:`service.mechanisms.lazy_blend`; docs/privacy.md, "The lazy top-k"). So every
statistic reads c~ only through the ranked top of the candidates under a linear score, and d~
only through public per-version summaries:

1. Degrees: z_d = (d~ - mean) / std over all n nodes, weighed by R_d = 1 - 2 b_d^2 / Var(d~)
   (Kelley's true-score share; all public, computed once per graph version,
   :func:`degree_standard`). Counts: c~ / (sqrt(2) b_c), the candidates' noise in units of its
   standard deviation (public), weighed by R_c, the share of the top r = 50 candidates' second
   moment (c~ clipped at 0) that is not what r order statistics of m pure-noise counts would
   give: R_c = 1 - sum (b_c q_i)^2 / sum max(t_i, 0)^2, q_i the Lap(1) quantile at
   1 - i / (m + 1), floored at 0.01 (:func:`top_reliability`).
2. For each weight w on a fixed grid 0, 0.05, ..., 0.85, rank V \\ {s} by
   w R_c c~ / (sqrt(2) b_c) + (1 - w) R_d z_d (ties by index) and score how well the top
   min(d_s, 50) recovers N(s) (DCG with gain 1 per friend; the friends' counts carry their own,
   larger noise, as released). Keep the median of the weights within 5% of the best score: link
   prediction's standard hold-out check, with the seed's known friends as the validation set.
   The grid stops at 0.85: the degrees keep at least 15% of the blend; the pure count ranking is
   ``friends_of_friends``.
3. The friends are a biased validation set (they share more friends with the seed than any
   candidate does), so a weight above 0.5 is kept only if the counts carry signal AMONG THE
   CANDIDATES, by a one-sided 5% test of "every candidate has count 0": the largest candidate
   count exceeds the 95% quantile of the maximum of m i.i.d. Lap(b_c) draws
   (:func:`counts_carry_signal`). Otherwise the weight is capped at 0.5.
4. Scores: the blend, shifted by ``low`` (the minimum of 0, the friends' blends and the ranked
   top ``depth`` candidates' blends) so that what is served is >= 1, with the seed's neighbours
   placed first (shifted by ``high - low + 1``, ``high`` the maximum of 0 and the pool's blends);
   the seed itself scores 0.

None of it reads which nodes have a common neighbour with the seed (an exact function of
protected edges) other than through their noisy counts' ranks. The guarantee is therefore
exactly that of the two releases (docs/ranking.md): per query pure eps-DP for every edge not
touching s, plus the graph version's eps_d once.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.common_neighbours import (
    require_personalized,
    two_scale_common_neighbours,
)
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.ranking_kernels import ranked_positions
from service.privacy.laplace import TwoScalePlan
from service.privacy.modes import Mode

__all__ = [
    "MAX_COUNT_WEIGHT",
    "SERVED_DEPTH",
    "TOP_DEPTH",
    "VALIDATION_DEPTH",
    "WEIGHTS",
    "BlendedRanking",
    "DegreeStandard",
    "blend",
    "blended_ranking",
    "choose_weight",
    "coefficients",
    "counts_carry_signal",
    "degree_standard",
    "final_shift",
    "mix",
    "ranked_first",
    "recovery_gain",
    "recovery_gains",
    "reliability",
    "score_noise",
    "signal_threshold",
    "top_reliability",
]

#: Largest weight of the common-neighbour signal: the degrees keep at least 15% of the blend.
MAX_COUNT_WEIGHT = 0.85
#: Weights of the common-neighbour signal that the hold-out check chooses from (steps of 0.05).
WEIGHTS = np.linspace(0.0, MAX_COUNT_WEIGHT, 18)
#: The hold-out check scores the top min(d_s, VALIDATION_DEPTH) of the ranking.
VALIDATION_DEPTH = 50
#: The counts' reliability and signal test read the top TOP_DEPTH candidates' counts.
TOP_DEPTH = 50
#: Candidates whose blends set the shift ``low`` (the service's default replay_store_top).
SERVED_DEPTH = 1000
#: Weights scoring within this share of the best are ties; their median is used.
TIE_TOLERANCE = 0.05
#: Smallest reliability: a signal drowned in noise still orders what is left to order.
MIN_RELIABILITY = 0.01
#: One-sided level of the test for signal in the candidates' counts.
SIGNAL_LEVEL = 0.05
#: Largest weight of the counts when the test finds no signal among the candidates.
NO_SIGNAL_WEIGHT_CAP = 0.5


@dataclass(frozen=True)
class BlendedRanking:
    """The released scores (higher is better), the weight the hold-out check chose for the
    common-neighbour signal and the two reliabilities (all functions of the releases), and
    the Laplace scale of the larger of the two noise terms in the scores' own units (what the
    served scores' grid is derived from)."""

    scores: np.ndarray
    weight: float
    reliability_counts: float
    reliability_degrees: float
    score_noise_scale: float = 0.0
    counts_signal: bool = True


# --- the public side: the degree release, summarized once per graph version ---------------


@dataclass(frozen=True)
class DegreeStandard:
    """A degree release d~ summarized (public, once per graph version): its ``mean``,
    ``spread`` (standard deviation) and ``reliability`` over all n nodes, and the nodes ordered
    by d~ (descending, ties by index): ``order`` (position -> node) and ``position`` (node ->
    position). :meth:`z` is the standardized degree (d~ - mean) / spread (0 if d~ is constant),
    a non-decreasing function of d~ also in floating point, so it is non-increasing along
    ``order``."""

    values: np.ndarray
    mean: float
    spread: float
    reliability: float
    order: np.ndarray
    position: np.ndarray

    def z(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """(d~ - mean) / spread of ``nodes`` (every node for None), element by element."""
        values = self.values if nodes is None else self.values[nodes]
        if self.spread <= 0.0:
            return np.zeros(values.shape[0], dtype=np.float64)
        out: np.ndarray = (values - self.mean) / self.spread
        return out


#: The summaries of the last few read-only releases (a process serves one graph version).
_STANDARDS: list[tuple[np.ndarray, float, DegreeStandard]] = []
_STANDARDS_KEPT = 2
_STANDARDS_LOCK = threading.Lock()


def _standardize_degrees(degrees: np.ndarray, degrees_scale: float) -> DegreeStandard:
    values = np.asarray(degrees, dtype=np.float64)
    n = values.shape[0]
    spread = float(values.std()) if n else 0.0
    if not (math.isfinite(spread) and spread > 0.0):
        spread = 0.0
    mean = float(values.mean()) if n else 0.0
    kind = np.int32 if n < 2**31 else np.int64
    order = np.lexsort((np.arange(n, dtype=kind), -values)).astype(kind)
    position = np.empty(n, dtype=kind)
    position[order] = np.arange(n, dtype=kind)
    return DegreeStandard(values, mean, spread, reliability(values, degrees_scale), order, position)


def degree_standard(degrees: np.ndarray, degrees_scale: float) -> DegreeStandard:
    """:class:`DegreeStandard` of a degree release; kept for the last two read-only arrays (a
    stored release is one), so that each process computes it once per graph version; a
    writable array is summarized anew."""
    if degrees.flags.writeable:
        return _standardize_degrees(degrees, degrees_scale)
    with _STANDARDS_LOCK:
        for array, scale, standard in _STANDARDS:
            if array is degrees and scale == degrees_scale:
                return standard
    standard = _standardize_degrees(degrees, degrees_scale)
    with _STANDARDS_LOCK:
        _STANDARDS.insert(0, (degrees, degrees_scale, standard))
        del _STANDARDS[_STANDARDS_KEPT:]
    return standard


def reliability(values: np.ndarray, noise_scale: float) -> float:
    """1 - 2 b^2 / variance(values), in [MIN_RELIABILITY, 1]: the share of the spread of
    ``values`` (released with Lap(b) noise, variance 2 b^2) that is signal."""
    if values.shape[0] < 2:
        return 1.0
    observed = float(values.var(ddof=1))
    if not np.isfinite(observed) or observed <= 0.0:
        return MIN_RELIABILITY
    return float(min(1.0, max(MIN_RELIABILITY, 1.0 - 2.0 * noise_scale**2 / observed)))


# --- the counts' statistics, from the top of the candidates' counts --------------------------


def _laplace_upper_quantiles(m: int, r: int) -> np.ndarray:
    """The Lap(1) quantiles at 1 - i / (m + 1), i = 1..r: where the i-th largest of m i.i.d.
    draws sits."""
    p = 1.0 - np.arange(1, r + 1, dtype=np.float64) / (m + 1.0)
    upper = p >= 0.5
    out = np.empty(r, dtype=np.float64)
    out[upper] = -np.log(2.0 * (1.0 - p[upper]))
    out[~upper] = np.log(2.0 * p[~upper])
    return out


def top_reliability(top: np.ndarray, noise_scale: float, m: int) -> float:
    """The share of the top candidates' counts ``top`` (the r largest of m, descending) that
    is signal: 1 - sum (b q_i)^2 / sum max(t_i, 0)^2 over the positive null quantiles q_i
    (:func:`_laplace_upper_quantiles`), in [MIN_RELIABILITY, 1]."""
    r = top.shape[0]
    if r == 0:
        return MIN_RELIABILITY
    observed = float(np.sum(np.square(np.maximum(top, 0.0))))
    null = np.maximum(noise_scale * _laplace_upper_quantiles(m, r), 0.0)
    expected = float(np.sum(np.square(null)))
    if not observed > 0.0:
        return MIN_RELIABILITY
    return float(min(1.0, max(MIN_RELIABILITY, 1.0 - expected / observed)))


def signal_threshold(noise_scale: float, m: int) -> float:
    """The (1 - SIGNAL_LEVEL) quantile of the maximum of m i.i.d. Lap(``noise_scale``) draws:
    P(max <= t) = (1 - e^(-t / b) / 2)^m."""
    if m < 1:
        return math.inf
    tail = -math.expm1(math.log1p(-SIGNAL_LEVEL) / m)  # 1 - (1 - level)^(1 / m), <= level
    return float(-noise_scale * math.log(2.0 * tail))


def counts_carry_signal(top: np.ndarray, noise_scale: float, m: int) -> bool:
    """One-sided SIGNAL_LEVEL test of "every one of the m candidates has count 0": the
    largest candidate count ``top[0]`` exceeds :func:`signal_threshold`."""
    return bool(top.shape[0] > 0 and float(top[0]) > signal_threshold(noise_scale, m))


# --- the blend ------------------------------------------------------------------------------


def coefficients(
    weight: float, r_counts: float, r_degrees: float, counts_scale: float
) -> tuple[float, float]:
    """(a, b) of the blend a c~ + b z_d at ``weight``: a = w R_c / (sqrt(2) b_c) >= 0,
    b = (1 - w) R_d >= 0."""
    a = float(weight) * r_counts / (math.sqrt(2.0) * counts_scale)
    b = (1.0 - float(weight)) * r_degrees
    return float(a), float(b)


def mix(a: float, counts: np.ndarray, b: float, z: np.ndarray) -> np.ndarray:
    """a c~ + b z_d element by element (the one formula both paths compute: non-decreasing in
    each of c~ and z_d for a, b >= 0, also in floating point)."""
    out: np.ndarray = a * np.asarray(counts, dtype=np.float64) + b * np.asarray(z, np.float64)
    return out


def ranked_first(scores: np.ndarray, indices: np.ndarray, r: int) -> np.ndarray:
    """Positions (into ``scores``) of the ``r`` best by score descending, ties by ``indices``
    ascending."""
    return ranked_positions(scores, indices, r)  # compiled; ties of both by position


def recovery_gain(is_friend: np.ndarray) -> float:
    """DCG of a ranked list with gain 1 per friend (``is_friend`` in rank order)."""
    return float(np.sum(is_friend / _discounts(is_friend.shape[0])))


def recovery_gains(is_friend: np.ndarray) -> np.ndarray:
    """:func:`recovery_gain` of each row of ``is_friend`` (lists of one length, in rank order),
    in one reduction: numpy sums each row as it sums one list, so the gains are the same."""
    gains: np.ndarray = np.sum(is_friend / _discounts(is_friend.shape[1]), axis=1)
    return gains


@functools.lru_cache(maxsize=64)
def _discounts(depth: int) -> np.ndarray:
    """DCG's discounts log2(2), ..., log2(depth + 1) (read-only: shared by every call)."""
    out = np.log2(np.arange(2, depth + 2))
    out.flags.writeable = False
    return out


def choose_weight(gains: np.ndarray) -> float:
    """The median of the grid weights whose gain is within TIE_TOLERANCE of the best."""
    gains = np.asarray(gains, dtype=np.float64)
    best = WEIGHTS[gains >= gains.max() * (1.0 - TIE_TOLERANCE)].tolist()
    # the median of the ascending grid's subset, as np.median takes it (the middle one, or
    # the mean of the middle two: their sum halved)
    middle = len(best) // 2
    return float(best[middle] if len(best) % 2 else (best[middle - 1] + best[middle]) / 2.0)


def final_shift(friend_mixed: np.ndarray, top_mixed: np.ndarray, pool_max: float) -> tuple[
    float, float
]:  # fmt: skip
    """(low, high): low = min(0, the friends' and the ranked top candidates' blends), high =
    max(0, the pool's largest blend)."""
    low = min(0.0, float(friend_mixed.min(initial=0.0)), float(top_mixed.min(initial=0.0)))
    return low, max(0.0, pool_max)


def score_noise(
    a: float, b: float, counts_scale: float, degrees_scale: float, spread: float
) -> float:
    """The larger Laplace scale of the two noise terms in the blend's units."""
    degrees = b * degrees_scale / spread if spread > 0.0 else 0.0
    return float(max(a * counts_scale, degrees))


def blend(
    graph: Graph,
    seed: int,
    counts: np.ndarray,
    degrees: np.ndarray,
    counts_scale: float,
    degrees_scale: float,
    *,
    depth: int = SERVED_DEPTH,
) -> BlendedRanking:
    """The blend by the full draw: post-processing of the two releases with N(seed).
    ``counts`` = c~ (n values), whose CANDIDATES (every node but the seed and its friends)
    carry Lap(``counts_scale``) noise (the friends' noise may be larger: they enter only the
    hold-out check and are ranked first anyway), ``degrees`` = d~ with Lap(``degrees_scale``)
    noise; ``depth``: the candidates whose blends set ``low`` (the ranked top that is served).
    :func:`service.mechanisms.lazy_blend.blended_top` computes its ranked top lazily."""
    n = graph.n
    if counts.shape != (n,) or degrees.shape != (n,):
        raise InvalidParameter("released", f"both released vectors must have shape ({n},)")
    counts = np.asarray(counts, dtype=np.float64)
    standard = degree_standard(degrees, degrees_scale)
    friends = np.unique(graph.neighbors(seed).astype(np.int64))
    friends = friends[friends != seed]
    is_friend = np.zeros(n, dtype=bool)
    is_friend[friends] = True
    in_pool = np.ones(n, dtype=bool)
    in_pool[seed] = False
    pool = np.flatnonzero(in_pool)
    candidates = np.flatnonzero(in_pool & ~is_friend)
    m = candidates.shape[0]
    top = np.sort(counts[candidates])[::-1][: min(TOP_DEPTH, m)]
    r_counts = top_reliability(top, counts_scale, m)
    signal = counts_carry_signal(top, counts_scale, m)
    r_degrees = standard.reliability
    z = standard.z()
    depth_h = min(friends.shape[0], VALIDATION_DEPTH, pool.shape[0])
    weight = 0.5
    if depth_h > 0:
        gains = []
        for w in WEIGHTS:
            a, b = coefficients(float(w), r_counts, r_degrees, counts_scale)
            scores = mix(a, counts[pool], b, z[pool])
            first = pool[ranked_first(scores, pool, depth_h)]
            gains.append(recovery_gain(is_friend[first]))
        weight = choose_weight(np.array(gains))
    if not signal:
        weight = min(weight, NO_SIGNAL_WEIGHT_CAP)
    a, b = coefficients(weight, r_counts, r_degrees, counts_scale)
    mixed = mix(a, counts, b, z)
    served = candidates[ranked_first(mixed[candidates], candidates, min(int(depth), m))]
    pool_max = float(mixed[pool].max()) if pool.shape[0] else 0.0
    low, high = final_shift(mixed[friends], mixed[served], pool_max)
    scores = mixed - low + 1.0  # >= 1 on the served top: top-k clips at 0
    scores[friends] += high - low + 1.0  # the seed's friends first (free in this model)
    scores[seed] = 0.0
    noise = score_noise(a, b, counts_scale, degrees_scale, standard.spread)
    return BlendedRanking(scores, weight, r_counts, r_degrees, noise, signal)


def blended_ranking(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    degrees_released: np.ndarray,
    degrees_scale: float,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    depth: int = SERVED_DEPTH,
) -> BlendedRanking:
    """Draw this query's two-scale c~ for every node (``plan``: Lap(b_f) on the friends, Lap(b_c)
    on the candidates) and blend it with the version's d~ (released with Lap(``degrees_scale``)
    noise): the full draw, the reference of the lazy path.

    ``rng`` defaults to a fresh OS-entropy generator; ``degrees_released`` must be the graph
    version's single stored degree release, never a fresh one per query.
    """
    require_personalized(mode, "blended")
    rng = rng if rng is not None else fresh_generator()
    counts = two_scale_common_neighbours(graph, seed, plan, rng, mode)
    return blend(
        graph, seed, counts, degrees_released, plan.candidate_scale, degrees_scale, depth=depth
    )
