"""The seed's neighbourhood split into friends and other candidates, against the full counts;
its explicit counts' noise, the candidates' drawn first, then the friends'."""

from __future__ import annotations

import numpy as np
import pytest

from service.graph.generate import generate_graph
from service.mechanisms.common_neighbours import (
    common_neighbour_counts,
    noisy_neighbourhood,
    ranked_candidates,
    split_neighbourhood,
)
from service.mechanisms.exact_laplace import dyadic_scale, gamma_ratio, rounded_laplace
from service.mechanisms.postprocess import checked_count_grid
from service.privacy.accountant import RdpCurve
from service.privacy.laplace import TwoScalePlan


@pytest.mark.parametrize("nodes, edges", [(60, 90), (2_000, 20_000)])
def test_the_split_holds_every_counted_node_once_with_its_count(nodes: int, edges: int) -> None:
    graph = generate_graph(nodes, edges, seed=3)
    for seed in range(0, nodes, max(1, nodes // 40)):
        hood = split_neighbourhood(graph, seed)
        counts = common_neighbour_counts(graph, seed)
        friends = np.unique(graph.neighbors(seed))
        assert hood.friends.tolist() == friends[friends != seed].tolist()
        assert hood.friend_counts.tolist() == counts[hood.friends].tolist()
        others = np.flatnonzero(counts > 0)
        others = others[~np.isin(others, friends) & (others != seed)]
        assert hood.explicit.tolist() == others.tolist()
        assert hood.counts.tolist() == counts[others].tolist()
        union = np.union1d(np.union1d(hood.explicit, hood.friends), [seed])
        assert hood.excluded.tolist() == union.tolist()


def test_ranked_candidates_rank_clipped_values_ties_by_index() -> None:
    indices = np.array([9, 4, 7, 2, 5])
    values = np.array([1.0, -3.0, 1.0, 2.0, -0.5])
    best, scores = ranked_candidates(indices, values, 4)
    assert best.tolist() == [2, 7, 9, 4]  # 2.0; 1.0 by index; then 0 (clipped) by index
    assert scores.tolist() == [2.0, 1.0, 1.0, 0.0]


def test_the_noisy_neighbourhood_draws_the_candidates_then_the_friends_on_the_grid() -> None:
    graph = generate_graph(500, 4_000, seed=4)
    plan = TwoScalePlan(friend_scale=4.0, candidate_scale=2.0, epsilon=1.0, curve=RdpCurve.zero())
    noisy = noisy_neighbourhood(graph, 7, plan, np.random.default_rng(11), None)
    hood = split_neighbourhood(graph, 7)
    grid = checked_count_grid(None, 2.0)
    candidates, friends = gamma_ratio(grid, dyadic_scale(2.0)), gamma_ratio(grid, dyadic_scale(4.0))
    rng = np.random.default_rng(11)
    first = rounded_laplace(rng, *candidates, hood.explicit.shape[0])
    then = rounded_laplace(rng, *friends, hood.friends.shape[0])
    assert noisy.grid == grid and noisy.candidate_ratio == candidates
    assert noisy.hood.excluded.tolist() == hood.excluded.tolist()
    assert noisy.candidate_values.tolist() == (hood.counts + first * grid).tolist()
    assert noisy.friend_values.tolist() == (hood.friend_counts + then * grid).tolist()
