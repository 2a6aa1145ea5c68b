"""service/privacy/accountant.py: the conversion with its order-only terms computed once is the
closed form (Balle et al. 2020) computed afresh, to the bit; a curve with a negative or NaN
value is refused, zeros and infinities are curves."""

from __future__ import annotations

import numpy as np
import pytest

from service.privacy.accountant import RdpCurve, rdp_to_epsilon, sound_epsilon
from service.privacy.orders import ORDERS


def _closed_form(rdp: np.ndarray, pure: float, delta: float) -> float:
    """min over the grid of r(a) + ln(1 - 1/a) - ln(delta a) / (a - 1), and the pure value."""
    eps = rdp + np.log1p(-1.0 / ORDERS) - (np.log(delta) + np.log(ORDERS)) / (ORDERS - 1.0)
    return max(0.0, min(float(np.min(eps)), float(pure)))


def test_the_conversion_is_the_closed_form_to_the_bit() -> None:
    rng = np.random.default_rng(20261129)
    for _ in range(2_000):
        rdp = rng.exponential(10 ** rng.uniform(-6, 4), ORDERS.shape)
        if rng.random() < 0.5:
            rdp = rdp * ORDERS  # curves that grow with the order, like the Laplace ones
        if rng.random() < 0.05:
            rdp[rng.integers(0, ORDERS.shape[0])] = np.inf
        pure = float(rng.exponential(10)) if rng.random() < 0.7 else np.inf
        delta = 10 ** rng.uniform(-12, -0.01)
        assert rdp_to_epsilon(rdp, pure, delta) == _closed_form(rdp, pure, delta)
        assert sound_epsilon(rdp, pure, 0.0, delta) == _closed_form(rdp, pure, delta)


def test_a_wrong_term_is_caught() -> None:
    """Control: the same check tells a conversion with delta's logarithm left out apart."""
    rdp = np.linspace(0.01, 5.0, ORDERS.shape[0])
    wrong = max(0.0, float(np.min(rdp + np.log1p(-1.0 / ORDERS) - np.log(ORDERS) / (ORDERS - 1))))
    assert rdp_to_epsilon(rdp, np.inf, 1e-6) != wrong


@pytest.mark.parametrize(
    ("at", "value", "pure"),
    [(0, -1e-300, 1.0), (99, float("nan"), 1.0), (5, 0.0, -0.5), (5, 0.0, float("nan"))],
)
def test_a_curve_with_a_negative_or_nan_value_is_refused(
    at: int, value: float, pure: float
) -> None:
    rdp = np.zeros_like(ORDERS)
    rdp[at] = value
    with pytest.raises(ValueError, match="non-negative and not NaN"):
        RdpCurve(rdp, pure)


def test_zero_and_infinite_values_make_a_curve() -> None:
    rdp = np.zeros_like(ORDERS)
    rdp[-1] = np.inf
    curve = RdpCurve(rdp, np.inf) + RdpCurve.zero()
    assert curve.rdp[-1] == np.inf and curve.rdp[0] == 0.0 and curve.pure == np.inf


def test_a_kept_delta_term_converts_as_a_fresh_one() -> None:
    rng = np.random.default_rng(7)
    for delta in (1e-6, 1e-9, 1e-6, 1e-9):  # the second time of each, from the kept term
        for _ in range(50):
            rdp = rng.exponential(1.0, ORDERS.shape) * ORDERS
            assert rdp_to_epsilon(rdp, np.inf, delta) == _closed_form(rdp, np.inf, delta)


def test_a_sum_of_curves_is_the_checked_curve_of_the_sums() -> None:
    rng = np.random.default_rng(8)
    for _ in range(200):
        first = RdpCurve(rng.exponential(1.0, ORDERS.shape), float(rng.exponential()), 1e-12)
        rdp = rng.exponential(1.0, ORDERS.shape)
        rdp[rng.random(ORDERS.shape) < 0.05] = np.inf
        second = RdpCurve(rdp, float(rng.choice([np.inf, 2.5])), float(rng.random() * 1e-9))
        total = first + second
        checked = RdpCurve(first.rdp + second.rdp, first.pure + second.pure,
                           first.sampler_tv + second.sampler_tv)  # fmt: skip
        assert total == checked and not total.rdp.flags.writeable
        assert type(total.pure) is float and type(total.sampler_tv) is float
    with pytest.raises(TypeError):
        RdpCurve.zero() + 1.0  # type: ignore[operator]
