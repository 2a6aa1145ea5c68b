"""The anchored configuration model (service.synthetic.anchors) and its place in the layers."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from service.synthetic.anchors import anchor_threshold, anchored_configuration
from service.synthetic.blocks import Targets, layered_graph
from service.synthetic.sampling import block_configuration
from service.synthetic.triangles import edges_to_csr, truncated_triangles


def _heavy_tailed_degrees(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    degrees = np.minimum(np.round(rng.pareto(1.6, n) + 1).astype(np.int64), 150)
    degrees[degrees.sum() % 2] += 1
    return degrees


def _triangles(a: sp.csr_matrix) -> float:
    return float((a @ a).multiply(a).sum() / 6.0)


def _second_neighbourhood(a: sp.csr_matrix, nodes: np.ndarray) -> float:
    dist = shortest_path(a, directed=False, unweighted=True, indices=nodes)
    return float(np.mean(np.sum(dist <= 2, axis=1)))


def test_edges_are_simple_and_keep_nearly_every_stub() -> None:
    degrees = _heavy_tailed_degrees(3000, 1)
    threshold = anchor_threshold(degrees, 4.0)
    for p in (0.0, 0.5, 1.0):
        u, v = anchored_configuration(degrees, threshold, p, seed=7)
        assert np.all(u < v)
        assert len(set(zip(u.tolist(), v.tolist(), strict=True))) == u.size
        realised = np.bincount(np.concatenate([u, v]), minlength=degrees.size)
        assert np.all(realised <= degrees)
        assert realised.sum() >= 0.9 * degrees.sum()


def rng() -> np.random.Generator:
    return np.random.default_rng(12)


def test_anchors_seldom_link_to_each_other_and_p_closes_their_neighbourhoods() -> None:
    degrees = _heavy_tailed_degrees(3000, 2)
    threshold = anchor_threshold(degrees, 4.0)
    anchors = np.flatnonzero(degrees >= threshold)
    assert 0 < anchors.size < degrees.size // 10
    graphs = {
        p: edges_to_csr(*anchored_configuration(degrees, threshold, p, 11), 3000)
        for p in (0.0, 1.0)
    }

    def anchor_pairs(a: sp.csr_matrix) -> int:
        u, v = sp.triu(a, 1).nonzero()
        return int(np.sum((degrees[u] >= threshold) & (degrees[v] >= threshold)))

    plain = edges_to_csr(
        *block_configuration(degrees, np.zeros(3000, np.int64), np.ones((1, 1)), rng()), 3000
    )
    # anchor stubs go to non-anchors: only the random re-pairing of lost stubs links anchors
    assert anchor_pairs(graphs[0.0]) <= 0.25 * anchor_pairs(plain)
    # closing the anchors' neighbourhoods: many more triangles, a smaller second neighbourhood
    assert _triangles(graphs[1.0]) > 10 * max(_triangles(graphs[0.0]), 1.0)
    assert _second_neighbourhood(graphs[1.0], anchors) < 0.8 * _second_neighbourhood(
        graphs[0.0], anchors
    )


def test_the_same_seed_gives_the_same_graph_and_triangles_grow_with_p() -> None:
    degrees = _heavy_tailed_degrees(2000, 3)
    threshold = anchor_threshold(degrees, 4.0)
    first = anchored_configuration(degrees, threshold, 0.6, seed=5)
    again = anchored_configuration(degrees, threshold, 0.6, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    counts = [
        _triangles(edges_to_csr(*anchored_configuration(degrees, threshold, p, 5), 2000))
        for p in (0.0, 0.25, 0.5, 0.75, 1.0)
    ]
    assert counts == sorted(counts) and counts[-1] > counts[0]


def test_anchor_threshold_is_a_multiple_of_the_mean_degree() -> None:
    assert anchor_threshold(np.array([2, 4, 6]), 4.0) == 16
    assert anchor_threshold(np.array([0, 0, 1]), 1.0) == 2  # never below 2
    assert anchor_threshold(np.zeros(0, np.int64), 4.0) == 2


def _rest(n: int):  # type: ignore[no-untyped-def]
    def rest(d: np.ndarray, r: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return block_configuration(d, np.zeros(n, np.int64), np.ones((1, 1)), r)

    return rest


N = 3000


def _fit(degree_seed: int, p: float, scale: float) -> tuple[dict[str, float], float, float]:
    """Fit the layers to ``scale`` x the truncated triangle count of an anchored graph made at
    ``p``; the fitted values, the target and the synthetic graph's own count."""
    degrees = _heavy_tailed_degrees(N, degree_seed)
    threshold = anchor_threshold(degrees, 4.0)
    a = edges_to_csr(*anchored_configuration(degrees, threshold, p, 9), N)
    rng = np.random.default_rng(degree_seed + 2)
    priority = rng.permutation(N)
    target = scale * truncated_triangles(a.indptr, a.indices, priority, 10)
    realised = np.asarray(a.sum(axis=1)).ravel().astype(np.int64)
    targets = Targets(target, 10, priority, None, 4, anchor_min=threshold)
    (u, v), fitted = layered_graph(realised, targets, 64, _rest(N), rng)
    s = edges_to_csr(u, v, N)
    return fitted, target, truncated_triangles(s.indptr, s.indices, priority, 10)


def test_layers_fit_the_anchored_closure_when_it_reaches_the_released_count() -> None:
    """A graph the anchored model made at p = 0.5: the fit finds a p that gives back its
    truncated triangle count, with no affinity blocks."""
    fitted, target, found = _fit(4, 0.5, 1.0)
    assert 0.0 < fitted["anchored"] < 1.0 and fitted["affinity"] == 0.0
    assert found == pytest.approx(target, rel=0.25)


def test_layers_add_affinity_blocks_when_the_closure_cannot_reach_the_count() -> None:
    """Many more triangles than closing the anchors' neighbourhoods gives: p = 1 and the
    affinity blocks carry the rest; without anchors, the blocks alone."""
    fitted, target, found = _fit(5, 1.0, 3.0)
    assert fitted["anchored"] == 1.0 and fitted["affinity"] > 0.0
    assert found == pytest.approx(target, rel=0.25)
    degrees = _heavy_tailed_degrees(N, 5)
    rng = np.random.default_rng(8)
    priority = rng.permutation(N)
    without = Targets(target, 10, priority, None, 4)
    _, plain = layered_graph(degrees, without, 64, _rest(N), rng)
    assert plain["anchored"] == -1.0 and plain["affinity"] > 0.0
