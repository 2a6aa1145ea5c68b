"""The deconvolved degree distribution of the edge-level generator: post-processing of the
noisy degree release that recovers the true distribution's shape while keeping the release's
order of the nodes (seeded generators here only: tests, not the serving path)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.deconvolve import deconvolved_degrees, deconvolved_distribution
from service.synthetic.sampling import block_configuration, denoise_degrees
from service.synthetic.triangles import edges_to_csr


def _sparse_degrees(rng: np.random.Generator, n: int = 3000) -> np.ndarray:
    """Degrees shaped like a sparse citation graph: mostly 1-5 (geometric, mean 3.3)."""
    return rng.geometric(0.3, n).astype(np.float64)


def test_recovers_a_point_mass() -> None:
    rng = np.random.default_rng(0)
    noisy = 3.0 + rng.laplace(0.0, 2.0, 5000)
    support = np.arange(1, 16, dtype=np.float64)
    weights = deconvolved_distribution(noisy, 2.0, support, iterations=400)
    assert weights.sum() == pytest.approx(1.0)
    assert weights[2] >= 0.8  # degree 3
    assert weights[2] > deconvolved_distribution(noisy, 2.0, support)[2] > 1.0 / support.size


def test_distribution_is_closer_to_the_truth_than_the_noisy_values() -> None:
    """KS distance to the true degrees: the deconvolved quantiles against the noisy values
    clipped at the floor (what the isotonic path gives: the isotonic fit of values sorted by
    themselves is the identity, which the last assertion checks as the control)."""
    rng = np.random.default_rng(1)
    true = _sparse_degrees(rng)
    scale = 2.0 / 0.87  # eps 1 with the rounds' share moved to the degrees
    noisy = true + rng.laplace(0.0, scale, true.size)
    deconvolved = deconvolved_degrees(noisy, scale, floor=1)
    clipped = np.maximum(noisy, 1.0)
    ks_deconvolved = stats.ks_2samp(true, deconvolved).statistic
    ks_noisy = stats.ks_2samp(true, clipped).statistic
    assert ks_deconvolved < 0.5 * ks_noisy
    assert ks_deconvolved < 0.08
    isotonic = denoise_degrees(noisy, None, np.random.default_rng(2), floor=1)
    assert stats.ks_2samp(true, isotonic).statistic > 2.0 * ks_deconvolved


def test_keeps_the_order_of_the_noisy_release_and_the_tail() -> None:
    rng = np.random.default_rng(3)
    true = _sparse_degrees(rng)
    true[:5] = [400.0, 600.0, 800.0, 1000.0, 1200.0]  # hubs far above the bulk
    noisy = true + rng.laplace(0.0, 2.0, true.size)
    out = deconvolved_degrees(noisy, 2.0, floor=1)
    order = np.argsort(noisy, kind="stable")
    assert np.all(np.diff(out[order]) >= 0)  # a monotone map of the noisy values
    assert np.array_equal(out[:5], noisy[:5])  # the tail keeps its released values
    assert out.min() >= 1.0


def test_rescaled_to_the_released_edge_count_with_the_floor() -> None:
    rng = np.random.default_rng(4)
    true = _sparse_degrees(rng)
    noisy = true + rng.laplace(0.0, 2.3, true.size)
    total = float(true.sum())
    out = denoise_degrees(noisy, total, rng, floor=1, noise_scale=2.3)
    assert out.dtype == np.int64 and out.min() >= 1
    assert out.sum() == pytest.approx(total, rel=0.02)


def test_depends_on_the_noisy_vector_only() -> None:
    """Post-processing: the same released vector gives the same distribution whatever graph
    it came from (the function takes no graph; this pins that it is deterministic in it)."""
    rng = np.random.default_rng(5)
    noisy = _sparse_degrees(rng) + rng.laplace(0.0, 2.0, 3000)
    assert np.array_equal(deconvolved_degrees(noisy, 2.0, 1), deconvolved_degrees(noisy, 2.0, 1))


def test_generator_degree_distribution_is_closer_with_deconvolution() -> None:
    """The generator's synthetic degrees against the input graph's, at eps 1 on a sparse graph:
    closer with the deconvolution than with the noisy values (the default path), which fails
    if the generator stops passing the noise scale."""
    rng = np.random.default_rng(6)
    n = 2000
    degrees = rng.geometric(0.3, n)
    degrees[-1] += degrees.sum() % 2
    u, v = block_configuration(degrees, np.zeros(n, np.int64), np.ones((1, 1)), rng)
    a = edges_to_csr(u, v, n)
    real = np.asarray(a.sum(axis=1)).ravel()
    keep = real > 0

    def ks(params: CommunityParams, seed: int) -> float:
        su, sv, _, _ = community_synthesize(
            a.indptr, a.indices, 1.0, params, np.random.default_rng(seed)
        )
        synthetic = np.asarray(edges_to_csr(su, sv, n).sum(axis=1)).ravel()
        return float(stats.ks_2samp(real[keep], synthetic[synthetic > 0]).statistic)

    with_ = [ks(CommunityParams(deconvolve=True), seed) for seed in range(4)]
    without = [ks(CommunityParams(), seed) for seed in range(4)]
    assert np.mean(with_) < 0.75 * np.mean(without)
