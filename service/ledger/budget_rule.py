"""The one budget rule: does a spend fit under a cap.

Every cap the ledger enforces (an account's budget, a service account's 24-hour quota, a
reader's cap on graph-wide releases, the graph-wide exposure cap and its shards' fast path,
degree and synthetic-release charges) decides with :func:`fits_under_cap` or
:func:`curve_fits_under_cap`. Pure: values in, a boolean out; no I/O.
"""

from __future__ import annotations

from service.privacy.accountant import RdpCurve

#: A spend fits when its epsilon is at most ``cap * (1 - ADMISSION_RTOL)``: the tolerance only
#: ever makes admission stricter, so a spend that a different summation order would evaluate
#: an ulp higher still never exceeds the cap.
ADMISSION_RTOL = 1e-12


def fits_under_cap(epsilon: float, cap_epsilon: float) -> bool:
    """Whether a spend of ``epsilon`` fits under ``cap_epsilon`` (the budget rule).

    A spend exactly at the cap does not fit (the tolerance is taken off the cap), and
    neither does a NaN spend.
    """
    return epsilon <= cap_epsilon * (1.0 - ADMISSION_RTOL)


def curve_fits_under_cap(curve: RdpCurve, delta: float, cap_epsilon: float) -> bool:
    """Whether the composed ``curve``, converted at ``delta``, fits under ``cap_epsilon``."""
    return fits_under_cap(curve.epsilon(delta), cap_epsilon)


#: Which of an account's caps a spend would exceed (:func:`account_cap_exceeded`).
LIFETIME_CAP = "cap"
PERIOD_CAP = "period_cap"


def account_cap_exceeded(
    lifetime: RdpCurve,
    delta: float,
    cap_epsilon: float,
    period: RdpCurve | None = None,
    period_cap_epsilon: float | None = None,
) -> str | None:
    """The budget rule of an account: which cap the composed spend would exceed, or None.

    ``lifetime`` is the composition of every live charge (the query's included), ``period``
    that of the live charges of the current period (likewise), both converted at the
    account's ``delta``. The lifetime cap is checked first (it does not renew: waiting for
    the period's reset would not help); without a period cap (``None``) only it is checked,
    exactly as :func:`curve_fits_under_cap`."""
    if not curve_fits_under_cap(lifetime, delta, cap_epsilon):
        return LIFETIME_CAP
    if period_cap_epsilon is not None:
        assert period is not None, "a period cap is checked against the period's spend"
        if not curve_fits_under_cap(period, delta, period_cap_epsilon):
            return PERIOD_CAP
    return None
