"""The one budget rule (service/ledger/budget_rule.py) at its boundary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.ledger.budget_rule import (
    ADMISSION_RTOL,
    LIFETIME_CAP,
    PERIOD_CAP,
    account_cap_exceeded,
    curve_fits_under_cap,
    fits_under_cap,
)
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.orders import ORDERS

CAP = 2.0
#: The largest epsilon the rule admits under CAP: the cap less the tolerance.
EDGE = CAP * (1.0 - ADMISSION_RTOL)


def test_a_spend_under_the_cap_by_more_than_the_tolerance_fits() -> None:
    assert fits_under_cap(CAP * (1.0 - 2 * ADMISSION_RTOL), CAP)
    assert fits_under_cap(EDGE, CAP)  # exactly the cap less the tolerance
    assert fits_under_cap(0.0, CAP)


def test_a_spend_within_the_tolerance_of_the_cap_or_above_does_not_fit() -> None:
    assert not fits_under_cap(math.nextafter(EDGE, math.inf), CAP)
    assert not fits_under_cap(CAP, CAP)  # exactly at the cap: the tolerance makes it stricter
    assert not fits_under_cap(CAP * (1.0 + ADMISSION_RTOL), CAP)
    assert not fits_under_cap(math.inf, CAP)
    assert not fits_under_cap(math.nan, CAP)


@pytest.mark.parametrize("delta", [1e-6, 1e-9])
def test_a_curve_fits_as_its_epsilon_at_the_delta_does(delta: float) -> None:
    base = RdpCurve(np.asarray(ORDERS, dtype=float) * 0.01, math.inf)
    at = base.epsilon(delta)
    assert curve_fits_under_cap(base, delta, at * (1.0 + 2 * ADMISSION_RTOL))
    assert not curve_fits_under_cap(base, delta, at)  # exactly at the cap
    assert not curve_fits_under_cap(base, delta, at * (1.0 - ADMISSION_RTOL))
    assert curve_fits_under_cap(base, delta, at) == fits_under_cap(at, at)


def test_an_account_is_decided_on_its_lifetime_cap_then_its_period_cap() -> None:
    one = laplace_curve(0.3)
    two = one + one
    at_one, at_two = one.epsilon(1e-6), two.epsilon(1e-6)
    assert 0.29 < at_one < at_two < 0.61
    assert account_cap_exceeded(one, 1e-6, 1.0) is None
    assert account_cap_exceeded(two, 1e-6, 0.5) == LIFETIME_CAP
    assert account_cap_exceeded(two, 1e-6, 1.0, one, 0.5) is None
    assert account_cap_exceeded(two, 1e-6, 1.0, two, 0.5) == PERIOD_CAP
    assert account_cap_exceeded(two, 1e-6, 0.5, two, 0.5) == LIFETIME_CAP  # does not renew
    # the same rule as every other cap, at the same boundary
    assert account_cap_exceeded(two, 1e-6, 1.0, one, at_one) == PERIOD_CAP
    assert account_cap_exceeded(two, 1e-6, 1.0, one, at_one * (1 + 2 * ADMISSION_RTOL)) is None
