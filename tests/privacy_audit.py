"""An empirical privacy audit: lower bounds on a mechanism's privacy loss from its own draws.

For neighbouring graphs G and G' and a mechanism M claimed (eps, delta)-DP, every event E
satisfies P[M(G) in E] <= e^eps P[M(G') in E] + delta, and the same with G and G' swapped. So
with p = P[M(G) in E] and q = P[M(G') in E],

    eps >= ln((p - delta) / q),

and with a one-sided Clopper-Pearson lower bound p_lo on p and upper bound q_hi on q,
``ln((p_lo - delta) / q_hi)`` is a lower bound on the true epsilon that holds with the stated
confidence. :func:`audit` computes it, in both directions, maximised over a family of events:

1. ``selection`` draws on G and on G' choose the family: the coordinates whose mean moves most
   between G and G' (with the direction they move in), and threshold tests on statistics of
   them (each coordinate alone; the smallest and the largest of their rank-transformed values,
   i.e. "all of them above / below a level", which is how a shift spread over two or three
   coordinates is seen; a linear score weighting every coordinate by its mean difference over
   its variance), thresholds at quantiles of the pooled selection draws. Each statistic puts
   forward its best event (threshold, side and direction) by its lower bound on the selection
   draws, and its best event that the favoured graph lands in at least ``CENTRAL_MASS`` of the
   time (a guard against a lucky tail event); the ``keep`` best of those are kept.
2. ``draws`` fresh draws on G and on G' evaluate only those events: Clopper-Pearson bounds at
   level ``alpha / (2 m)`` each for the m <= ``keep`` kept events (Bonferroni over the events
   and the two bounds of each), so the maximum is a lower bound with confidence at least 1 - alpha.

A correct mechanism therefore shows ``epsilon_lb > claimed`` with probability at most alpha;
a mis-scaled one is caught when its true loss exceeds the claim by more than the bound's
slack (which shrinks like 1/sqrt(draws)). The binomial intervals come from ``scipy.stats``
(the Clopper-Pearson bound is the beta quantile; ``scipy.stats.binomtest(...).proportion_ci(
method="exact")`` gives the same two-sided interval).

Draws come from :data:`Sampler` callables (``rng, count -> (count, d) array``) that the callers
build on the mechanisms' public entry points.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from service.embeddings.dp import (
    DEFAULT_EMBEDDING_SIGMA,
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    EMBEDDING_ROUNDS,
    exact_noisy_release,
    plan_dp_instant_embedding,
    plan_for_graph,
)
from service.embeddings.hashing import EmbeddingHashes, embedding_hashes
from service.embeddings.instant import instant_embedding
from service.graph.model import Graph
from service.graph.public_bounds import DEFAULT_MAX_DEGREE_BOUND
from service.mechanisms.common_neighbours import (
    common_neighbour_counts,
    count_noise_scales,
    noisy_common_neighbours,
    two_scale_common_neighbours,
)
from service.mechanisms.diffusion import noise_free_prefix
from service.mechanisms.engine import DiffusionJob, run_jobs
from service.mechanisms.floored_pushflowcap import pushflowcap_with_floor
from service.mechanisms.lazy_blend import blended_top
from service.mechanisms.popular import noisy_degrees
from service.mechanisms.postprocess import count_grid, round_to_grid
from service.privacy.calibration import DiffusionConfig, plan_diffusion
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    laplace_plan_for_scale,
    plan_laplace,
    plan_two_scale,
    two_scale_plan_for_scales,
)
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges

__all__ = [
    "CASES",
    "PAIRS",
    "PERSONALIZED_PAIRS",
    "SEED",
    "AuditCase",
    "AuditResult",
    "CaseSpec",
    "NeighbourPair",
    "Sampler",
    "audit",
    "blended_case",
    "clopper_pearson",
    "common_neighbours_case",
    "degree_case",
    "diffusion_case",
    "embedding_case",
    "epsilon_lower_bounds",
    "two_scale_case",
]

#: ``(rng, count) -> (count, d)`` float64 draws of one mechanism's output on one graph.
Sampler = Callable[[np.random.Generator, int], np.ndarray]

#: Quantile levels of the pooled selection draws used as thresholds.
THRESHOLD_LEVELS = np.concatenate(
    [np.linspace(0.02, 0.98, 49), [0.99, 0.995, 0.998, 0.999], [0.01, 0.005, 0.002, 0.001]]
)
#: Coordinates (by how much their mean moves) that the event family looks at.
TOP_COORDINATES = 3
#: A coordinate joins the conjunctions if its mean moves by more than this many standard errors.
CLEAR_SHIFT = 4.0
#: One-sided level of the bounds that rank events on the selection draws.
SELECTION_LEVEL = 1e-3
#: Each statistic also puts forward its best event that the favoured graph lands in at least
#: this often (see ``_select_events``).
CENTRAL_MASS = 0.1


@dataclass(frozen=True)
class NeighbourPair:
    """Draws of one mechanism on a graph G and on a neighbour G' (one edge toggled)."""

    name: str
    on_graph: Sampler
    on_neighbour: Sampler


@dataclass(frozen=True)
class AuditResult:
    """The empirical lower bound and how it was found."""

    epsilon_lb: float  # max over the kept events, both directions; may be -inf (nothing seen)
    claimed_epsilon: float
    delta: float
    confidence: float  # 1 - alpha
    draws: int  # evaluation draws per graph
    event: str  # the event (and direction) attaining epsilon_lb
    p_hat: float  # its empirical probability on the favoured graph
    q_hat: float  # and on the other

    def summary(self) -> str:
        return (
            f"eps_lb {self.epsilon_lb:.4f} (confidence {self.confidence}) vs claimed "
            f"{self.claimed_epsilon:.4f} at delta {self.delta:g}; {self.draws} draws per graph; "
            f"event {self.event}: p {self.p_hat:.5f}, q {self.q_hat:.5f}"
        )


def clopper_pearson(
    successes: np.ndarray, trials: int, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds, each holding with probability >= 1 - ``level``: the
    lower bound ``Beta(level; k, n - k + 1)`` (0 when k = 0) and the upper bound
    ``Beta(1 - level; k + 1, n - k)`` (1 when k = n)."""
    k = np.asarray(successes, dtype=np.float64)
    n = float(trials)
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, stats.beta.ppf(level, k, n - k + 1.0), 0.0)
        high = np.where(k < n, stats.beta.ppf(1.0 - level, k + 1.0, n - k), 1.0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def epsilon_lower_bounds(
    favoured: np.ndarray, other: np.ndarray, trials: int, delta: float, level: float
) -> np.ndarray:
    """ln((p_lo - delta) / q_hi) for events seen ``favoured`` times in the draws of one graph
    and ``other`` times in the other's (-inf where p_lo <= delta)."""
    p_lo, _ = clopper_pearson(favoured, trials, level)
    _, q_hi = clopper_pearson(other, trials, level)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.log(np.maximum(p_lo - delta, 0.0)) - np.log(q_hi)
    return np.asarray(np.where(p_lo > delta, bound, -np.inf), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class _Statistic:
    """A statistic of one draw: ``x @ weights`` ("linear"), or the smallest ("min") or largest
    ("max") of the oriented coordinates ``signs * x[coordinates]``, each rank-transformed by the
    pooled selection draws (``sorted_pooled``; with one coordinate, the oriented value
    itself)."""

    name: str
    kind: str
    coordinates: tuple[int, ...] = ()
    signs: tuple[float, ...] = ()
    sorted_pooled: tuple[np.ndarray, ...] = ()
    weights: np.ndarray | None = None

    def compute(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "linear":
            assert self.weights is not None
            return np.asarray(x @ self.weights, dtype=np.float64)
        if len(self.coordinates) == 1:
            return np.asarray(self.signs[0] * x[:, self.coordinates[0]], dtype=np.float64)
        ranks = np.stack(
            [
                np.searchsorted(pooled, sign * x[:, i], side="right") / pooled.shape[0]
                for i, sign, pooled in zip(
                    self.coordinates, self.signs, self.sorted_pooled, strict=True
                )
            ],
            axis=1,
        )
        return np.asarray(ranks.min(axis=1) if self.kind == "min" else ranks.max(axis=1))


def _statistics(on_graph: np.ndarray, on_neighbour: np.ndarray) -> list[_Statistic]:
    """The statistics the events threshold, chosen from the selection draws only."""
    diff = on_graph.mean(axis=0) - on_neighbour.mean(axis=0)
    var = 0.5 * (on_graph.var(axis=0) + on_neighbour.var(axis=0))
    live = var > 0.0
    effect = np.where(live, np.abs(diff) / np.sqrt(np.where(live, var, 1.0)), 0.0)
    # a coordinate joins only if its mean moves clearly (a noise coordinate in a conjunction
    # only dilutes it); the one that moves most always does
    clear = effect * math.sqrt(on_graph.shape[0] / 2.0) > CLEAR_SHIFT
    ranked = [int(i) for i in np.argsort(-effect, kind="stable") if effect[i] > 0]
    order = [i for i in ranked[:TOP_COORDINATES] if clear[i]] or ranked[:1]
    signs = {i: 1.0 if diff[i] >= 0 else -1.0 for i in order}
    pooled = {
        i: np.sort(signs[i] * np.concatenate([on_graph[:, i], on_neighbour[:, i]])) for i in order
    }
    out = [_Statistic(f"x[{i}]*{signs[i]:+.0f}", "min", (i,), (signs[i],)) for i in order]
    for size in range(2, len(order) + 1):
        chosen = tuple(order[:size])
        label = ",".join(str(i) for i in chosen)
        oriented = tuple(signs[i] for i in chosen)
        sorted_pooled = tuple(pooled[i] for i in chosen)
        for kind in ("min", "max"):
            name = f"{kind} rank x[{label}]"
            out.append(_Statistic(name, kind, chosen, oriented, sorted_pooled))
    if live.sum() > 1:
        weights = np.where(live, diff / np.where(live, var, 1.0), 0.0)
        out.append(_Statistic("linear score", "linear", weights=weights))
    return out


@dataclass(frozen=True)
class _Event:
    statistic: _Statistic
    threshold: float
    above: bool  # the event is {T > t} (else its complement {T <= t})
    graph_favoured: bool  # bound ln P_G / P_G' (else ln P_G' / P_G)

    def occurs(self, draws: np.ndarray) -> np.ndarray:
        above = self.statistic.compute(draws) > self.threshold
        return above if self.above else ~above

    def describe(self) -> str:
        side = ">" if self.above else "<="
        ratio = "G over G'" if self.graph_favoured else "G' over G"
        return f"{self.statistic.name} {side} {self.threshold:.6g} ({ratio})"


def _select_events(
    on_graph: np.ndarray, on_neighbour: np.ndarray, delta: float, keep: int
) -> list[_Event]:
    """Events chosen on the selection draws, each scored by its Clopper-Pearson bound at
    SELECTION_LEVEL (strict, so that a rare event that looks good by chance scores low): each
    statistic's best event (threshold, side and direction) and its best event among those the
    favoured graph lands in at least CENTRAL_MASS of the time, then the ``keep`` best of those.

    The second event is there because of the winner's curse: among some fifty thresholds, a
    tail event whose selection counts were lucky can outscore the central one that shows the
    loss reliably (a Laplace shift has the same likelihood ratio at every threshold past it,
    so the central event's bound is the tightest), and then fail on the fresh draws. The
    central event has counts in the thousands, which luck cannot move far."""
    trials = on_graph.shape[0]
    scored: dict[_Event, float] = {}
    for statistic in _statistics(on_graph, on_neighbour):
        t_graph, t_neighbour = statistic.compute(on_graph), statistic.compute(on_neighbour)
        thresholds = np.unique(
            np.quantile(np.concatenate([t_graph, t_neighbour]), THRESHOLD_LEVELS)
        )
        above_graph = (t_graph[:, None] > thresholds[None, :]).sum(axis=0)
        above_neighbour = (t_neighbour[:, None] > thresholds[None, :]).sum(axis=0)
        candidates: list[tuple[float, float, _Event]] = []  # (bound, favoured mass, event)
        for above, k_graph, k_neighbour in (
            (True, above_graph, above_neighbour),
            (False, trials - above_graph, trials - above_neighbour),
        ):
            for graph_favoured, fav, oth in ((True, k_graph, k_neighbour),
                                             (False, k_neighbour, k_graph)):  # fmt: skip
                bounds = epsilon_lower_bounds(fav, oth, trials, delta, SELECTION_LEVEL)
                for j in range(thresholds.shape[0]):
                    event = _Event(statistic, float(thresholds[j]), above, graph_favoured)
                    candidates.append((float(bounds[j]), float(fav[j]) / trials, event))
        central = [item for item in candidates if item[1] >= CENTRAL_MASS]
        for pool in (candidates, central):
            if pool:
                bound, _, event = max(pool, key=lambda item: item[0])
                scored[event] = bound
    ranked = sorted(scored.items(), key=lambda item: -item[1])
    return [event for event, _ in ranked[:keep]]


def _draw(sampler: Sampler, rng: np.random.Generator, count: int) -> np.ndarray:
    draws = np.asarray(sampler(rng, count), dtype=np.float64)
    if draws.ndim != 2 or draws.shape[0] != count:
        raise ValueError(f"a sampler returned shape {draws.shape} for {count} draws")
    return draws


def audit(
    pair: NeighbourPair,
    *,
    claimed_epsilon: float,
    delta: float,
    draws: int,
    selection_draws: int,
    rng: np.random.Generator,
    alpha: float = 1e-6,
    keep: int = 4,
) -> AuditResult:
    """The empirical lower bound on ``pair``'s epsilon at confidence 1 - ``alpha``: events
    chosen on ``selection_draws`` draws per graph, evaluated on ``draws`` fresh ones."""
    if not 0.0 < alpha < 1.0 or keep < 1 or draws < 1 or selection_draws < 1:
        raise ValueError("audit needs 0 < alpha < 1 and positive counts")
    events = _select_events(
        _draw(pair.on_graph, rng, selection_draws),
        _draw(pair.on_neighbour, rng, selection_draws),
        delta,
        keep,
    )
    on_graph, on_neighbour = _draw(pair.on_graph, rng, draws), _draw(pair.on_neighbour, rng, draws)
    level = alpha / (2 * max(len(events), 1))
    best = AuditResult(-math.inf, claimed_epsilon, delta, 1.0 - alpha, draws, "none", 0.0, 0.0)
    for event in events:
        k_graph = int(event.occurs(on_graph).sum())
        k_neighbour = int(event.occurs(on_neighbour).sum())
        fav, oth = (k_graph, k_neighbour) if event.graph_favoured else (k_neighbour, k_graph)
        bound = float(
            epsilon_lower_bounds(np.array([fav]), np.array([oth]), draws, delta, level)[0]
        )
        if bound > best.epsilon_lb or best.event == "none":
            best = AuditResult(
                bound, claimed_epsilon, delta, 1.0 - alpha, draws, event.describe(),
                fav / draws, oth / draws,
            )  # fmt: skip
    return best


# --------------------------------------------------------------------------------------------
# The audited cases: every served release, worst-case neighbouring pairs, real and mis-scaled.
# --------------------------------------------------------------------------------------------
#
# Parameters are picked where the harness has power (a tiny graph, claimed eps 1, one noisy
# diffusion step, a threshold eta small enough that the diffusion's clipping binds); the
# reasons are in tests/test_privacy_regression.py.

Edge = tuple[int, int]

#: The seed of every per-seed release.
SEED = 0
#: Nodes of the audit graph (ids 0..15; a node may have no edge: the node set is an input).
NODES = 16
#: The audit graph G. The seed 0 has the friends 1, 2 (degree 1) and 3 (degree 2); 4, 5, 7 are
#: not friends; 6 has no edge; 8-9 is a separate low-degree pair; 10 is the hub, the only node
#: of the largest degree (7).
BASE_EDGES: tuple[Edge, ...] = (
    (0, 1), (0, 2), (0, 3),
    (3, 5), (4, 5), (5, 7),
    (8, 9),
    (10, 4), (10, 5), (10, 11), (10, 12), (10, 13), (10, 14), (10, 15),
)  # fmt: skip
#: The neighbouring pairs: G' = G plus one edge (removing it is the same pair read the other
#: way: the audit bounds both directions).
PAIRS: dict[str, Edge] = {
    "friend-friend": (1, 2),  # two of the seed's friends (both of degree 1)
    "friend-non-friend": (1, 4),  # a friend and a node two hops from the seed
    "pendant": (2, 6),  # node 6's only edge, to a friend
    "bridge": (1, 8),  # joins two components through two nodes of degree 1
    "max-degree": (1, 10),  # a friend to the hub, the node of the largest degree
    "seed-non-friend": (0, 4),  # the seed's own edge (protected in edge mode only)
    "seed-pendant": (0, 6),  # node 6's only edge, to the seed
    "seed-max-degree": (0, 10),  # the seed's own edge to the hub
    "far": (9, 11),  # two nodes that are not the seed's friends
}
#: Copies of the audit graph drawn in one call of a count or degree release (see below).
UNION_COPIES = 2048
#: Diffusion queries run through the batched engine at once.
DIFFUSION_BATCH = 4096


def pair_edges(pair: str) -> tuple[tuple[Edge, ...], tuple[Edge, ...]]:
    """The edge lists of G and G' for ``pair``."""
    return BASE_EDGES, (*BASE_EDGES, PAIRS[pair])


@functools.cache
def audit_graph(edges: tuple[Edge, ...]) -> Graph:
    return graph_from_edges(edges, NODES)


@functools.cache
def _disjoint_copies(edges: tuple[Edge, ...], copies: int) -> Graph:
    shifted = [(u + r * NODES, v + r * NODES) for r in range(copies) for u, v in edges]
    return graph_from_edges(shifted, NODES * copies)


@functools.cache
def _seed_shared_copies(edges: tuple[Edge, ...], copies: int) -> tuple[Graph, np.ndarray]:
    """``copies`` copies of G that share the seed (node 0 of the union) and nothing else, and
    the union index of each copy's nodes ((copies, NODES); the seed's column is 0)."""
    assert SEED == 0
    index = np.zeros((copies, NODES), dtype=np.int64)
    index[:, 1:] = 1 + np.arange(copies)[:, None] * (NODES - 1) + np.arange(NODES - 1)[None, :]
    union = [(int(index[r, u]), int(index[r, v])) for r in range(copies) for u, v in edges]
    return graph_from_edges(union, 1 + copies * (NODES - 1)), index


def _in_rounds(draw_round: Callable[[np.random.Generator, int], np.ndarray]) -> Sampler:
    """``count`` draws from rounds of ``draw_round(rng, wanted)``, which returns at least one
    draw and may return more than the ``wanted`` still missing (the extra are dropped)."""

    def sample(rng: np.random.Generator, count: int) -> np.ndarray:
        rounds: list[np.ndarray] = []
        total = 0
        while total < count:
            rounds.append(draw_round(rng, count - total))
            total += rounds[-1].shape[0]
        return np.concatenate(rounds)[:count]

    return sample


def degree_release_sampler(edges: tuple[Edge, ...], scale: float) -> Sampler:
    """``popular``'s release d + Lap(scale)^n on G, drawn by ``noisy_degrees``.

    One call on the disjoint union of UNION_COPIES copies of G is UNION_COPIES independent
    draws on G: each copy's degrees are G's and the noise is i.i.d. per node."""
    plan = laplace_plan_for_scale(DEGREE_SENSITIVITY, scale)

    def draw_round(rng: np.random.Generator, wanted: int) -> np.ndarray:
        union = _disjoint_copies(edges, UNION_COPIES)
        return np.asarray(noisy_degrees(union, plan, rng)).reshape(UNION_COPIES, NODES)

    return _in_rounds(draw_round)


CountRelease = Callable[[Graph, np.random.Generator], np.ndarray]


def count_release_sampler(edges: tuple[Edge, ...], release: CountRelease) -> Sampler:
    """A seed's count release on G (``release(graph, rng)`` draws it for SEED), with the seed's
    own coordinate set to 0 (its count d_s is the seed's own data, not protected; the
    two-scale release does not publish it at all).

    One call on UNION_COPIES copies of G that share only the seed is UNION_COPIES
    independent draws on G: a node v != s of copy r has all its neighbours in copy r or s, so
    |N(s) & N(v)| and whether v is a friend of s are those of G, and the noise is independent
    per node with the scale fixed by that status."""

    def draw_round(rng: np.random.Generator, wanted: int) -> np.ndarray:
        union, index = _seed_shared_copies(edges, UNION_COPIES)
        draws: np.ndarray = np.asarray(release(union, rng), dtype=np.float64)[index]
        draws[:, SEED] = 0.0
        return draws

    return _in_rounds(draw_round)


def one_scale_counts(scale: float) -> CountRelease:
    """``common_neighbours``' release with Lap(scale) noise, by ``noisy_common_neighbours``."""
    plan = laplace_plan_for_scale(COMMON_NEIGHBOUR_SENSITIVITY, scale)
    return lambda graph, rng: noisy_common_neighbours(graph, SEED, plan, rng)


def two_scale_counts(friend_scale: float, candidate_scale: float) -> CountRelease:
    """``friends_of_friends``' (and ``blended``'s) release, by ``two_scale_common_neighbours``."""
    plan = two_scale_plan_for_scales(friend_scale, candidate_scale)
    return lambda graph, rng: two_scale_common_neighbours(graph, SEED, plan, rng)


def diffusion_sampler(edges: tuple[Edge, ...], config: DiffusionConfig) -> Sampler:
    """The noisy diffusion's x_K for SEED on G with ``config``, up to DIFFUSION_BATCH queries
    at a time (never more than the draws still wanted) through the batched engine that serves
    it (``run_jobs``: each query one column with its own noise; ``noisy_diffusion`` runs one
    such column). As in serving, every query has its own generator (children of a seed
    sequence drawn from ``rng``), so the draws do not depend on how the engine's threads share
    out the columns."""

    def draw_round(rng: np.random.Generator, wanted: int) -> np.ndarray:
        graph = audit_graph(edges)
        parent = np.random.SeedSequence([int(word) for word in rng.integers(0, 2**63, size=4)])
        generators = [
            np.random.Generator(np.random.PCG64DXSM(child))
            for child in parent.spawn(min(wanted, DIFFUSION_BATCH))
        ]
        jobs = [DiffusionJob(SEED, config, own, keep_prefix=False) for own in generators]
        run_jobs(graph, jobs)
        return np.stack([job.future.result().scores for job in jobs])

    return _in_rounds(draw_round)


@dataclass(frozen=True)
class AuditCase:
    """One mechanism, mode and neighbouring pair: the real release and its control (the same
    release with its noise scale divided by ``control_factor``, claiming the same epsilon).

    ``pair_loss`` is the exact pure-DP loss of the real release on this pair,
    sum_i |E[out_G]_i - E[out_G']_i| / b_i, where the output is a fixed vector plus independent
    Laplace noise (or, for one noisy diffusion step, the sum of two Laplace draws, whose
    log-density is also 1/b-Lipschitz); None where it is not of that form. The empirical bound
    can only approach it in the far tails."""

    mechanism: str
    mode: str
    pair: str
    claimed_epsilon: float
    delta: float
    real: NeighbourPair
    control: NeighbourPair
    control_factor: float
    pair_loss: float | None
    claimed_pure: float  # the claim at delta 0 (equal to claimed_epsilon for pure releases)
    real_config: DiffusionConfig | None = None  # the diffusion's served configuration

    @property
    def name(self) -> str:
        return f"{self.mechanism}/{self.mode}/{self.pair}"


def _pair(name: str, make: Callable[[tuple[Edge, ...]], Sampler]) -> NeighbourPair:
    on_graph, on_neighbour = pair_edges(name)
    return NeighbourPair(name, make(on_graph), make(on_neighbour))


def _shift(pair: str, exact: Callable[[Graph], np.ndarray]) -> np.ndarray:
    on_graph, on_neighbour = pair_edges(pair)
    shift: np.ndarray = np.abs(exact(audit_graph(on_graph)) - exact(audit_graph(on_neighbour)))
    return shift


#: Claimed epsilon of every audited release (the harness has most power around 1).
EPSILON = 1.0
#: The diffusion's delta and parameters (see tests/test_privacy_regression.py).
DIFFUSION_DELTA = 1e-6
DIFFUSION_BETA = 0.8
DIFFUSION_ETA = 0.05
#: Steps per mode: the first step that carries noise is the last one (L = 1).
DIFFUSION_STEPS = {Mode.PERSONALIZED: 2, Mode.EDGE: 1}


def degree_case(pair: str, factor: float) -> AuditCase:
    """``popular``'s degree release (one release for both modes)."""
    plan = plan_laplace(EPSILON, DEGREE_SENSITIVITY)
    loss = float(_shift(pair, lambda g: g.degrees.astype(np.float64)).sum() / plan.scale)
    return AuditCase(
        "popular", "both", pair, plan.epsilon, 0.0,
        _pair(pair, lambda e: degree_release_sampler(e, plan.scale)),
        _pair(pair, lambda e: degree_release_sampler(e, plan.scale / factor)),
        factor, loss, plan.epsilon,
    )  # fmt: skip


def _count_shift(pair: str) -> np.ndarray:
    shift = _shift(pair, lambda g: common_neighbour_counts(g, SEED))
    shift[SEED] = 0.0
    return shift


def common_neighbours_case(pair: str, factor: float) -> AuditCase:
    plan = plan_laplace(EPSILON, COMMON_NEIGHBOUR_SENSITIVITY)
    loss = float(_count_shift(pair).sum() / plan.scale)
    return AuditCase(
        "common_neighbours", "personalized", pair, plan.epsilon, 0.0,
        _pair(pair, lambda e: count_release_sampler(e, one_scale_counts(plan.scale))),
        _pair(pair, lambda e: count_release_sampler(e, one_scale_counts(plan.scale / factor))),
        factor, loss, plan.epsilon,
    )  # fmt: skip


def two_scale_case(pair: str, factor: float) -> AuditCase:
    """The two-scale counts that ``friends_of_friends`` ranks and ``blended`` blends."""
    plan = plan_two_scale(EPSILON)
    real = two_scale_counts(plan.friend_scale, plan.candidate_scale)
    control = two_scale_counts(plan.friend_scale / factor, plan.candidate_scale / factor)
    scales = count_noise_scales(audit_graph(BASE_EDGES), SEED, plan)
    live = scales > 0
    loss = float((_count_shift(pair)[live] / scales[live]).sum())
    return AuditCase(
        "friends_of_friends", "personalized", pair, plan.epsilon, 0.0,
        _pair(pair, lambda e: count_release_sampler(e, real)),
        _pair(pair, lambda e: count_release_sampler(e, control)),
        factor, loss, plan.epsilon,
    )  # fmt: skip


def blended_sampler(
    edges: tuple[Edge, ...], friend_scale: float, candidate_scale: float, degree_scale: float
) -> Sampler:
    """``blended`` as served, by the lazy path (``blended_top``): each draw is a new graph
    version's degree release (``popular``'s, rounded to its grid as the service stores it) and
    one query's two-scale counts, blended and ranked for SEED with k covering every node; the
    draw is every node's served score (the seed's 0). One call per draw: the blend reads the
    whole graph (the degrees' spread, the hold-out check), so copies of G are not independent
    draws of it."""
    graph = audit_graph(edges)
    plan = two_scale_plan_for_scales(friend_scale, candidate_scale)
    degree_plan = laplace_plan_for_scale(DEGREE_SENSITIVITY, degree_scale)
    grid = count_grid(degree_scale)

    def sample(rng: np.random.Generator, count: int) -> np.ndarray:
        draws = np.zeros((count, NODES))
        for row in range(count):
            degrees = round_to_grid(noisy_degrees(graph, degree_plan, rng, grid=grid), grid)
            top = blended_top(graph, SEED, plan, degrees, degree_scale, NODES - 1, rng)
            draws[row, top.indices] = top.scores
        return draws

    return sample


def blended_case(pair: str, factor: float) -> AuditCase:
    """``blended`` by its lazy top, run directly: claim eps + eps_d, the two audited releases it
    composes (the counts as ``friends_of_friends``', the degrees as ``popular``'s); the
    control divides all three noise scales by ``factor``. No exact pair loss: the served
    scores are a ranking of both releases."""
    counts = plan_two_scale(EPSILON)
    degrees = plan_laplace(EPSILON, DEGREE_SENSITIVITY)
    claim = counts.epsilon + degrees.epsilon

    def make(divide: float) -> Callable[[tuple[Edge, ...]], Sampler]:
        return lambda e: blended_sampler(
            e, counts.friend_scale / divide, counts.candidate_scale / divide,
            degrees.scale / divide,
        )  # fmt: skip

    return AuditCase(
        "blended", "personalized", pair, claim, 0.0, _pair(pair, make(1.0)),
        _pair(pair, make(factor)), factor, None, claim,
    )  # fmt: skip


def diffusion_case(mode: Mode, pair: str, factor: float, steps: int | None = None) -> AuditCase:
    """Noisy diffusion, calibrated by the service's own ``plan_diffusion``."""
    steps = DIFFUSION_STEPS[mode] if steps is None else steps
    plan = plan_diffusion(EPSILON, DIFFUSION_DELTA, steps, DIFFUSION_BETA, DIFFUSION_ETA, mode)
    config = plan.config
    mis_scaled = replace(config, noise_scale=config.noise_scale / factor)
    loss = None
    if config.noisy_steps == 1:  # x_K = the noise-free K steps + xi1 + xi2
        # at the calibrated scale b (the engine draws at b (1 + kappa), a hair larger, so the
        # loss it releases is at most this)
        shift = _shift(
            pair, lambda g: noise_free_prefix(g, SEED, mode, config.beta, config.eta, steps)
        )
        loss = float(shift.sum() / config.noise_scale)
    return AuditCase(
        "noisy_diffusion", mode.value, pair, plan.epsilon, plan.delta,
        _pair(pair, lambda e: diffusion_sampler(e, config)),
        _pair(pair, lambda e: diffusion_sampler(e, mis_scaled)),
        factor, loss, plan.curve.pure, config,
    )  # fmt: skip


#: DP-IE (``dp_instant_embedding``) on the audit graph: the graph pair's embedding dimension
#: and salt (one bucket, k = 1: every node's signed log-mass lands in the coordinate that moves)
#: and sigma at its largest bound (the graph pairs move most there).
EMBEDDING_GRAPH_K = 1
EMBEDDING_GRAPH_SIGMA = 1.0
#: The "bound" pair: capped PPR vectors p, p' with ||p - p'||_1 = sigma (Theorem 4.3's bound)
#: that move EMBEDDING_MOVERS nodes from n p_v = 1 upwards, all hashed to bucket 0 with sign +1
#: (k = 2), so that ||w - w'||_1 = m ln(1 + n sigma / m) is within 0.2% of Theorem 5.1's
#: sigma n at the default sigma.
EMBEDDING_BOUND_K = 2
EMBEDDING_MOVERS = 4
EMBEDDING_SALT = bytes(16)


@functools.cache
def _audit_hashes(k: int) -> EmbeddingHashes:
    return embedding_hashes([str(v) for v in range(NODES)], EMBEDDING_SALT, k)


def embedding_bound_vectors() -> tuple[np.ndarray, np.ndarray, float]:
    """(p, p', sigma) of the "bound" pair: p_v = 1/n on the movers (the first
    EMBEDDING_MOVERS nodes other than the seed in bucket 0 with sign +1), 1/(2n) elsewhere;
    p' adds sigma / m to each mover. Both are valid capped PPR vectors (non-negative, sum
    below 1), and no graph pair on the audit graph moves the embedding this much (see
    tests/test_privacy_regression.py), so this pair audits the noise at the sensitivity the
    proofs allow, through the served function (``capped=`` replaces only PushFlowCap)."""
    hashes = _audit_hashes(EMBEDDING_BOUND_K)
    movers = [
        v for v in range(NODES)
        if v != SEED and hashes.buckets[v] == 0 and hashes.signs[v] > 0
    ][:EMBEDDING_MOVERS]  # fmt: skip
    assert len(movers) == EMBEDDING_MOVERS, "the audit salt must hash enough movers together"
    sigma = DEFAULT_EMBEDDING_SIGMA
    p = np.full(NODES, 0.5 / NODES)
    p[movers] = 1.0 / NODES
    moved = p.copy()
    moved[movers] += sigma / EMBEDDING_MOVERS
    return p, moved, sigma


def embedding_sampler(
    edges: tuple[Edge, ...], mode: Mode, k: int, sigma: float, epsilon: float,
    capped: np.ndarray | None,
) -> Sampler:  # fmt: skip
    """DP-IE draws for SEED on G: ``count`` draws at once by the served release step,
    ``exact_noisy_release`` (the step ``dp_instant_embedding`` ends with, and the one the
    all-node release calls on a matrix of embeddings), on ``count`` copies of SEED's
    instant embedding. Every coordinate gets its own exact draw from the generator, so the
    rows are independent draws of the served release on G; with one row and the same
    generator a draw is the served ``dp_instant_embedding`` bit for bit
    (tests/test_privacy_regression.py checks it). PushFlowCap is computed once by the
    service's own ``pushflowcap_with_floor`` (the ``capped`` the served function would
    compute) unless given; the plan and the embedding are those the served function computes."""
    graph = audit_graph(edges)
    hashes = _audit_hashes(k)
    if capped is None:
        capped = pushflowcap_with_floor(
            graph, SEED, EMBEDDING_BETA, EMBEDDING_ROUNDS, sigma, mode, EMBEDDING_FLOOR
        )
    plan = plan_for_graph(epsilon, sigma, graph, rounds=EMBEDDING_ROUNDS)
    embedded = instant_embedding(capped, hashes)

    def sample(rng: np.random.Generator, count: int) -> np.ndarray:
        copies = np.broadcast_to(embedded, (count, embedded.shape[0]))
        released, _ = exact_noisy_release(copies, plan, sigma, graph.n, rng)
        return released

    return sample


def embedding_case(mode: Mode, pair: str, factor: float) -> AuditCase:
    """DP-IE in ``mode`` on a graph pair of the audit graph (k = 1, sigma 1), or on the
    "bound" pair (k = 2, the default sigma). The control claims the same epsilon with the
    noise scale divided by ``factor`` (drawn at epsilon * factor)."""
    if pair == "bound":
        p, moved, sigma = embedding_bound_vectors()
        k = EMBEDDING_BOUND_K
        on_graph, on_neighbour = BASE_EDGES, BASE_EDGES  # the graph is not read
        capped = (p, moved)
    else:
        sigma, k = EMBEDDING_GRAPH_SIGMA, EMBEDDING_GRAPH_K
        on_graph, on_neighbour = pair_edges(pair)
        capped = tuple(
            pushflowcap_with_floor(
                audit_graph(e),
                SEED,
                EMBEDDING_BETA,
                EMBEDDING_ROUNDS,
                sigma,
                mode,
                EMBEDDING_FLOOR,
            )
            for e in (on_graph, on_neighbour)
        )
    plan = plan_dp_instant_embedding(
        EPSILON, sigma, NODES, rounds=EMBEDDING_ROUNDS, degree_bound=DEFAULT_MAX_DEGREE_BOUND
    )
    hashes = _audit_hashes(k)
    shift = np.abs(instant_embedding(capped[0], hashes) - instant_embedding(capped[1], hashes))
    loss = float(shift.sum() / plan.scale)

    def pair_of(epsilon: float) -> NeighbourPair:
        return NeighbourPair(
            pair,
            embedding_sampler(on_graph, mode, k, sigma, epsilon, capped[0]),
            embedding_sampler(on_neighbour, mode, k, sigma, epsilon, capped[1]),
        )

    return AuditCase(
        "dp_instant_embedding", mode.value, pair, plan.epsilon, 0.0,
        pair_of(EPSILON), pair_of(EPSILON * factor), factor, loss, plan.epsilon,
    )  # fmt: skip


@dataclass(frozen=True)
class CaseSpec:
    """An audited case and its controls' factors: ``test_factor`` is caught at the test's draw
    counts, ``bench_factor`` (smaller) at the benchmark's 200k draws."""

    mechanism: str
    mode: str
    pair: str
    test_factor: float
    bench_factor: float
    steps: int | None = None  # the diffusion's K, if not the mode's DIFFUSION_STEPS

    @property
    def name(self) -> str:
        suffix = "" if self.steps is None else f"/K={self.steps}"
        return f"{self.mechanism}/{self.mode}/{self.pair}{suffix}"

    def build(self, factor: float) -> AuditCase:
        if self.mechanism == "popular":
            return degree_case(self.pair, factor)
        if self.mechanism == "common_neighbours":
            return common_neighbours_case(self.pair, factor)
        if self.mechanism == "friends_of_friends":
            return two_scale_case(self.pair, factor)
        if self.mechanism == "blended":
            return blended_case(self.pair, factor)
        if self.mechanism == "dp_instant_embedding":
            return embedding_case(Mode(self.mode), self.pair, factor)
        return diffusion_case(Mode(self.mode), self.pair, factor, self.steps)


#: The pairs that are neighbouring in personalized mode (the seed's own edges are not protected
#: there) and in edge mode at one step (only the seed's own edges reach x_1; the others leave
#: it unchanged, which tests/test_privacy_regression.py checks exactly).
PERSONALIZED_PAIRS = ("friend-friend", "friend-non-friend", "pendant", "bridge", "max-degree")
EDGE_STEP_PAIRS = ("seed-non-friend", "seed-pendant", "seed-max-degree")

#: Every audited case. Factors: a pair whose exact loss is the claim (the Laplace releases'
#: tight pairs, the diffusion's friend-friend pair) gets a control at 1.5x / 1.25x (Laplace)
#: or 4x / 2x (diffusion: its claim is reached only in the far tails of a sum of two Laplace
#: draws); a pair whose exact loss is half the claim gets twice those factors.
CASES: tuple[CaseSpec, ...] = (
    *(CaseSpec("popular", "both", pair, 1.5, 1.25)
      for pair in (*PERSONALIZED_PAIRS, "seed-non-friend")),
    CaseSpec("common_neighbours", "personalized", "friend-friend", 1.5, 1.25),
    *(CaseSpec("common_neighbours", "personalized", pair, 3.0, 2.5)
      for pair in PERSONALIZED_PAIRS[1:]),
    *(CaseSpec("friends_of_friends", "personalized", pair, 1.5, 1.25)
      for pair in PERSONALIZED_PAIRS),
    # blended by its lazy top, run directly (one draw per call): the served scores rank two
    # releases, so the real release shows about 0.23-0.26 of its claim 2; at 6,000 draws a 4x
    # control showed 2.97, 3x 2.28 (the benchmark's, at 200k draws) and 2x 1.09 (not caught);
    # at the test's 1,200 draws an 8x control showed 2.82-2.87 (3.25-3.41 at 2,000)
    CaseSpec("blended", "personalized", "friend-non-friend", 8.0, 3.0),
    CaseSpec("noisy_diffusion", "personalized", "friend-friend", 4.0, 2.0),
    *(CaseSpec("noisy_diffusion", "personalized", pair, 8.0, 4.0)
      for pair in PERSONALIZED_PAIRS[1:]),
    *(CaseSpec("noisy_diffusion", "edge", pair, 8.0, 4.0) for pair in EDGE_STEP_PAIRS),
    CaseSpec("dp_instant_embedding", "edge", "bound", 1.6, 1.3),
    CaseSpec("dp_instant_embedding", "personalized", "bound", 1.6, 1.3),
    CaseSpec("dp_instant_embedding", "edge", "seed-max-degree", 100.0, 70.0),
    # Two noisy steps (edge mode, K = 2): the seed's own edge to a node without edges moves
    # both steps (the seed's column of W and its threshold change at step 1 and again at step
    # 2), so about half the claim is lost on this pair; its control is caught at 8x (measured
    # lower bounds 1.46-1.70 at the test's draws, 1.01 at 6x; at 50k draws a 4x control showed
    # 0.989, not caught, so the benchmark tries 6x).
    CaseSpec("noisy_diffusion", "edge", "seed-pendant", 8.0, 6.0, steps=2),
)  # fmt: skip
