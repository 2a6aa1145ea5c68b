"""Budget periods: the UTC windows (day, week, month) an account's period cap renews over.

Pure: values in, values out; no I/O and no clock. Every charge records the start of the UTC
day it was admitted on (``charges.period_start``): the day is the smallest period, and a
week (from Monday 00:00 UTC) or a month (from its first day, 00:00 UTC) is a run of whole
days, so the charges of any period are those whose ``period_start`` lies in its window, for
whatever period the account has now (a period changed mid-window counts everything charged
since the new window began).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from service.bounds import BUDGET_PERIODS, BudgetPeriod
from service.errors import InvalidParameter

Period = BudgetPeriod
#: The periods an account's period cap may renew over.
PERIODS: tuple[Period, ...] = BUDGET_PERIODS


def as_aware_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive value (SQLite) is UTC by construction."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def day_start(moment: datetime) -> datetime:
    """00:00 UTC of the day ``moment`` falls on: the ``period_start`` a charge records."""
    at = as_aware_utc(moment)
    return datetime(at.year, at.month, at.day, tzinfo=UTC)


def period_start(period: str, moment: datetime) -> datetime:
    """The start of the ``period`` window that holds ``moment`` (UTC)."""
    day = day_start(moment)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise ValueError(f"unknown period {period!r}")


def period_end(period: str, moment: datetime) -> datetime:
    """When the ``period`` window that holds ``moment`` ends: the period cap's reset time."""
    start = period_start(period, moment)
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


def seconds_until(moment: datetime, now: datetime) -> int:
    """Whole seconds from ``now`` to ``moment``, rounded up, at least 1 (a Retry-After)."""
    return max(1, math.ceil((as_aware_utc(moment) - as_aware_utc(now)).total_seconds()))


def valid_period(period: str) -> Period:
    for known in PERIODS:
        if period == known:
            return known
    raise InvalidParameter("period", f"must be one of {', '.join(PERIODS)}, got {period!r}")


def valid_period_cap(period_cap_epsilon: float) -> float:
    value = period_cap_epsilon
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidParameter("period_cap_epsilon", f"must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidParameter("period_cap_epsilon", f"must be a finite number > 0, got {value}")
    return float(value)
