"""The period side of admission (service/ledger/period_spend.py) on an SQLite ledger: the
database's clock, the window's composition and the decision of the one budget rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from service.ledger import BudgetExhausted, Ledger, upgrade
from service.ledger.locked_rows import AdmissionWrites, lock_account
from service.ledger.period_spend import (
    PeriodAdmission,
    database_now,
    locked_view,
    period_figures,
    period_spent,
)
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve

DELTA = 1e-6


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    return Ledger.from_url(url)


def test_the_database_clock_is_aware_utc_and_current(ledger: Ledger) -> None:
    with Session(ledger.engine) as session:
        now = database_now(session)
    assert now.tzinfo is UTC
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)


def test_a_window_composes_its_charges_and_the_rule_decides_both_caps(ledger: Ledger) -> None:
    account = ledger.accounts.create_account("service", cap_epsilon=5.0, delta=DELTA).account_id
    ledger.budgets.set_period(account, period="week", period_cap_epsilon=0.25)
    curve = laplace_curve(0.1)
    periods = PeriodAdmission()
    with Session(ledger.engine) as session, session.begin():
        locked = lock_account(session, account)
        assert locked is not None and locked.period == "week"
        writes = AdmissionWrites()
        now = periods.now(session, locked, datetime(2000, 1, 1, tzinfo=UTC), writes)
        assert now.year > 2000 and periods.now(session, locked, now, writes) is now  # read once
        spent = RdpCurve.zero()
        window = periods.admit(session, locked, spent, spent + curve, (curve,), 0.1, now, writes)
        assert window is not None and window[1] == curve
        locked.period_spent = window
        twice = curve + curve
        window = periods.admit(session, locked, curve, twice, (curve,), 0.1, now, writes)
        assert window is not None
        locked.period_spent = window
        with pytest.raises(BudgetExhausted) as refused:
            periods.admit(session, locked, twice, twice + curve, (curve,), 0.1, now, writes)
        assert refused.value.retry_after is not None and refused.value.retry_after >= 1
        view = locked_view(locked)
        assert view.period is not None and view.period.period == "week"
        assert period_spent(session, account, window[0]) == RdpCurve.zero()  # none written
    figures = period_figures("day", 1.0, DELTA, datetime(2026, 3, 4, tzinfo=UTC), curve)
    assert figures.resets_at == datetime(2026, 3, 5, tzinfo=UTC)
    shown = figures.to_dict()
    assert shown["period_remaining_epsilon"] == 1.0 - curve.epsilon(DELTA)
    assert shown["period_resets_at"] == "2026-03-05T00:00:00+00:00"
