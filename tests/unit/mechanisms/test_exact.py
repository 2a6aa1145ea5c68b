"""Exact PPR (power iteration) against a dense linear solve, and its basic properties."""

from __future__ import annotations

import numpy as np
import pytest

from service.errors import InvalidParameter
from service.mechanisms.exact import NotConvergedError, exact_ppr, ppr_from_adjacency
from tests.graph_helpers import graph_from_edges, random_graph


def dense_walk(adjacency: np.ndarray) -> np.ndarray:
    """W = (I + A D^-1) / 2, a node of degree 0 keeping its mass."""
    n = adjacency.shape[0]
    d = adjacency.sum(axis=0)
    P = np.divide(adjacency, d, out=np.zeros((n, n)), where=d > 0)
    P[:, d == 0] = np.eye(n)[:, d == 0]
    return np.asarray((np.eye(n) + P) / 2)


def dense_ppr(adjacency: np.ndarray, seed: int, beta: float) -> np.ndarray:
    n = adjacency.shape[0]
    e = np.zeros(n)
    e[seed] = 1.0
    return np.asarray((1 - beta) * np.linalg.solve(np.eye(n) - beta * dense_walk(adjacency), e))


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("trial", range(4))
def test_matches_dense_solve(beta: float, trial: int) -> None:
    rng = np.random.default_rng(100 + trial)
    graph = random_graph(int(rng.integers(5, 40)), float(rng.uniform(0.05, 0.4)), rng)
    dense = graph.adjacency.toarray()
    for seed in range(0, graph.n, 3):
        x = exact_ppr(graph, seed, beta)
        np.testing.assert_allclose(x, dense_ppr(dense, seed, beta), atol=1e-11, rtol=0)


def test_properties_and_fixed_point() -> None:
    rng = np.random.default_rng(7)
    graph = random_graph(60, 0.08, rng)
    W = dense_walk(graph.adjacency.toarray())
    for seed in (0, 17, 59):
        x = exact_ppr(graph, seed, 0.8)
        assert np.all(x >= 0)
        assert x.sum() == pytest.approx(1.0, abs=1e-12)
        e = np.zeros(graph.n)
        e[seed] = 1.0
        np.testing.assert_allclose(x, 0.2 * e + 0.8 * W @ x, atol=1e-12)
        assert x[seed] == x.max()  # the seed always holds the largest score


def test_isolated_nodes_keep_mass() -> None:
    graph = graph_from_edges([(0, 1), (1, 2)], n=5)  # nodes 3 and 4 isolated
    x = exact_ppr(graph, 3, 0.8)
    expected = np.zeros(5)
    expected[3] = 1.0
    np.testing.assert_allclose(x, expected, atol=1e-12)
    y = exact_ppr(graph, 0, 0.8)
    assert y[3] == 0 and y[4] == 0
    assert y.sum() == pytest.approx(1.0, abs=1e-12)


def test_path_graph_by_hand() -> None:
    # Two nodes joined by an edge: W = [[1/2, 1/2], [1/2, 1/2]], so x = (1-b) e_0 + b/2 * (1, 1).
    graph = graph_from_edges([(0, 1)])
    beta = 0.6
    np.testing.assert_allclose(exact_ppr(graph, 0, beta), [0.4 + 0.3, 0.3], atol=1e-12)


def test_accepts_plain_adjacency_matrix() -> None:
    graph = random_graph(20, 0.3, np.random.default_rng(3))
    np.testing.assert_array_equal(
        ppr_from_adjacency(graph.adjacency, 4, 0.7), exact_ppr(graph, 4, 0.7)
    )


def test_bad_parameters() -> None:
    graph = graph_from_edges([(0, 1), (1, 2)])
    for beta in (0.0, 1.0, -0.5, float("nan")):
        with pytest.raises(InvalidParameter):
            exact_ppr(graph, 0, beta)
    with pytest.raises(InvalidParameter):
        exact_ppr(graph, 3, 0.8)
    with pytest.raises(InvalidParameter):
        exact_ppr(graph, 0, 0.8, tol=0.0)
    with pytest.raises(NotConvergedError):
        exact_ppr(graph, 0, 0.8, max_iter=2)
