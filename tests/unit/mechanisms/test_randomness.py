"""The float64 Laplace sampler of the evaluation's baselines: KS against the Laplace CDF, tails,
sign. (The served noise is drawn by the exact sampler: tests/unit/mechanisms/test_exact_laplace.py.)

Draws come from a fixed test generator (the serving path seeds from the OS); the sample is
large enough that a truncated tail (e.g. an exponential built from a 24-bit uniform, which
stops at 16.6 scales) or a biased sign would be caught.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from service.mechanisms.randomness import laplace_noise, random_signs

SCALE = 3e-6


def test_ks_against_the_laplace_cdf() -> None:
    rng = np.random.default_rng(20261123)
    draws = laplace_noise(rng, SCALE, 2_000_000)
    result = stats.kstest(draws, stats.laplace(scale=SCALE).cdf)
    assert result.pvalue > 1e-3, result
    # a wrong scale (a standard deviation taken for the scale) is rejected by the same test
    wrong = stats.kstest(draws, stats.laplace(scale=SCALE / np.sqrt(2)).cdf)
    assert wrong.pvalue < 1e-12


def test_tail_frequencies_and_symmetry() -> None:
    rng = np.random.default_rng(11)
    count = 4_000_000
    draws = laplace_noise(rng, 1.0, count)
    for t in (1.0, 3.0, 6.0, 9.0):
        expected = count * np.exp(-t)  # P(|X| > t) = e^-t
        observed = int(np.count_nonzero(np.abs(draws) > t))
        assert abs(observed - expected) < 6 * np.sqrt(expected) + 1, (t, observed, expected)
        pos, neg = int(np.count_nonzero(draws > t)), int(np.count_nonzero(draws < -t))
        assert abs(pos - neg) < 6 * np.sqrt(pos + neg) + 1, (t, pos, neg)
    negative = int(np.count_nonzero(draws < 0))
    assert abs(negative - count / 2) < 6 * np.sqrt(count / 4)


@pytest.mark.slow
def test_tail_is_not_truncated_at_24_bit_resolution() -> None:
    """Beyond 16.64 scales (-log 2^-24, where an exponential built from a float32 uniform
    stops) draws still occur at the Laplace rate."""
    rng = np.random.default_rng(5)
    exceed = 0
    for _ in range(40):
        draws = laplace_noise(rng, 1.0, 5_000_000)
        exceed += int(np.count_nonzero(np.abs(draws) > 16.7))
    # expected 2e8 * e^-16.7 = 11.2; a 24-bit construction gives 0
    assert 1 <= exceed <= 40


def test_signs_are_fair_and_independent_of_position() -> None:
    rng = np.random.default_rng(9)
    signs = random_signs(rng, 64 * 100_000).reshape(-1, 64)
    per_bit = signs.mean(axis=0)
    assert np.all(np.abs(per_bit - 0.5) < 6 * np.sqrt(0.25 / signs.shape[0]))


def _serving_generator(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64DXSM(seed))
