"""The exact discrete Gaussian sampler (Canonne, Kamath & Steinke 2020, Algorithm 3) and its
curve: the law by chi-square tests at several variances (each test rejects a variance 5% off),
draws that do not depend on the buffer size, raw words only, the guards, the parameter choice,
and the Rényi divergence of integer shifts against the continuous Gaussian's curve."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from service.errors import InvalidParameter
from service.mechanisms.discrete_gaussian import discrete_gaussian
from service.privacy.discrete_gaussian import (
    MAX_TAU,
    discrete_gaussian_parameters,
    discrete_gaussian_rdp,
)


class WordsOnly(np.random.Generator):  # numpy's type is immutable: subclass it
    def __getattribute__(self, attribute: str) -> Any:
        if attribute != "bit_generator":
            raise AssertionError(f"a float sampler was used: Generator.{attribute}")
        return super().__getattribute__(attribute)


def _pmf(variance: float, limit: int) -> tuple[np.ndarray, np.ndarray]:
    z = np.arange(-limit, limit + 1)
    logp = -(z.astype(np.float64) ** 2) / (2.0 * variance)
    return z, np.exp(logp - logsumexp(logp))


def _chi_square_p(draws: np.ndarray, variance: float) -> float:
    """Chi-square p-value of ``draws`` against N_Z(0, variance), on cells of width about
    sigma / 8 (single integers for small variances)."""
    limit = int(12 * math.sqrt(variance)) + 2
    z, p = _pmf(variance, limit)
    width = max(1, int(math.sqrt(variance) / 8))
    cells = (np.clip(draws, -limit, limit) + limit) // width
    expected = np.bincount((z + limit) // width, weights=p * draws.size)
    observed = np.bincount(cells, minlength=expected.size)
    keep = expected >= 5
    # the bins with fewer than 5 expected draws pooled into one
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
        exp = exp * obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize(("m", "tau"), [(1, 0), (3, 0), (5, 1), (3, 2), (13, 3), (1954, 9)])
def test_the_law_is_the_discrete_gaussian(m: int, tau: int) -> None:
    variance = float(m * 2**tau)
    draws = discrete_gaussian(np.random.default_rng(1000 + m + tau), m, tau, 400_000)
    assert _chi_square_p(draws, variance) > 1e-4
    # the same draws against a variance 5% off are rejected: the test can fail
    assert _chi_square_p(draws, variance * 1.05) < 1e-6
    assert _chi_square_p(draws, variance / 1.05) < 1e-6


def test_the_draws_do_not_depend_on_the_buffer() -> None:
    reference = discrete_gaussian(np.random.default_rng(7), 13, 3, 3_000)
    for chunk in (1, 2, 3, 5, 17, 64, 1000):
        again = discrete_gaussian(np.random.default_rng(7), 13, 3, 3_000, chunk=chunk)
        assert np.array_equal(again, reference), chunk


def test_only_raw_words_are_read() -> None:
    m, tau = 73015690, 26
    draws = discrete_gaussian(WordsOnly(np.random.PCG64DXSM(3)), m, tau, 10_000)
    assert draws.dtype == np.int64
    assert abs(draws.astype(np.float64).std() / math.sqrt(m * 2.0**tau) - 1.0) < 0.05


@pytest.mark.parametrize(
    ("m", "tau"), [(0, 0), (1, -1), (1, MAX_TAU + 1), (2**62, 0), (True, 0), (1.5, 0)]
)
def test_parameters_out_of_range_are_refused(m: Any, tau: Any) -> None:
    with pytest.raises(InvalidParameter):
        discrete_gaussian(np.random.default_rng(), m, tau, 1)


def test_large_variances_draw_at_their_scale() -> None:
    for variance in (Fraction(4e18), Fraction(10**30)):
        m, tau = discrete_gaussian_parameters(variance)
        assert m * 2**tau >= variance and m * 2**tau < variance * (1 + Fraction(1, 2**10))
        draws = discrete_gaussian(np.random.default_rng(5), m, tau, 40_000).astype(np.float64)
        assert abs(draws.std() / math.sqrt(m * 2.0**tau) - 1.0) < 0.02
        assert abs(draws.mean()) < 0.03 * math.sqrt(m * 2.0**tau)


def test_the_parameters_round_the_variance_up_exactly() -> None:
    for variance in (1, Fraction(9, 4), 10, 123.456, 5.5e11, Fraction(3, 1) ** 40):
        m, tau = discrete_gaussian_parameters(variance)
        assert m * 2**tau >= Fraction(variance)
        assert (m - 1) * 2**tau < Fraction(variance)  # the smallest m at that tau
        assert 0 <= tau <= MAX_TAU and 2**tau <= math.sqrt(float(variance)) + 1e-9
    with pytest.raises(InvalidParameter):
        discrete_gaussian_parameters(0.5)


@pytest.mark.parametrize("variance", [1.0, 3.0, 10.0, 40.0])
def test_integer_shifts_stay_under_the_gaussian_curve(variance: float) -> None:
    """D_alpha(N_Z(mu, s^2) || N_Z(0, s^2)) <= alpha mu^2 / (2 s^2) (CKS, Proposition 5), the
    curve the ledger charges; computed by summing the two laws."""
    # the sum's terms centre on alpha mu: the range covers it and 80 sigma around
    limit = int(100 * 7 + 80 * math.sqrt(variance)) + 10
    z = np.arange(-limit, limit + 1).astype(np.float64)
    norm = logsumexp(-(z**2) / (2 * variance))
    for mu in (1, 2, 3, 7):
        for alpha in (1.5, 2.0, 5.0, 20.0, 100.0):
            log_terms = -(alpha * (z - mu) ** 2 + (1 - alpha) * z**2) / (2 * variance) - norm
            divergence = float(logsumexp(log_terms)) / (alpha - 1)
            bound = discrete_gaussian_rdp(alpha, mu * mu, variance)
            assert divergence <= bound * (1 + 1e-9) + 1e-12
            if variance >= 10:  # and close to it once the lattice is fine against sigma
                assert divergence >= 0.9 * bound
