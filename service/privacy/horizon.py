"""How far a budget goes (pure functions on curves):

- :func:`largest_fitting`: the largest per-answer epsilon whose planned composition still fits
  a cap, found by bisection and rounded DOWN, so a plan never overspends;
- :func:`conversion_table`: a composed curve as a short table of orders and the epsilon each
  order certifies at delta (the accountant takes the smallest);
- :func:`days_until_cap`: when a spend that keeps growing at a measured rate reaches its cap.

"Fits" is stricter than admission (``composed <= cap * (1 - PLAN_RTOL)``, and admission refuses
only above ``cap * (1 - 1e-12)``), so every answer of a plan is admitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from service.privacy.accountant import RdpCurve
from service.privacy.orders import ORDERS

#: A plan's composed epsilon stays at or below ``cap * (1 - PLAN_RTOL)``.
PLAN_RTOL = 1e-9
#: A planned epsilon is rounded down to this many significant digits.
PLAN_DIGITS = 6
#: Orders shown in a conversion table (the nearest grid order to each), besides the best one.
TABLE_ORDERS = (1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 1e5, 1e6)
#: :func:`largest_fitting` gives up doubling its bracket past this epsilon.
_LARGEST_EPSILON = 1e6


def fits(curve: RdpCurve, cap: float, delta: float) -> bool:
    """The curve converts at ``delta`` to at most ``cap * (1 - PLAN_RTOL)``."""
    return curve.epsilon(delta) <= cap * (1.0 - PLAN_RTOL)


def floor_significant(value: float, digits: int = PLAN_DIGITS) -> float:
    """The largest float with ``digits`` significant digits that is <= ``value`` (> 0)."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"need a finite value > 0, got {value!r}")
    exponent = math.floor(math.log10(value)) - (digits - 1)
    mantissa = math.floor(value / 10.0**exponent + 1e-9)
    rounded = float(f"{mantissa}e{exponent}")
    while rounded > value:  # the decimal string may land a hair above value
        mantissa -= 1
        rounded = float(f"{mantissa}e{exponent}")
    return rounded


def largest_fitting(
    total_at: Callable[[float], RdpCurve], cap: float, delta: float, *, low: float
) -> float | None:
    """The largest epsilon x >= ``low`` (rounded down to :data:`PLAN_DIGITS` significant
    digits) whose ``total_at(x)`` fits ``cap`` at ``delta``; None if not even ``low`` fits.

    ``total_at`` must be non-decreasing in x (more epsilon per answer never costs less). The
    result is checked after rounding: it is returned only if its own curve fits.
    """
    if not fits(total_at(low), cap, delta):
        return None
    lo, hi = low, max(2.0 * low, cap)
    while fits(total_at(hi), cap, delta):
        lo, hi = hi, 2.0 * hi
        if hi > _LARGEST_EPSILON:
            return floor_significant(lo)
    for _ in range(200):  # bisection in log space: lo fits, hi does not
        if hi / lo - 1.0 < 1e-9:  # well below the rounding's 1e-(PLAN_DIGITS - 1)
            break
        mid = math.sqrt(lo * hi)
        if fits(total_at(mid), cap, delta):
            lo = mid
        else:
            hi = mid
    best = floor_significant(lo)
    while not fits(total_at(best), cap, delta):  # pragma: no cover - lo fits and best <= lo
        best = floor_significant(math.nextafter(best, 0.0))
    # lo is within 1e-9 of the boundary: the next value up may still fit
    step = 10.0 ** (math.floor(math.log10(best)) - (PLAN_DIGITS - 1))
    above = float(f"{round(best / step) + 1}e{math.floor(math.log10(step))}")
    if above < hi and fits(total_at(above), cap, delta):
        best = above
    return best


@dataclass(frozen=True)
class OrderRow:
    """One order of a composed curve: its Renyi divergence bound and the epsilon it certifies
    at delta (``order`` infinity: the pure-DP value)."""

    order: float
    rdp: float
    epsilon: float
    best: bool = False


def order_epsilons(curve: RdpCurve, delta: float) -> np.ndarray:
    """The epsilon each grid order certifies at ``delta``: r + ln(1 - 1/a) - ln(delta a)/(a - 1)
    (the conversion :func:`service.privacy.accountant.rdp_to_epsilon` minimises)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return np.asarray(
        curve.rdp + np.log1p(-1.0 / ORDERS) - (np.log(delta) + np.log(ORDERS)) / (ORDERS - 1.0)
    )


def conversion_table(
    curve: RdpCurve, delta: float, orders: Sequence[float] = TABLE_ORDERS
) -> list[OrderRow]:
    """The curve at the grid orders nearest ``orders`` and at the order that certifies the
    smallest epsilon (marked ``best``), in increasing order, then infinity (the pure value).
    The curve's epsilon is the smallest ``epsilon`` of the table (for a curve without a
    sampler share; plans have none)."""
    per_order = order_epsilons(curve, delta)
    chosen = {int(np.argmin(np.abs(np.log(ORDERS) - math.log(a)))) for a in orders}
    best = int(np.argmin(per_order))
    chosen.add(best)
    rows = [
        OrderRow(float(ORDERS[i]), float(curve.rdp[i]), float(per_order[i]), best=i == best)
        for i in sorted(chosen)
    ]
    pure_best = curve.pure < float(per_order[best])
    if pure_best:
        rows = [OrderRow(r.order, r.rdp, r.epsilon) for r in rows]
    rows.append(OrderRow(math.inf, curve.pure, curve.pure, best=pure_best))
    return rows


def projected(spent: RdpCurve, per_day: RdpCurve, days: float) -> RdpCurve:
    """``spent`` plus ``days`` days of ``per_day`` (a rate may be a fraction of a curve)."""
    return RdpCurve(
        spent.rdp + days * per_day.rdp,
        spent.pure + days * per_day.pure,
        spent.sampler_tv + days * per_day.sampler_tv,
    )


def days_until_cap(
    spent: RdpCurve,
    window: RdpCurve,
    window_days: float,
    cap: float,
    delta: float,
    *,
    horizon_days: float = 36_500.0,
    resolution_days: float = 1.0 / 1440.0,
) -> float | None:
    """Days from now until ``spent`` plus the charges of the last ``window_days`` days, repeated
    at the same rate (their composed curve times t / ``window_days`` after t days), converts at
    ``delta`` to ``cap`` or more: the projection composes the curves, it does not extrapolate
    epsilon linearly. 0 when the spend is at the cap already; None when the window charged
    nothing, or the cap is not reached within ``horizon_days``. Rounded down to
    ``resolution_days`` (a minute)."""
    if not window_days > 0:
        raise ValueError(f"the window must be positive, got {window_days!r}")

    def reached(days: float) -> bool:
        return projected(spent, window, days / window_days).epsilon(delta) >= cap

    if reached(0.0):
        return 0.0
    if not (np.any(window.rdp > 0) or window.pure > 0) or not reached(horizon_days):
        return None
    lo, hi = 0.0, horizon_days
    while hi - lo > resolution_days:
        mid = 0.5 * (lo + hi)
        if reached(mid):
            hi = mid
        else:
            lo = mid
    return lo
