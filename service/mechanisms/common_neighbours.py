"""``common_neighbours`` (personalized mode only): c(v) = |N(s) & N(v)| + Lap(2 / eps).

With the seed's own edges public to the seed, an edge {a, b} with a, b != s changes c(b) by 1
iff a is in N(s), and c(a) by 1 iff b is in N(s), and nothing else: l1 sensitivity 2, so one
release is pure eps-DP for the protected edges (docs/ranking.md; brute-forced in
tests/test_ranking_sensitivity.py). In `edge` mode an edge {s, a} changes c on all of N(a):
unbounded, so the mechanism is refused there.

:func:`two_scale_common_neighbours` releases the same counts with two scales split by the
seed's own neighbour list (public to the seed in personalized mode): Lap(b) on the friends
N(s), Lap(b / 2) on the candidates V minus N(s) and s, for the same epsilon (an edge moves two
friend counts or one candidate count, never both: docs/ranking.md, Lemma 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.exact_laplace import (
    dyadic_scale,
    gamma_ratio,
    grid_laplace,
    rounded_laplace,
)
from service.mechanisms.lazy_top_k import lazy_rank_to_index, lazy_top
from service.mechanisms.operator import walk_operator
from service.mechanisms.postprocess import checked_count_grid
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.ranking_kernels import ranked_positions
from service.privacy.laplace import COMMON_NEIGHBOUR_SENSITIVITY, LaplacePlan, TwoScalePlan
from service.privacy.modes import Mode

__all__ = [
    "Neighbourhood",
    "NoisyNeighbourhood",
    "common_neighbour_counts",
    "common_neighbours_top",
    "count_noise_scales",
    "neighbourhood_counts",
    "noisy_common_neighbours",
    "noisy_neighbourhood",
    "ranked_candidates",
    "require_personalized",
    "split_neighbourhood",
    "two_scale_common_neighbours",
]


def require_personalized(mode: Mode | str, mechanism: str) -> None:
    if Mode(mode) is not Mode.PERSONALIZED:
        raise InvalidParameter(
            "mechanism",
            f"{mechanism} uses the seed's own edges, which edge mode protects "
            "(its sensitivity there is unbounded); use mode=personalized",
        )


def common_neighbour_counts(graph: Graph, seed: int) -> np.ndarray:
    """c(v) = |N(seed) & N(v)| for every node v (exact, float64; c(seed) = d(seed))."""
    if not 0 <= seed < graph.n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {graph.n})")
    indicator = np.zeros(graph.n, dtype=np.float64)
    indicator[graph.neighbors(seed)] = 1.0
    # A @ indicator on the graph's own index arrays (exact: sums of ones), without building
    # a float64 data array of 8 bytes per stored entry in every worker
    return walk_operator(graph).adjacency_product(indicator)


def _require_count_release(plan: LaplacePlan, mode: Mode | str) -> None:
    """``common_neighbours`` is offered in personalized mode only, and its plan must be
    calibrated to the counts' sensitivity (an edge moves two counts by one)."""
    require_personalized(mode, "common_neighbours")
    if plan.sensitivity < COMMON_NEIGHBOUR_SENSITIVITY:
        raise InvalidParameter(
            "sensitivity",
            f"common-neighbour counts have sensitivity {COMMON_NEIGHBOUR_SENSITIVITY}",
        )


def noisy_common_neighbours(
    graph: Graph,
    seed: int,
    plan: LaplacePlan,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    grid: float | None = None,
) -> np.ndarray:
    """c + g N, exactly round_g(c + Lap(b')^n) with b' = dyadic_scale(plan.scale) (the exact
    sampler, :func:`service.mechanisms.exact_laplace.grid_laplace`). ``grid``: a power of two
    at most 1 (default :func:`service.mechanisms.postprocess.count_grid` of the scale); ``rng``
    defaults to a fresh OS-entropy generator."""
    _require_count_release(plan, mode)
    counts = common_neighbour_counts(graph, seed)
    rng = rng if rng is not None else fresh_generator()
    grid = checked_count_grid(grid, plan.scale)
    released: np.ndarray = counts + grid_laplace(rng, plan.scale, grid, count=graph.n)
    return released


def count_noise_scales(graph: Graph, seed: int, plan: TwoScalePlan) -> np.ndarray:
    """The Laplace scale of each node's released count: ``plan.friend_scale`` on N(seed),
    ``plan.candidate_scale`` elsewhere, 0 on the seed (its count is not released)."""
    scales = np.full(graph.n, plan.candidate_scale, dtype=np.float64)
    scales[graph.neighbors(seed)] = plan.friend_scale
    scales[seed] = 0.0
    return scales


def two_scale_common_neighbours(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    grid: float | None = None,
) -> np.ndarray:
    """c + Lap(plan.friend_scale) on the seed's friends, c + Lap(plan.candidate_scale) on every
    other node but the seed, and 0 on the seed (not released: its count d(seed) is the seed's
    own). Each released count is c + g N with N from the exact sampler at its node's scale
    (dyadic_scale of it; :func:`service.mechanisms.exact_laplace.grid_laplace`, the candidates
    drawn first, then the friends); ``grid``: a power of two at most 1 (default
    :func:`service.mechanisms.postprocess.count_grid` of the smaller scale); ``rng`` defaults to
    a fresh OS-entropy generator."""
    require_personalized(mode, "two-scale common neighbours")
    counts = common_neighbour_counts(graph, seed)
    rng = rng if rng is not None else fresh_generator()
    grid = checked_count_grid(grid, min(plan.friend_scale, plan.candidate_scale))
    released: np.ndarray = counts + grid_laplace(rng, count_noise_scales(graph, seed, plan), grid)
    released[seed] = 0.0
    return released


def neighbourhood_counts(graph: Graph, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The nonzero entries of :func:`common_neighbour_counts`: (nodes, counts), the nodes sorted
    (the seed among them when it has a friend), from the seed's friends' neighbour lists only."""
    if not 0 <= seed < graph.n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {graph.n})")
    friends = graph.neighbors(seed).astype(np.int64)
    starts = graph.indptr[friends].astype(np.int64)
    lengths = graph.indptr[friends + 1].astype(np.int64) - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    reached = graph.indices[offsets + np.arange(total, dtype=np.int64)]
    nodes, counts = np.unique(reached, return_counts=True)
    return nodes.astype(np.int64), counts.astype(np.float64)


@dataclass(frozen=True)
class Neighbourhood:
    """The seed's friends and the other nodes with a common neighbour, with their counts:
    ``friends`` (sorted, without the seed) and ``friend_counts``; ``explicit`` (sorted, neither
    a friend nor the seed) and ``counts``; ``excluded``, the sorted union of the three (the
    nodes that are not lazy)."""

    friends: np.ndarray
    friend_counts: np.ndarray
    explicit: np.ndarray
    counts: np.ndarray
    excluded: np.ndarray


def split_neighbourhood(graph: Graph, seed: int) -> Neighbourhood:
    """:func:`neighbourhood_counts` split into the seed's friends and the other candidates."""
    nodes, counts = neighbourhood_counts(graph, seed)
    friends = np.unique(graph.neighbors(seed).astype(np.int64))
    friends = friends[friends != seed]  # no self-loops in a Graph; the seed is never ranked
    at = np.searchsorted(nodes, friends)  # every friend has the seed as a common neighbour...
    found = at < nodes.shape[0]
    found[found] = nodes[at[found]] == friends[found]
    friend_counts = np.zeros(friends.shape[0])
    friend_counts[found] = counts[at[found]]  # ...but the seed is no friend of itself
    others = nodes != seed
    others[at[found]] = False  # the friends among the nodes
    explicit = nodes[others]
    # disjoint, each without repeats: their sorted union
    excluded = np.sort(np.concatenate([explicit, friends, np.array([seed], dtype=np.int64)]))
    return Neighbourhood(friends, friend_counts, explicit, counts[others], excluded)


@dataclass(frozen=True)
class NoisyNeighbourhood:
    """A :class:`Neighbourhood` with its explicit counts released on ``grid``: c + g N at the
    candidates' scale (``candidate_values``, drawn first), then at the friends'
    (``friend_values``), grid_laplace's order of scales; ``candidate_ratio``, the candidates'
    (s, t), which the lazy nodes' noise shares."""

    hood: Neighbourhood
    grid: float
    candidate_ratio: tuple[int, int]
    candidate_values: np.ndarray
    friend_values: np.ndarray


def noisy_neighbourhood(
    graph: Graph, seed: int, plan: TwoScalePlan, rng: np.random.Generator, grid: float | None
) -> NoisyNeighbourhood:
    """The seed's :class:`Neighbourhood` and the noise of its explicit counts, as
    ``friends_of_friends`` and ``blended`` draw them before their lazy nodes; ``grid``: as
    :func:`two_scale_common_neighbours` takes it."""
    grid = checked_count_grid(grid, min(plan.friend_scale, plan.candidate_scale))
    s_f, t_f = gamma_ratio(grid, dyadic_scale(plan.friend_scale))
    s_c, t_c = gamma_ratio(grid, dyadic_scale(plan.candidate_scale))
    hood = split_neighbourhood(graph, seed)
    candidates = hood.counts + rounded_laplace(rng, s_c, t_c, hood.explicit.shape[0]) * grid
    friends = hood.friend_counts + rounded_laplace(rng, s_f, t_f, hood.friends.shape[0]) * grid
    return NoisyNeighbourhood(hood, grid, (s_c, t_c), candidates, friends)


def ranked_candidates(
    indices: np.ndarray, values: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` of ``indices`` by ``values`` clipped at 0, ties by index, as
    :func:`service.mechanisms.postprocess.top_k` ranks them: (indices, clipped values)."""
    clipped = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    order = ranked_positions(clipped, indices, k)  # np.lexsort((indices, -clipped))[:k]
    return indices[order], clipped[order]


def common_neighbours_top(
    graph: Graph,
    seed: int,
    plan: LaplacePlan,
    k: int,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    grid: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of :func:`noisy_common_neighbours` (without the seed), ranked as
    :func:`service.mechanisms.postprocess.ranked_indices` ranks it (clipped at 0, ties by
    index): (indices, scores), with exactly the law of ranking the full draw, drawing noise only
    for the nodes with a common neighbour and the top of the others
    (:func:`service.mechanisms.lazy_top_k.lazy_top`; docs/privacy.md, "The lazy top-k")."""
    _require_count_release(plan, mode)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    nodes, counts = neighbourhood_counts(graph, seed)
    rng = rng if rng is not None else fresh_generator()
    grid = checked_count_grid(grid, plan.scale)
    s, t = gamma_ratio(grid, dyadic_scale(plan.scale))
    keep = nodes != seed
    explicit, counts = nodes[keep], counts[keep]
    values = counts + rounded_laplace(rng, s, t, explicit.shape[0]).astype(np.float64) * grid
    excluded = np.union1d(explicit, np.array([seed], dtype=np.int64))
    lazy_count = graph.n - excluded.shape[0]
    k = min(int(k), graph.n - 1)
    lazy = lazy_top(rng, s, t, lazy_count, k, floor=1)
    indices = np.concatenate([explicit, lazy_rank_to_index(excluded, lazy.ranks)])
    values = np.concatenate([values, lazy.levels.astype(np.float64) * grid])
    if lazy.floored:  # every other lazy node scores 0 once clipped: the first k by index
        span = np.arange(min(lazy_count, k + lazy.ranks.shape[0]), dtype=np.int64)
        zeros = lazy_rank_to_index(excluded, np.setdiff1d(span, lazy.ranks)[:k])
        indices = np.concatenate([indices, zeros])
        values = np.concatenate([values, np.zeros(zeros.shape[0])])
    return ranked_candidates(indices, values, k)
