"""``friends_of_friends`` (personalized mode only): the two-scale common-neighbour counts, ranked.

The query releases c~ = |N(s) & N(v)| + Lap(b_c) on every candidate v (neither the seed nor
one of its friends) and + Lap(b_f) on every friend, with b_f = 2 / eps and b_c = b_f / 2
(:func:`service.mechanisms.common_neighbours.two_scale_common_neighbours`; pure eps-DP for
every edge not touching s, charged like ``common_neighbours`` at eps: docs/ranking.md). The
ranking is post-processing of c~ with N(s), which the personalized model leaves public to the
seed: the friends first (in the order of their counts), then the candidates by their counts;
the seed itself scores 0.

Beyond the friends it is ``common_neighbours`` with half the noise on the candidates, so it
ranks them at least as well in expectation on every graph: what the seed's friends lose (their
counts are noisier) is free in this model, since they are placed first anyway.
"""

from __future__ import annotations

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.common_neighbours import (
    noisy_neighbourhood,
    ranked_candidates,
    require_personalized,
    two_scale_common_neighbours,
)
from service.mechanisms.lazy_top_k import lazy_rank_to_index, lazy_top
from service.mechanisms.randomness import fresh_generator
from service.privacy.laplace import TwoScalePlan
from service.privacy.modes import Mode

__all__ = ["friends_first", "friends_of_friends", "friends_of_friends_top"]


def friends_first(graph: Graph, seed: int, counts: np.ndarray) -> np.ndarray:
    """Scores from released ``counts``: every node but the seed shifted to >= 1 (top-k clips at
    0 and must not tie them), the seed's friends above every candidate, the seed 0."""
    n = graph.n
    if counts.shape != (n,):
        raise InvalidParameter("released", f"the released counts must have shape ({n},)")
    pool = np.ones(n, dtype=bool)
    pool[seed] = False
    friends = graph.neighbors(seed)
    values = np.asarray(counts, dtype=np.float64)
    low = float(values[pool].min(initial=0.0))
    high = float(values[pool].max(initial=0.0))
    scores = values - low + 1.0
    scores[friends] += high - low + 1.0
    scores[seed] = 0.0
    return scores


def friends_of_friends(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
) -> np.ndarray:
    """Draw this query's two-scale counts (``rng`` defaults to a fresh OS-entropy generator)
    and rank them with the seed's friends first."""
    require_personalized(mode, "friends_of_friends")
    rng = rng if rng is not None else fresh_generator()
    return friends_first(graph, seed, two_scale_common_neighbours(graph, seed, plan, rng, mode))


def friends_of_friends_top(
    graph: Graph,
    seed: int,
    plan: TwoScalePlan,
    k: int,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    *,
    grid: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of :func:`friends_first` of the two-scale counts (without the seed), as
    :func:`service.mechanisms.postprocess.ranked_indices` ranks it: (indices, scores), with
    exactly the law of ranking the full draw. Noise is drawn for the friends, the candidates
    with a common neighbour, and, of the other candidates (count 0, the same Lap(b_c) noise:
    i.i.d.), only the top and the minimum (the shift ``low``)
    (:func:`service.mechanisms.lazy_top_k.lazy_top`; docs/privacy.md, "The lazy top-k")."""
    require_personalized(mode, "friends_of_friends")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    rng = rng if rng is not None else fresh_generator()
    noisy = noisy_neighbourhood(graph, seed, plan, rng, grid)  # the candidates' noise first
    hood, grid, (s_c, t_c) = noisy.hood, noisy.grid, noisy.candidate_ratio
    friends, explicit, excluded = hood.friends, hood.explicit, hood.excluded
    candidate_values, friend_values = noisy.candidate_values, noisy.friend_values
    lazy_count = graph.n - excluded.shape[0]
    k = min(int(k), graph.n - 1)
    lazy = lazy_top(rng, s_c, t_c, lazy_count, max(1, k - friends.shape[0]), minimum=True)
    lazy_values = lazy.levels.astype(np.float64) * grid
    values = np.concatenate([friend_values, candidate_values, lazy_values])
    low = float(values.min(initial=0.0))
    if lazy.minimum is not None:
        low = min(low, float(lazy.minimum) * grid)
    high = float(values.max(initial=0.0))
    scores = values - low + 1.0
    scores[: friends.shape[0]] += high - low + 1.0
    indices = np.concatenate([friends, explicit, lazy_rank_to_index(excluded, lazy.ranks)])
    return ranked_candidates(indices, scores, k)
