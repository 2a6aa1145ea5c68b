"""Which node gets which synthetic degree: the noisy degrees shrunk towards their neighbours in
the public node order (post-processing of the degree release; seeded generators here only:
tests, not the serving path)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats

from service.errors import InvalidParameter
from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.order_shrinkage import (
    neighbour_means,
    order_shrunk_degrees,
    shrinkage_weight,
)
from service.synthetic.sampling import block_configuration, denoise_degrees
from service.synthetic.triangles import edges_to_csr

SCALE = 2.0 / 0.87  # the degree release's Laplace scale at eps 1 on a sparse graph


def _aging_degrees(rng: np.random.Generator, n: int = 3000) -> np.ndarray:
    """Degrees that fall along the node order, as where ids follow arrival (older nodes have
    collected more edges): geometric, mean about 9 at the first node and 1.5 at the last."""
    p = np.linspace(0.11, 0.65, n)
    return rng.geometric(p).astype(np.float64)


@pytest.mark.parametrize("half_window", [0, 1, 3, 50])
def test_neighbour_means_leave_the_node_out_and_cut_at_the_ends(half_window: int) -> None:
    values = np.random.default_rng(0).normal(size=40)
    expected = []
    for i in range(values.size):
        window = [
            values[j]
            for j in range(max(0, i - half_window), min(values.size, i + half_window + 1))
            if j != i
        ]
        expected.append(np.mean(window) if window else values.mean())
    assert neighbour_means(values, half_window) == pytest.approx(np.array(expected))


def test_weight_is_the_share_of_the_residual_variance_that_is_not_noise() -> None:
    rng = np.random.default_rng(1)
    flat = np.zeros(20_000)
    pure_noise = flat + rng.laplace(0.0, SCALE, flat.size)
    assert shrinkage_weight(pure_noise, flat, SCALE) < 0.02  # all of it is noise
    signal = rng.normal(0.0, 30.0, flat.size)
    assert shrinkage_weight(signal + pure_noise, flat, SCALE) > 0.98  # hardly any of it is
    residual = signal + pure_noise
    assert shrinkage_weight(residual, flat, SCALE) == pytest.approx(
        1.0 - 2.0 * SCALE**2 / np.var(residual)
    )
    assert shrinkage_weight(np.ones(10), np.ones(10), SCALE) == 0.0  # no spread at all


def test_ranks_nodes_closer_to_their_true_degrees_where_the_order_follows_age() -> None:
    rng = np.random.default_rng(2)
    true = _aging_degrees(rng)
    noisy = true + rng.laplace(0.0, SCALE, true.size)
    shrunk, weight = order_shrunk_degrees(noisy, SCALE)
    assert 0.0 < weight < 1.0
    by_noisy = stats.spearmanr(noisy, true).statistic
    by_shrunk = stats.spearmanr(shrunk, true).statistic
    assert by_shrunk > by_noisy + 0.02  # measured: 0.62 against 0.58


def test_changes_nothing_where_the_order_carries_nothing() -> None:
    rng = np.random.default_rng(3)
    true = rng.permutation(_aging_degrees(rng))  # the same degrees, numbered at random
    noisy = true + rng.laplace(0.0, SCALE, true.size)
    shrunk, _ = order_shrunk_degrees(noisy, SCALE)
    assert stats.spearmanr(shrunk, noisy).statistic > 0.98
    # and where the noise is small against the degrees' spread, the ranking stays the noisy one
    wide = rng.geometric(0.02, 3000) + rng.laplace(0.0, SCALE, 3000)
    shrunk_wide, weight = order_shrunk_degrees(wide, SCALE)
    assert weight > 0.99
    assert stats.spearmanr(shrunk_wide, wide).statistic > 0.999


def test_the_ranking_moves_the_values_and_keeps_them() -> None:
    """denoise_degrees(rank_by=...) hands the same values out in the order of rank_by."""
    noisy = np.array([5.0, -2.0, 9.0, 1.0, 3.0, 0.0])  # integers: the rounding keeps them
    plain = denoise_degrees(noisy, None, np.random.default_rng(4), floor=1)
    rank_by = np.array([6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    ranked = denoise_degrees(noisy, None, np.random.default_rng(4), floor=1, rank_by=rank_by)
    assert sorted(ranked) == sorted(plain) == [1, 1, 1, 3, 5, 9]
    assert list(ranked) == [9, 5, 3, 1, 1, 1]


def _aging_graph(seed: int, n: int = 2500) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    degrees = _aging_degrees(rng, n).astype(np.int64)
    degrees[-1] += degrees.sum() % 2
    u, v = block_configuration(degrees, np.zeros(n, np.int64), np.ones((1, 1)), rng)
    a = edges_to_csr(u, v, n)
    return a.indptr, a.indices, np.asarray(a.sum(axis=1)).ravel()


def test_the_generator_puts_the_degrees_on_the_right_nodes() -> None:
    """Same releases (same seed), the order shrinkage on and off: the synthetic degrees follow
    the real ones more closely with it; the summary reports its weight, a DP output."""
    indptr, indices, real = _aging_graph(5)
    n = real.size

    def synthetic_degrees(params: CommunityParams, seed: int) -> tuple[np.ndarray, Any]:
        su, sv, _, summary = community_synthesize(
            indptr, indices, 1.0, params, np.random.default_rng(seed)
        )
        return np.asarray(edges_to_csr(su, sv, n).sum(axis=1)).ravel(), summary

    with_, without = [], []
    for seed in range(3):
        degrees, summary = synthetic_degrees(CommunityParams(), seed)
        assert 0.0 < summary["order_weight"] < 1.0
        with_.append(stats.spearmanr(degrees, real).statistic)
        degrees, summary = synthetic_degrees(CommunityParams(order_window=0), seed)
        assert summary["order_weight"] is None
        without.append(stats.spearmanr(degrees, real).statistic)
    assert np.mean(with_) > np.mean(without) + 0.02  # measured: 0.61 against 0.57


def test_order_window_is_validated() -> None:
    with pytest.raises(InvalidParameter):
        CommunityParams(order_window=-1).validate()
