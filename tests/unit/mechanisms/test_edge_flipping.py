"""Edge flipping (randomized response on the adjacency): structure, rates, seed, size cap."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import service.mechanisms.edge_flipping as ef
from service.errors import GraphTooLarge, InvalidParameter
from service.mechanisms.edge_flipping import edge_flipping_ppr, flip_edges, flip_probability
from service.mechanisms.exact import exact_ppr
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges, random_graph

P, E = Mode.PERSONALIZED, Mode.EDGE


def test_flip_probability_gives_epsilon() -> None:
    for eps in (0.01, 0.1, 1.0, 5.0):
        p = flip_probability(eps)
        assert p == pytest.approx(2 / (1 + math.exp(eps)))
        # P[1 | edge] / P[1 | no edge] = (1 - p/2) / (p/2) = e^eps
        assert (1 - p / 2) / (p / 2) == pytest.approx(math.exp(eps))
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidParameter):
            flip_probability(bad)


@pytest.mark.parametrize("small_blocks", [False, True])
def test_structure(small_blocks: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if small_blocks:
        monkeypatch.setattr(ef, "BLOCK_PAIRS", 50)  # many row blocks
    graph = random_graph(60, 0.1, np.random.default_rng(0))
    flipped = flip_edges(graph, 5, 0.3, P, np.random.default_rng(1))
    dense = flipped.toarray()
    assert flipped.shape == (60, 60)
    np.testing.assert_array_equal(dense, dense.T)
    assert np.all(np.diag(dense) == 0)
    assert set(np.unique(dense)) <= {0.0, 1.0}


@pytest.mark.parametrize("small_blocks", [False, True])
@pytest.mark.parametrize("mode", [P, E])
def test_large_epsilon_keeps_the_graph(
    mode: Mode, small_blocks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if small_blocks:
        monkeypatch.setattr(ef, "BLOCK_PAIRS", 37)
    graph = random_graph(40, 0.15, np.random.default_rng(3))
    flipped = flip_edges(graph, 2, 60.0, mode)  # p = 2 / (1 + e^60) ~ 2e-26
    np.testing.assert_array_equal(flipped.toarray(), graph.adjacency.toarray())
    np.testing.assert_allclose(
        edge_flipping_ppr(graph, 2, 0.8, 60.0, mode), exact_ppr(graph, 2, 0.8), atol=1e-9
    )


@pytest.mark.parametrize("small_blocks", [False, True])
def test_flip_rates(small_blocks: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-edge becomes an edge w.p. p/2, an edge is kept w.p. 1 - p/2."""
    if small_blocks:
        monkeypatch.setattr(ef, "BLOCK_PAIRS", 1000)
    n, eps = 300, 0.7
    p = flip_probability(eps)
    half = [(u, v) for u, v in itertools.combinations(range(n), 2) if (u + v) % 2 == 0]
    graph = graph_from_edges(half, n)
    dense = flip_edges(graph, 0, eps, E, np.random.default_rng(9)).toarray()
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    was_edge = graph.adjacency.toarray().astype(bool) & upper
    was_none = ~graph.adjacency.toarray().astype(bool) & upper
    # ~22k pairs each: standard error ~0.003
    assert dense[was_none].mean() == pytest.approx(p / 2, abs=0.012)
    assert dense[was_edge].mean() == pytest.approx(1 - p / 2, abs=0.012)


def test_seed_pairs_kept_in_personalized_mode_only() -> None:
    n, seed = 200, 7
    graph = graph_from_edges([(seed, v) for v in range(0, n, 3) if v != seed], n)
    for trial in range(3):
        rng = np.random.default_rng(trial)
        personal = flip_edges(graph, seed, 0.05, P, rng).toarray()
        np.testing.assert_array_equal(personal[seed], graph.adjacency.toarray()[seed])
        np.testing.assert_array_equal(personal[:, seed], graph.adjacency.toarray()[:, seed])
        assert personal.sum() > 10 * graph.adjacency.sum()  # the rest is randomized
        edge = flip_edges(graph, seed, 0.05, E, rng).toarray()
        assert not np.array_equal(edge[seed], graph.adjacency.toarray()[seed])


def test_refuses_large_graphs() -> None:
    graph = random_graph(30, 0.1, np.random.default_rng(0))
    with pytest.raises(GraphTooLarge, match="30 nodes"):
        flip_edges(graph, 0, 1.0, max_nodes=29)
    with pytest.raises(GraphTooLarge):
        edge_flipping_ppr(graph, 0, 0.8, 1.0, max_nodes=10)
    assert flip_edges(graph, 0, 1.0, max_nodes=30).shape == (30, 30)
    assert ef.DEFAULT_MAX_NODES >= 4039  # ego-Facebook fits by default


def test_default_rng_is_fresh() -> None:
    graph = random_graph(50, 0.1, np.random.default_rng(0))
    a = flip_edges(graph, 0, 0.5).toarray()
    b = flip_edges(graph, 0, 0.5).toarray()
    assert not np.array_equal(a, b)


def test_bad_seed() -> None:
    graph = random_graph(10, 0.3, np.random.default_rng(0))
    with pytest.raises(InvalidParameter):
        flip_edges(graph, 10, 1.0)
