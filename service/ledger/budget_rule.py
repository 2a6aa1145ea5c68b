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
