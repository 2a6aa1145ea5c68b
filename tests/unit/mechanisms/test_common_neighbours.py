"""The seed's neighbourhood split into friends and other candidates, against the full counts."""

from __future__ import annotations

import numpy as np
import pytest

from service.graph.generate import generate_graph
from service.mechanisms.common_neighbours import (
    common_neighbour_counts,
    ranked_candidates,
    split_neighbourhood,
)


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
