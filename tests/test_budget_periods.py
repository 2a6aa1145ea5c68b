"""Budget periods on the ledger (SQLite and PostgreSQL): a cap per UTC day on top of the
lifetime cap, decided under the account's lock with the database's clock (moved here through
``ledger.periods.clock``, never by sleeping), the lifetime figure composed throughout, refunds
back into their period, groups, and ``ledger verify``."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.errors import InvalidParameter
from service.ledger import BudgetExhausted, Ledger
from service.ledger.period_spend import database_now
from service.ledger.periods import period_end
from service.ledger.records import Admission, ChargeReceipt
from service.ledger.tables import Charge
from service.privacy.accountant import compose
from service.privacy.curves import laplace_curve
from tests.ledger_support import admit_and_charge, independent_laplace_epsilon

DELTA = 1e-6
PER_QUERY = 0.03
DAY_CAP = 0.1  # three queries of 0.03 fit in a day (their pure figure: 0.09), a fourth does not


def _admission(account: int, i: int, **kwargs: Any) -> dict[str, Any]:
    return dict(
        charged_account_id=account, principal_account_id=account, seed=f"n{i}",
        mechanism="noisy_diffusion", mode="edge", params={"i": i},
        query_curve=laplace_curve(PER_QUERY), query_epsilon=PER_QUERY, graph_version="g1",
        request_id=f"r{i}", **kwargs,
    )  # fmt: skip


def _moved_clock(ledger: Ledger) -> Callable[[timedelta], None]:
    """Make the ledger's period clock the database's clock plus a shift; returns the setter."""
    shift = [timedelta(0)]

    def clock(session: Session) -> datetime:
        return database_now(session) + shift[0]

    ledger.periods.clock = clock

    def move(by: timedelta) -> None:
        shift[0] = by

    return move


def _independent_epsilon(charges: int) -> float:
    return independent_laplace_epsilon(PER_QUERY, charges, DELTA)


def _daily_account(ledger: Ledger, cap: float = 10.0) -> int:
    account = ledger.accounts.create_account("service", cap_epsilon=cap, delta=DELTA).account_id
    view = ledger.budgets.set_period(account, period="day", period_cap_epsilon=DAY_CAP)
    assert view.period is not None and view.period.period_spent_epsilon == 0.0
    return account


def test_a_day_spent_is_refused_with_its_reset_then_answered_after_it(ledger: Ledger) -> None:
    move = _moved_clock(ledger)
    account = _daily_account(ledger)
    charged = 0
    lifetime: list[float] = []
    for day in range(3):
        move(timedelta(days=day))
        for i in range(3):
            receipt = admit_and_charge(ledger, **_admission(account, 10 * day + i))
            charged += 1
            assert receipt.budget.period is not None
            lifetime.append(receipt.budget.spent_epsilon)
        with pytest.raises(BudgetExhausted) as refused:
            admit_and_charge(ledger, **_admission(account, 10 * day + 9))
        error = refused.value
        assert error.code == "budget_exhausted" and error.status == 403
        period = error.budget.period
        assert period is not None and period.period == "day"
        assert period.period_spent_epsilon == pytest.approx(_independent_epsilon(3), rel=1e-6)
        with Session(ledger.engine) as session:
            now = database_now(session) + timedelta(days=day)
        reset = period_end("day", now)
        assert period.resets_at == reset and error.details["resets_at"] == reset.isoformat()
        assert error.details["cap"] == "period_cap"
        assert error.retry_after is not None
        assert 0 < error.retry_after <= math.ceil((reset - now).total_seconds()) + 1
    # the lifetime figure kept growing across the days, as an independent composition says
    assert lifetime == sorted(lifetime) and len(set(lifetime)) == len(lifetime)
    view = ledger.budgets.budget(account)
    assert view.charges == charged == 9
    assert view.spent_epsilon == pytest.approx(_independent_epsilon(charged), rel=1e-6)
    assert view.spent_epsilon > DAY_CAP  # the lifetime figure is past any one day's cap
    assert ledger.reports.verify().ok


def test_the_lifetime_cap_still_holds_and_does_not_renew(ledger: Ledger) -> None:
    move = _moved_clock(ledger)
    lifetime_cap = compose([laplace_curve(PER_QUERY)] * 4).epsilon(DELTA) * 1.0001
    account = _daily_account(ledger, cap=lifetime_cap)
    for i in range(3):
        admit_and_charge(ledger, **_admission(account, i))
    move(timedelta(days=1))
    admit_and_charge(ledger, **_admission(account, 3))
    with pytest.raises(BudgetExhausted) as refused:
        admit_and_charge(ledger, **_admission(account, 4))
    assert refused.value.retry_after is None and "cap" not in refused.value.details
    move(timedelta(days=5))  # no reset helps
    with pytest.raises(BudgetExhausted):
        admit_and_charge(ledger, **_admission(account, 5))


def test_a_refund_goes_back_into_the_period_it_was_charged_in(ledger: Ledger) -> None:
    move = _moved_clock(ledger)
    account = _daily_account(ledger)
    receipts = [admit_and_charge(ledger, **_admission(account, i)) for i in range(3)]
    ledger.settlement.refund(receipts[2].charge_id, reason="test: nothing released")
    assert admit_and_charge(ledger, **_admission(account, 3)).budget.period is not None
    # a refund of yesterday's charge does not free anything today
    move(timedelta(days=1))
    today = [admit_and_charge(ledger, **_admission(account, 10 + i)) for i in range(3)]
    ledger.settlement.refund(receipts[0].charge_id, reason="test: yesterday's")
    with pytest.raises(BudgetExhausted):
        admit_and_charge(ledger, **_admission(account, 20))
    assert len(today) == 3
    assert ledger.reports.verify().ok


def test_a_group_composes_within_the_period_in_order(ledger: Ledger) -> None:
    _moved_clock(ledger)
    account = _daily_account(ledger)
    other = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    admit_and_charge(ledger, **_admission(account, 0))
    group = [Admission(**_admission(account, 1)), Admission(**_admission(other, 2)),
             Admission(**_admission(account, 3)), Admission(**_admission(account, 4))]  # fmt: skip
    outcomes = ledger.admission.admit_and_charge_many(group)
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["ChargeReceipt", "ChargeReceipt", "ChargeReceipt", "BudgetExhausted"]
    refused = outcomes[3]
    assert isinstance(refused, BudgetExhausted) and refused.retry_after is not None
    last = outcomes[2]
    assert isinstance(last, ChargeReceipt) and last.budget.period is not None
    spent = last.budget.period.period_spent_epsilon
    assert spent == pytest.approx(_independent_epsilon(3), rel=1e-6)
    assert ledger.reports.verify().ok


def test_without_a_period_nothing_changes_and_clearing_one_lifts_it(ledger: Ledger) -> None:
    _moved_clock(ledger)
    account = _daily_account(ledger)
    for i in range(3):
        admit_and_charge(ledger, **_admission(account, i))
    with pytest.raises(BudgetExhausted):
        admit_and_charge(ledger, **_admission(account, 3))
    view = ledger.budgets.set_period(account, period=None, period_cap_epsilon=None)
    assert view.period is None and "period" not in view.to_dict()
    receipt = admit_and_charge(ledger, **_admission(account, 4))
    assert receipt.budget.period is None and "period_cap_epsilon" not in receipt.budget.to_dict()
    with pytest.raises(InvalidParameter):
        ledger.budgets.set_period(account, period="fortnight", period_cap_epsilon=1.0)
    with pytest.raises(InvalidParameter):
        ledger.budgets.set_period(account, period="day", period_cap_epsilon=None)
    with pytest.raises(InvalidParameter):
        ledger.budgets.set_period(account, period="week", period_cap_epsilon=-1.0)
    audit = ledger.reports.list_audit()
    periods = [e["details"]["period"] for e in audit if "period" in e["details"]]
    assert periods == [{"old": "day", "new": None}, {"old": None, "new": "day"}]


def test_verify_checks_every_charges_period(ledger: Ledger) -> None:
    _moved_clock(ledger)
    account = _daily_account(ledger)
    for i in range(2):
        admit_and_charge(ledger, **_admission(account, i))
    assert ledger.reports.verify().ok
    with Session(ledger.engine) as session, session.begin():
        session.execute(update(Charge).values(period_start=datetime(2001, 1, 1, tzinfo=UTC)))
    report = ledger.reports.verify()
    assert not report.ok
    assert {m["kind"] for m in report.mismatches} == {"period_start"}


def test_a_charge_whose_worker_died_holds_its_period_until_it_is_reconciled(
    ledger: Ledger,
) -> None:
    """A worker killed between charge and answer leaves its charge ``admitted``: it counts in
    its period (nothing is given back on a guess), and the reconciler's refund frees it."""
    _moved_clock(ledger)
    account = _daily_account(ledger)
    for i in range(3):  # admitted, never released: their workers died
        admit_and_charge(ledger, **_admission(account, i))
    with pytest.raises(BudgetExhausted):
        admit_and_charge(ledger, **_admission(account, 3))
    refunded = ledger.settlement.reconcile(older_than_seconds=0.0)
    assert len(refunded) == 3
    assert admit_and_charge(ledger, **_admission(account, 4)).budget.charges == 1
    assert ledger.reports.verify().ok


def test_new_accounts_get_the_default_period() -> None:
    from service.settings.mechanism import MechanismSettings

    settings = MechanismSettings(default_period="week", default_period_cap_epsilon=0.5)
    assert settings.default_budget_period == ("week", 0.5)
    assert MechanismSettings().default_budget_period is None  # off by default
    with pytest.raises(ValueError, match="go together"):
        MechanismSettings(default_period="day")


def test_the_default_period_is_given_to_new_accounts(ledger: Ledger) -> None:
    ledger.accounts.default_period = ("month", 0.5)
    account = ledger.accounts.create_account("user", node_id="7", cap_epsilon=2.0, delta=DELTA)
    view = ledger.budgets.budget(account.account_id)
    assert view.period is not None and view.period.period == "month"
    assert view.period.period_cap_epsilon == 0.5
    ledger.accounts.default_period = None
    other = ledger.accounts.create_account("user", node_id="8", cap_epsilon=2.0, delta=DELTA)
    assert ledger.budgets.budget(other.account_id).period is None
