"""The Laplace sampler's distribution, checked exactly: KS against the Laplace CDF, tails, sign.

Draws come from a fixed test generator (the serving path seeds from the OS); the sample is
large enough that a truncated tail (e.g. an exponential built from a 24-bit uniform, which
stops at 16.6 scales) or a biased sign would be caught.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from service.mechanisms.kernels import draw_kernel
from service.mechanisms.randomness import (
    compiled_draws_match_numpy,
    draw_step_randomness,
    laplace_noise,
    random_signs,
    sign_words,
    signed_pairs,
    step_noise,
)

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


def test_sum_of_two_draws_has_the_right_law() -> None:
    """xi1 + xi2 (one noisy step) matches the law of the sum of two independent Lap(b)."""
    rng = np.random.default_rng(3)
    sample = step_noise(rng, 1.0, 500_000)
    reference = np.random.default_rng(4)
    twin = reference.laplace(0, 1.0, 500_000) + reference.laplace(0, 1.0, 500_000)
    assert stats.ks_2samp(sample, twin).pvalue > 1e-3
    assert np.var(sample) == pytest.approx(4.0, rel=0.02)


def test_signs_are_fair_and_independent_of_position() -> None:
    rng = np.random.default_rng(9)
    signs = random_signs(rng, 64 * 100_000).reshape(-1, 64)
    per_bit = signs.mean(axis=0)
    assert np.all(np.abs(per_bit - 0.5) < 6 * np.sqrt(0.25 / signs.shape[0]))


def _serving_generator(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64DXSM(seed))


def test_the_compiled_sampler_is_numpy_bit_for_bit() -> None:
    """The engine's compiled PCG64DXSM sampler draws exactly numpy's exponentials and raw
    words and leaves the generator where numpy's calls would: over 4 x 1.5M draws (thousands
    through the ziggurat's rejection branch and hundreds through its tail beyond the last
    layer), with draws continuing from a generator numpy has already used (buffered 32-bit
    half included)."""
    assert draw_kernel() is not None and compiled_draws_match_numpy()
    count = 1_500_000
    tails = 0
    for seed in range(4):
        ours, theirs = _serving_generator(seed), _serving_generator(seed)
        for rng in (ours, theirs):  # some numpy use first, including a buffered uint32
            rng.integers(0, 2**32, size=3, dtype=np.uint32)
            rng.standard_normal(5)
        exps, words = np.empty(count), np.empty(sign_words(count), dtype=np.uint64)
        draw_step_randomness(ours, exps, words)
        expected = theirs.standard_exponential(count)
        np.testing.assert_array_equal(exps, expected)
        np.testing.assert_array_equal(words, theirs.bit_generator.random_raw(words.shape[0]))
        assert ours.bit_generator.state == theirs.bit_generator.state
        assert ours.integers(0, 2**32, dtype=np.uint32) == theirs.integers(
            0, 2**32, dtype=np.uint32
        )
        tails += int(np.count_nonzero(expected > 7.69711747013104972))  # ziggurat_exp_r
    assert tails > 100


def test_the_compiled_sampler_draws_laplace() -> None:
    """The law of what the engine adds (compiled draws, signed pairs) on the serving
    generator kind: one draw is Lap(b) (KS, with a wrong scale rejected), a pair is the sum
    of two independent Lap(b)."""
    n = 1_000_000
    rng = _serving_generator(20261124)
    exps, words = np.empty(2 * n), np.empty(sign_words(2 * n), dtype=np.uint64)
    draw_step_randomness(rng, exps, words)
    signs = np.unpackbits(words.astype("<u8").view(np.uint8), count=2 * n)
    draws = exps * np.where(signs == 1, -SCALE, SCALE)
    assert stats.kstest(draws, stats.laplace(scale=SCALE).cdf).pvalue > 1e-4
    assert stats.kstest(draws, stats.laplace(scale=SCALE / np.sqrt(2)).cdf).pvalue < 1e-12
    pairs = signed_pairs(exps, words, 1.0, n)
    twin = np.random.default_rng(4)
    reference = twin.laplace(0, 1.0, n) + twin.laplace(0, 1.0, n)
    assert stats.ks_2samp(pairs, reference).pvalue > 1e-4


def test_other_generators_draw_through_numpy() -> None:
    """A generator of another kind (numpy's default PCG64) gets numpy's own calls."""
    ours, theirs = np.random.default_rng(8), np.random.default_rng(8)
    exps, words = np.empty(1000), np.empty(16, dtype=np.uint64)
    draw_step_randomness(ours, exps, words)
    np.testing.assert_array_equal(exps, theirs.standard_exponential(1000))
    np.testing.assert_array_equal(words, theirs.bit_generator.random_raw(16))
