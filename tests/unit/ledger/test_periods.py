"""Budget periods' UTC windows (service/ledger/periods.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from service.errors import InvalidParameter
from service.ledger.periods import (
    PERIODS,
    day_start,
    period_end,
    period_start,
    seconds_until,
    valid_period,
    valid_period_cap,
)

#: A Wednesday, late in a December (the month's end rolls the year over).
WEDNESDAY = datetime(2026, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)


def test_a_day_a_week_and_a_month_are_utc_windows() -> None:
    assert period_start("day", WEDNESDAY) == datetime(2026, 12, 30, tzinfo=UTC)
    assert period_end("day", WEDNESDAY) == datetime(2026, 12, 31, tzinfo=UTC)
    assert period_start("week", WEDNESDAY) == datetime(2026, 12, 28, tzinfo=UTC)  # Monday
    assert period_end("week", WEDNESDAY) == datetime(2027, 1, 4, tzinfo=UTC)
    assert period_start("month", WEDNESDAY) == datetime(2026, 12, 1, tzinfo=UTC)
    assert period_end("month", WEDNESDAY) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_end("month", datetime(2028, 2, 29, 12, tzinfo=UTC)) == datetime(
        2028, 3, 1, tzinfo=UTC
    )


def test_every_window_is_a_run_of_whole_days_holding_the_moment() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    for hours in range(0, 24 * 70, 7):
        at = moment + timedelta(hours=hours)
        for period in PERIODS:
            start, end = period_start(period, at), period_end(period, at)
            assert start <= day_start(at) <= at < end
            assert start == day_start(start) and end == day_start(end)
            assert period_start(period, end) == end  # the next window starts at the reset


def test_naive_moments_are_utc_and_other_zones_are_converted() -> None:
    assert day_start(datetime(2026, 5, 1, 23, 30)) == datetime(2026, 5, 1, tzinfo=UTC)
    tokyo = timezone(timedelta(hours=9))
    assert day_start(datetime(2026, 5, 2, 1, 0, tzinfo=tokyo)) == datetime(2026, 5, 1, tzinfo=UTC)


def test_seconds_until_a_reset_round_up_and_are_at_least_one() -> None:
    reset = period_end("day", WEDNESDAY)
    assert seconds_until(reset, WEDNESDAY) == 1
    assert seconds_until(reset, reset - timedelta(seconds=90.5)) == 91
    assert seconds_until(reset, reset + timedelta(hours=1)) == 1


def test_bad_periods_and_caps_are_refused() -> None:
    assert [valid_period(p) for p in PERIODS] == ["day", "week", "month"]
    for bad in ("fortnight", "Day", ""):
        with pytest.raises(InvalidParameter):
            valid_period(bad)
    with pytest.raises(ValueError):
        period_start("year", WEDNESDAY)
    assert valid_period_cap(1) == 1.0
    for cap in (0.0, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(InvalidParameter):
            valid_period_cap(cap)  # type: ignore[arg-type]
