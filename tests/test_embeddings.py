"""InstantEmbedding, DP-IE and the free embedding of a release: values, noise, plan, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import service.embeddings.dp as dp_module
from service.embeddings.dp import (
    MAX_K,
    dp_instant_embedding,
    dp_instant_embedding_curve,
    plan_dp_instant_embedding,
)
from service.embeddings.free import free_embedding, stored_top
from service.embeddings.hashing import embedding_hashes, new_salt
from service.embeddings.instant import instant_embedding, log_mass
from service.errors import InvalidParameter
from service.mechanisms.postprocess import score_grid
from service.mechanisms.pushflowcap import pushflowcap
from service.privacy.curves import laplace_curve
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges, random_graph

SALT = bytes(range(16))


def test_hashes_depend_on_ids_and_salt_only() -> None:
    ids = [str(i) for i in range(200)]
    a = embedding_hashes(ids, SALT, 16)
    b = embedding_hashes(ids, SALT, 16)
    np.testing.assert_array_equal(a.buckets, b.buckets)
    np.testing.assert_array_equal(a.signs, b.signs)
    # the same node keeps its hashes whatever else is in the node list (no graph input at all)
    c = embedding_hashes(ids[::-1], SALT, 16)
    np.testing.assert_array_equal(c.buckets[::-1], a.buckets)
    other = embedding_hashes(ids, bytes(16), 16)
    assert not np.array_equal(other.buckets, a.buckets)
    assert set(np.unique(a.buckets)) <= set(range(16)) and len(np.unique(a.buckets)) > 8
    assert set(np.unique(a.signs)) == {-1.0, 1.0}
    assert len(new_salt()) == 16 and new_salt() != new_salt()


def test_instant_embedding_natural_log_and_buckets() -> None:
    p = np.array([0.5, 0.3, 0.1, 0.05, 0.05])  # n = 5: n p = 2.5, 1.5, 0.5, 0.25, 0.25
    np.testing.assert_allclose(log_mass(p), [math.log(2.5), math.log(1.5), 0, 0, 0])
    hashes = embedding_hashes([str(i) for i in range(5)], SALT, 3)
    w = instant_embedding(p, hashes)
    expected = np.zeros(3)
    for v in range(5):
        expected[hashes.buckets[v]] += hashes.signs[v] * log_mass(p)[v]
    np.testing.assert_allclose(w, expected)
    with pytest.raises(InvalidParameter):
        instant_embedding(np.array([0.5, -0.1, 0, 0, 0]), hashes)
    with pytest.raises(InvalidParameter):
        instant_embedding(np.ones(4), hashes)


def test_plan_noise_scale_is_the_snapped_sensitivity_over_epsilon() -> None:
    """b = Delta / eps, Delta = sigma n plus the snapping slack MAX_K h (at most 2^-10 of it) and
    the float64 margins (2.7e-6 of it at the default degree bound and R; their values are
    checked in tests/unit/embeddings/test_dp.py)."""
    plan = plan_dp_instant_embedding(0.5, 1e-3, 1005, rounds=100, degree_bound=10_000)
    h = dp_module.snap_grid(1e-3, 1005)
    assert h == 2.0**-22  # the largest power of two <= 1.005 / 2^22
    assert 1.005 + MAX_K * h < plan.sensitivity < (1.005 + MAX_K * h) * (1 + 3e-6)
    assert plan.scale == pytest.approx(plan.sensitivity / 0.5, rel=1e-5)  # 6 digits, up
    assert plan.scale >= plan.sensitivity / 0.5 and plan.epsilon <= 0.5
    assert 1e-3 * 1005 / 0.5 < plan.scale <= 1e-3 * 1005 / 0.5 * (1 + 2.0**-10 + 3e-6) * (1 + 1e-6)
    assert dp_instant_embedding_curve(0.5) == laplace_curve(0.5)


def test_dp_ie_noise_law_grid_and_mean() -> None:
    graph = random_graph(60, 0.1, np.random.default_rng(1))
    hashes = embedding_hashes([str(i) for i in range(60)], SALT, 8)
    sigma, eps = 0.01, 1.0
    exact = instant_embedding(pushflowcap(graph, 0, dp_module.EMBEDDING_BETA, 100, sigma,
                                          Mode.EDGE), hashes)  # fmt: skip
    rng = np.random.default_rng(5)
    draws = np.array([
        dp_instant_embedding(graph, 0, hashes, eps, sigma, Mode.EDGE, rng=rng).values
        for _ in range(3000)
    ])  # fmt: skip
    released = dp_instant_embedding(graph, 0, hashes, eps, sigma, Mode.EDGE, rng=rng)
    b = released.plan.scale
    assert b == pytest.approx(sigma * 60 / eps, rel=1e-3)
    assert released.grid == score_grid(b)
    np.testing.assert_array_equal(np.round(draws / released.grid) * released.grid, draws)
    # Laplace(b): mean = the (snapped) embedding, mean |x - w| = b on every coordinate
    np.testing.assert_allclose(draws.mean(axis=0), exact, atol=6 * b / math.sqrt(3000))
    np.testing.assert_allclose(np.abs(draws - exact).mean(axis=0), b, rtol=0.08)


def test_dp_ie_default_rng_is_fresh_and_uses_the_exact_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = graph_from_edges({(0, 1), (1, 2)}, 3)
    hashes = embedding_hashes(["0", "1", "2"], SALT, 4)
    calls: list[str] = []
    real_fresh, real_noise = dp_module.fresh_generator, dp_module.grid_laplace

    def fresh() -> np.random.Generator:
        calls.append("fresh")
        return real_fresh()

    def noise(
        rng: np.random.Generator, scales: float, grid: float, count: int | None = None
    ) -> np.ndarray:
        calls.append(f"exact {count} on {grid!r}")
        return real_noise(rng, scales, grid, count)

    monkeypatch.setattr(dp_module, "fresh_generator", fresh)
    monkeypatch.setattr(dp_module, "grid_laplace", noise)
    dp_instant_embedding(graph, 0, hashes, 1.0, 0.1, Mode.PERSONALIZED)
    assert calls == ["fresh", f"exact 4 on {dp_module.snap_grid(0.1, 3)!r}"]


def test_dp_ie_bad_parameters() -> None:
    graph = graph_from_edges({(0, 1)}, 2)
    hashes = embedding_hashes(["0", "1"], SALT, 4)
    for sigma in (0.0, 1e-9, 2.0, math.nan):
        with pytest.raises(InvalidParameter):
            dp_instant_embedding(graph, 0, hashes, 1.0, sigma)
    with pytest.raises(InvalidParameter):
        dp_instant_embedding(graph, 0, hashes, 0.0, 0.1)
    with pytest.raises(InvalidParameter):
        dp_instant_embedding(graph, 0, embedding_hashes(["0", "1"], SALT, MAX_K + 1), 1.0, 0.1)
    with pytest.raises(InvalidParameter):
        dp_instant_embedding(graph, 0, embedding_hashes(["0"], SALT, 4), 1.0, 0.1)


def test_free_embedding_clips_negatives_and_stored_top() -> None:
    hashes = embedding_hashes([str(i) for i in range(6)], SALT, 4)
    released = np.array([0.6, -0.2, 0.3, 0.25, -0.01, 0.05])
    clipped = np.clip(released, 0, None)
    np.testing.assert_allclose(free_embedding(released, hashes), instant_embedding(clipped, hashes))
    normalized = free_embedding(released * 7.0, hashes, normalize=True)
    np.testing.assert_allclose(normalized, instant_embedding(clipped / clipped.sum(), hashes))
    top = stored_top(released, 2)
    np.testing.assert_array_equal(top, [0.6, 0, 0.3, 0, 0, 0])
    np.testing.assert_array_equal(stored_top(released, 10), released)
    # entries <= 1/n contribute nothing, so dropping only those leaves the embedding unchanged
    small = np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])  # 1/n = 0.167
    np.testing.assert_array_equal(
        free_embedding(stored_top(small, 2), hashes), free_embedding(small, hashes)
    )
