"""``blended`` (personalized mode only): noisy common neighbours and DP degrees, blended by
how well each recovers the seed's own friends.

Inputs (the only ones that touch protected edges):

- c~ = |N(s) & N(v)| + Lap(b_c) on the candidates C = V \\ ({s} | N(s)) and + Lap(b_f) on the
  friends N(s), b_f = 2 / eps and b_c = b_f / 2: this query's two-scale release (pure eps-DP,
  charged to the seed's account exactly as one-scale counts at eps;
  :func:`service.mechanisms.common_neighbours.two_scale_common_neighbours`);
- d~ = d + Lap(2 / eps_d): the graph version's one DP degree release (``popular``; charged
  once to the graph-wide exposure; :mod:`service.mechanisms.popular`).

Everything else is post-processing of (c~, d~) with the seed's own neighbour list N(s), which
the personalized model leaves unprotected (the answer goes to s, who knows their friends):

1. z-score both vectors over V \\ {s}: z_c, z_d; and weigh each by its reliability among the
   candidates C: R = 1 - (noise variance) / (observed variance over C), floored at 0.01
   (Kelley's true-score estimate: the share of the spread that is signal; the noise
   variances over C, 2 b_c^2 = 2 / eps^2 and 2 b_d^2, are known exactly).
2. For each weight w on a fixed grid 0, 0.05, ..., 0.85, rank V \\ {s} by
   w R_c z_c + (1 - w) R_d z_d and score how well the top min(d_s, 50) recovers N(s) (NDCG
   with gain 1 per friend; the friends' counts are the noisier ones, Lap(b_f), variance
   8 / eps^2, as released). Keep the median of the weights within 5% of the best score. This
   is link prediction's standard hold-out check, with the seed's known friends as the
   validation set: on graphs where friends of friends share many friends (clustered,
   ego-network-like) it moves toward the common-neighbour signal, where popularity predicts
   friendship (dense, well-mixed graphs) toward the degrees; where it cannot tell, the
   median keeps the reliability-weighted middle. The grid stops at 0.85: the check leans
   toward the counts (item 3), and a weight near 1 drops the degrees, which on well-mixed
   graphs rank the candidates better than the counts (measured in docs/ranking.md); the pure
   count ranking is ``friends_of_friends``.
3. The friends are a biased validation set: they share more friends with the seed than any
   candidate does (triangles), so their counts stand out of the noise where the candidates'
   do not. A weight above the middle (0.5) is therefore kept only if the counts carry signal
   AMONG THE CANDIDATES, by a one-sided 5% test of "every candidate has the same count":
   under it c~ = const + Lap(b_c), whose sample variance has mean 2 b_c^2 and standard error
   b_c^2 sqrt(20 / m) over m candidates (Laplace fourth moment 24 b^4); signal if the observed
   variance exceeds 2 b^2 by more than 1.645 standard errors. Otherwise the weight is capped
   at 0.5.
4. Scores: the blend, shifted to be positive, with the seed's neighbours placed first (free
   information in this model); the seed itself scores 0.

The guarantee is therefore exactly that of the two releases (docs/ranking.md): per query
pure eps-DP for every edge not touching s, plus the graph version's eps_d once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.common_neighbours import (
    require_personalized,
    two_scale_common_neighbours,
)
from service.mechanisms.randomness import fresh_generator
from service.privacy.laplace import TwoScalePlan
from service.privacy.modes import Mode

__all__ = [
    "MAX_COUNT_WEIGHT",
    "VALIDATION_DEPTH",
    "WEIGHTS",
    "BlendedRanking",
    "blend",
    "blended_ranking",
    "choose_weight",
    "counts_carry_signal",
    "reliability",
]

#: Largest weight of the common-neighbour signal: the degrees keep at least 15% of the blend.
MAX_COUNT_WEIGHT = 0.85
#: Weights of the common-neighbour signal that the hold-out check chooses from (steps of 0.05).
WEIGHTS = np.linspace(0.0, MAX_COUNT_WEIGHT, 18)
#: The hold-out check scores the top min(d_s, VALIDATION_DEPTH) of the ranking.
VALIDATION_DEPTH = 50
#: Weights scoring within this share of the best are ties; their median is used.
TIE_TOLERANCE = 0.05
#: Smallest reliability: a signal drowned in noise still orders what is left to order.
MIN_RELIABILITY = 0.01
#: One-sided 5% normal quantile of the test for signal in the candidates' counts.
SIGNAL_Z = 1.645
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


def _spread(x: np.ndarray, pool: np.ndarray) -> float:
    spread = float(x[pool].std())
    return spread if np.isfinite(spread) and spread > 0.0 else 0.0


def _standardize(x: np.ndarray, pool: np.ndarray) -> np.ndarray:
    spread = _spread(x, pool)
    if spread <= 0.0:
        return np.zeros_like(x)
    return (x - float(x[pool].mean())) / spread


def _scale_in_z(scale: float, weight: float, spread: float) -> float:
    """Laplace(``scale``) noise of a vector, in units of ``weight`` times its z-score."""
    return weight * scale / spread if spread > 0.0 else 0.0


def _recovery(scores: np.ndarray, is_friend: np.ndarray, depth: int) -> float:
    """DCG of the top ``depth`` of ``scores`` with gain 1 per friend (ties by index)."""
    top = np.argpartition(-scores, depth - 1)[:depth]
    top = top[np.lexsort((top, -scores[top]))]
    return float(np.sum(is_friend[top] / np.log2(np.arange(2, depth + 2))))


def reliability(values: np.ndarray, noise_scale: float) -> float:
    """1 - 2 b^2 / variance(values), in [MIN_RELIABILITY, 1]: the share of the spread of
    ``values`` (released with Lap(b) noise, variance 2 b^2) that is signal."""
    if values.shape[0] < 2:
        return 1.0
    observed = float(values.var(ddof=1))
    if not np.isfinite(observed) or observed <= 0.0:
        return MIN_RELIABILITY
    return float(min(1.0, max(MIN_RELIABILITY, 1.0 - 2.0 * noise_scale**2 / observed)))


def counts_carry_signal(values: np.ndarray, noise_scale: float) -> bool:
    """One-sided 5% test that ``values`` (released with Lap(``noise_scale``) noise) are not all
    the same count: their sample variance exceeds the noise's 2 b^2 by more than SIGNAL_Z
    standard errors (b^2 sqrt(20 / m) for m values of constant + Laplace noise)."""
    m = values.shape[0]
    if m < 2:
        return False
    observed = float(values.var(ddof=1))
    b2 = noise_scale**2
    return bool(np.isfinite(observed) and observed - 2.0 * b2 > SIGNAL_Z * b2 * np.sqrt(20.0 / m))


def choose_weight(counts: np.ndarray, degrees: np.ndarray, friends: np.ndarray) -> float:
    """The grid weight whose blend best recovers ``friends`` (a boolean mask over the pool):
    the median of those scoring within TIE_TOLERANCE of the best.

    ``counts`` and ``degrees`` (the two weighted signals) cover the pool (every node but the
    seed). With no friend in the pool the check is uninformative: the middle weight 0.5.
    """
    count = int(friends.sum())
    if count == 0:
        return 0.5
    depth = min(count, VALIDATION_DEPTH, friends.shape[0])
    gains = np.array([_recovery(w * counts + (1.0 - w) * degrees, friends, depth) for w in WEIGHTS])
    best = WEIGHTS[gains >= gains.max() * (1.0 - TIE_TOLERANCE)]
    return float(np.median(best))


def blend(
    graph: Graph,
    seed: int,
    counts: np.ndarray,
    degrees: np.ndarray,
    counts_scale: float,
    degrees_scale: float,
) -> BlendedRanking:
    """Post-processing of the two releases with N(seed): ``counts`` = c~, whose CANDIDATES
    (every node but the seed and its friends) carry Lap(``counts_scale``) noise (the friends'
    noise may be larger: they enter only the hold-out check and are ranked first anyway), and
    ``degrees`` = d~ with Lap(``degrees_scale``) noise."""
    n = graph.n
    if counts.shape != (n,) or degrees.shape != (n,):
        raise InvalidParameter("released", f"both released vectors must have shape ({n},)")
    counts = np.asarray(counts, dtype=np.float64)
    degrees = np.asarray(degrees, dtype=np.float64)
    pool = np.ones(n, dtype=bool)
    pool[seed] = False
    friends = np.zeros(n, dtype=bool)
    friends[graph.neighbors(seed)] = True
    candidates = pool & ~friends
    r_counts = reliability(counts[candidates], counts_scale)
    r_degrees = reliability(degrees[candidates], degrees_scale)
    z_counts = r_counts * _standardize(counts, pool)
    z_degrees = r_degrees * _standardize(degrees, pool)
    weight = choose_weight(z_counts[pool], z_degrees[pool], friends[pool])
    signal = counts_carry_signal(counts[candidates], counts_scale)
    if not signal:
        weight = min(weight, NO_SIGNAL_WEIGHT_CAP)
    mixed = weight * z_counts + (1.0 - weight) * z_degrees
    low, high = float(mixed[pool].min(initial=0.0)), float(mixed[pool].max(initial=0.0))
    scores = mixed - low + 1.0  # >= 1 on the pool: top-k clips at 0 and must not tie them
    scores[friends] += high - low + 1.0  # the seed's friends first (free in this model)
    scores[seed] = 0.0
    noise = max(
        _scale_in_z(counts_scale, weight * r_counts, _spread(counts, pool)),
        _scale_in_z(degrees_scale, (1.0 - weight) * r_degrees, _spread(degrees, pool)),
    )
    return BlendedRanking(scores, weight, r_counts, r_degrees, noise, signal)


def blended_ranking(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    degrees_released: np.ndarray,
    degrees_scale: float,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
) -> BlendedRanking:
    """Draw this query's two-scale c~ (``plan``: Lap(b_f) on the friends, Lap(b_c) on the
    candidates) and blend it with the version's d~ (released with Lap(``degrees_scale``)
    noise).

    ``rng`` defaults to a fresh OS-entropy generator; ``degrees_released`` must be the graph
    version's single stored degree release, never a fresh one per query.
    """
    require_personalized(mode, "blended")
    rng = rng if rng is not None else fresh_generator()
    counts = two_scale_common_neighbours(graph, seed, plan, rng, mode)
    return blend(graph, seed, counts, degrees_released, plan.candidate_scale, degrees_scale)
