"""The edge-level generator's triangle and locality releases: their sensitivities by brute force
on every graph of 5 nodes, the plan that composes them, and the fitted layers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from service.privacy.curves import laplace_curve
from service.privacy.synthetic import (
    LOCALITY_SENSITIVITY,
    community_plan,
    triangle_sensitivity,
)
from service.synthetic.blocks import Targets, layered_graph
from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.sampling import block_configuration
from service.synthetic.triangles import (
    edges_to_csr,
    in_block_edges,
    truncated_projection,
    truncated_triangles,
)

N = 5
PAIRS = list(itertools.combinations(range(N), 2))


def _graph(mask: int) -> sp.csr_matrix:
    chosen = [p for bit, p in enumerate(PAIRS) if mask >> bit & 1]
    u = np.array([a for a, _ in chosen], dtype=np.int64)
    v = np.array([b for _, b in chosen], dtype=np.int64)
    return edges_to_csr(u, v, N)


GRAPHS = [_graph(mask) for mask in range(1 << len(PAIRS))]


def _worst(statistic: list[float]) -> float:
    """Largest change of a statistic (indexed by edge mask) over one added or removed edge."""
    values = np.array(statistic)
    masks = np.arange(values.size)
    return max(
        float(np.max(np.abs(values - values[masks ^ (1 << bit)]))) for bit in range(len(PAIRS))
    )


@pytest.mark.parametrize("bound", [2, 3])
def test_truncated_triangle_count_moves_by_at_most_2_d_minus_1(bound: int) -> None:
    rng = np.random.default_rng(0)
    worst = 0.0
    for priority in [np.arange(N), np.arange(N)[::-1], *(rng.permutation(N) for _ in range(3))]:
        counts = [truncated_triangles(g.indptr, g.indices, priority, bound) for g in GRAPHS]
        worst = max(worst, _worst(counts))
    assert worst <= triangle_sensitivity(bound) == 2.0 * (bound - 1)
    assert worst >= bound - 1  # the bound is not loose by more than a factor 2 here


def test_untruncated_triangle_count_breaks_the_bound() -> None:
    """Control: without the projection one edge closes up to n - 2 triangles, more than
    2 (D - 1) for D = 2, so the brute force above would catch a missing truncation."""
    counts = [float((g @ g).multiply(g).sum() / 6.0) for g in GRAPHS]
    assert _worst(counts) == N - 2 > triangle_sensitivity(2)


def test_projection_has_maximum_degree_d_and_keeps_mutual_choices() -> None:
    rng = np.random.default_rng(1)
    g = GRAPHS[(1 << len(PAIRS)) - 1]  # the complete graph on 5 nodes
    h = truncated_projection(g.indptr, g.indices, rng.permutation(N), 2)
    assert np.asarray(h.sum(axis=1)).max() <= 2
    assert (h != h.T).nnz == 0


@pytest.mark.parametrize("size", [2, 3])
def test_in_block_edge_count_moves_by_at_most_one(size: int) -> None:
    counts = [in_block_edges(g.indptr, g.indices, size) for g in GRAPHS]
    assert _worst(counts) == LOCALITY_SENSITIVITY


def test_plan_composes_every_release() -> None:
    plan = community_plan(
        2.0,
        probe_share=0.05,
        degree_share=0.35,
        rounds=5,
        triangle_share=0.1,
        triangle_bound=10,
        locality_share=0.05,
    )
    assert plan.epsilon == pytest.approx(2.0)
    assert plan.triangle_sensitivity == 18.0
    # independent: probe 0.1, degrees 0.7, triangles 0.2, locality 0.1, five rounds of 0.18
    expected = (
        laplace_curve(0.1)
        + laplace_curve(0.7)
        + laplace_curve(0.2)
        + laplace_curve(0.1)
        + laplace_curve(0.18) * 5
    )
    assert np.allclose(plan.curve.rdp, expected.rdp)
    assert plan.curve.pure == pytest.approx(2.0)
    sparse = plan.without_rounds()
    assert sparse.epsilon == pytest.approx(2.0)
    assert sparse.triangle_epsilon == plan.triangle_epsilon
    assert sparse.locality_epsilon == plan.locality_epsilon
    expected_sparse = (
        laplace_curve(0.1) + laplace_curve(1.6) + laplace_curve(0.2) + laplace_curve(0.1)
    )
    assert np.allclose(sparse.curve.rdp, expected_sparse.rdp)


def test_default_params_spend_exactly_epsilon() -> None:
    plan = CommunityParams().plan(1.0)
    assert plan.triangle_epsilon > 0 and plan.locality_epsilon > 0
    assert plan.epsilon == pytest.approx(1.0)
    assert plan.without_rounds().epsilon == pytest.approx(1.0)


def _clustered(n: int = 600, width: int = 3) -> sp.csr_matrix:
    """A ring lattice: node i linked to i +- 1..width (3 (width - 1) / (2 (2 width - 1))
    clustering, many triangles, every edge short in the node order)."""
    base = np.arange(n)
    u = np.concatenate([base for _ in range(width)])
    v = np.concatenate([(base + k) % n for k in range(1, width + 1)])
    return edges_to_csr(u, v, n)


def test_layers_match_the_released_triangles_and_in_block_edges() -> None:
    rng = np.random.default_rng(2)
    a = _clustered()
    n = a.shape[0]
    degrees = np.asarray(a.sum(axis=1)).ravel().astype(np.int64)
    priority = rng.permutation(n)
    target_t = truncated_triangles(a.indptr, a.indices, priority, 10)
    target_b = in_block_edges(a.indptr, a.indices, 4)  # band: pairs up to 3 apart, weight 1
    targets = Targets(target_t, 10, priority, target_b, 4)

    def rest(d: np.ndarray, r: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return block_configuration(d, np.zeros(n, np.int64), np.ones((1, 1)), r)

    (u, v), fitted = layered_graph(degrees, targets, 64, rest, rng)
    s = edges_to_csr(u, v, n)
    assert 0.0 < fitted["band"] <= 1.0 and 0.0 <= fitted["affinity"] <= 1.0
    assert truncated_triangles(s.indptr, s.indices, priority, 10) == pytest.approx(
        target_t, rel=0.25
    )
    assert in_block_edges(s.indptr, s.indices, 4) == pytest.approx(target_b, rel=0.25)


def test_generator_keeps_the_triangles_of_a_clustered_graph() -> None:
    """At a large epsilon the synthetic graph has most of the real triangles (a configuration
    model on the same degrees has almost none: this fails on the degree-only generator)."""
    rng = np.random.default_rng(3)
    a = _clustered()
    real = float((a @ a).multiply(a).sum() / 6.0)
    u, v, plan, summary = community_synthesize(a.indptr, a.indices, 50.0, CommunityParams(), rng)
    s = edges_to_csr(u, v, a.shape[0])
    synthetic = float((s @ s).multiply(s).sum() / 6.0)
    assert synthetic >= 0.5 * real
    assert summary["released_triangles"] is not None and plan.triangle_epsilon > 0
    degrees = np.asarray(s.sum(axis=1)).ravel()
    assert degrees.min() >= 1  # the floor: an edge list has no isolated node
