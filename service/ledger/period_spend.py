"""An account's spend in its current budget period, read from the ledger under its lock.

The period cap renews (service/ledger/periods.py); the lifetime cap does not. Admission of a
charge to an account with a period:

* takes ``now`` from the database's clock (:func:`database_now`: ``clock_timestamp()`` on
  PostgreSQL, ``strftime('%f', 'now')`` on SQLite), once per admission transaction, after
  the account's spend row is locked: every worker and every machine reads the one clock, so
  two workers never disagree on which period a charge falls in, and the charges of an
  account get their periods in the order of its lock. That ``now`` is also the charge's
  ``created_at`` (and so its ``period_start``). Accounts without a period keep the worker's
  clock, as before periods existed.
* composes the live (unrefunded) charges whose ``period_start`` lies in the current window
  (one indexed read; a group reads it once per account and adds what it charges), adds the
  query's curve, and decides with the one budget rule
  (:func:`service.ledger.budget_rule.account_cap_exceeded`) on both caps together.

A refund takes its charge out of the window it was charged in (its ``period_start`` never
changes); nothing is stored per period, so nothing else has to be kept current.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ScalarResult, bindparam, select, text
from sqlalchemy.orm import Session

from service.ledger.budget_rule import PERIOD_CAP, account_cap_exceeded
from service.ledger.ledger_rows import budget_view, spent_curve
from service.ledger.locked_rows import CHARGES, AdmissionWrites, LockedAccount
from service.ledger.periods import as_aware_utc, period_end, period_start, seconds_until
from service.ledger.records import BudgetExhausted, BudgetView, PeriodFigures
from service.privacy.accountant import RdpCurve

_SQLITE_NOW = text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
_POSTGRES_NOW = text("SELECT clock_timestamp()")
_PERIOD_CHARGES = (
    select(CHARGES.c.rdp)
    .where(
        CHARGES.c.charged_account_id == bindparam("account_id"),
        CHARGES.c.state != "refunded",
        CHARGES.c.period_start >= bindparam("start", type_=CHARGES.c.period_start.type),
    )
    .order_by(CHARGES.c.id)
)

#: Where an admission takes ``now`` for an account with a period: the database's clock.
Clock = Callable[[Session], datetime]


def database_now(session: Session) -> datetime:
    """The database server's clock now (aware UTC), read in ``session``'s transaction."""
    if session.get_bind().dialect.name == "sqlite":
        text_now: str = session.execute(_SQLITE_NOW).scalar_one()
        return datetime.fromisoformat(text_now).replace(tzinfo=UTC)
    moment: datetime = session.execute(_POSTGRES_NOW).scalar_one()
    return as_aware_utc(moment)


def period_spent(session: Session, account_id: int, start: datetime) -> RdpCurve:
    """The composition of the account's live charges admitted since ``start``."""
    total = RdpCurve.zero()
    values = {"account_id": account_id, "start": start}
    rows: ScalarResult[dict[str, Any]] = session.scalars(_PERIOD_CHARGES, values)
    for rdp in rows:
        total = total + RdpCurve.from_json(rdp)
    return total


def period_figures(
    period: str, cap_epsilon: float, delta: float, start: datetime, spent: RdpCurve
) -> PeriodFigures:
    return PeriodFigures(
        period=period,
        period_cap_epsilon=cap_epsilon,
        period_spent_epsilon=spent.epsilon(delta),
        started_at=start,
        resets_at=period_end(period, start),
    )


class PeriodAdmission:
    """The period side of admissions: their ``now`` and each account's current window.

    ``clock`` is :func:`database_now`; a test replaces it (``ledger.periods.clock``) with one
    that reads the database's clock and moves it, to pass a period's reset without waiting."""

    def __init__(self) -> None:
        self.clock: Clock = database_now

    def now(
        self, session: Session, account: LockedAccount, worker_now: datetime,
        writes: AdmissionWrites,
    ) -> datetime:  # fmt: skip
        """The admission's ``now`` for ``account``: the database's clock (read once per
        transaction, kept on ``writes``) if it has a period, else ``worker_now`` (as before)."""
        if account.period is None:
            return worker_now
        if writes.period_now is None:
            writes.period_now = as_aware_utc(self.clock(session))
        return writes.period_now

    def read_now(self, session: Session) -> datetime:
        """``now`` for a reading of the period's figures (the admin view, ``ledger verify``)."""
        return as_aware_utc(self.clock(session))

    @staticmethod
    def window(
        session: Session, account: LockedAccount, now: datetime, writes: AdmissionWrites | None
    ) -> tuple[datetime, RdpCurve] | None:
        """The account's current window and its composed live charges (this transaction's
        charges included: they are written before the read, and added once it is held)."""
        if account.period is None:
            return None
        start = period_start(account.period, now)
        held = account.period_spent
        if held is None or held[0] != start:
            if writes is not None:
                writes.write_charges(session)
            held = (start, period_spent(session, account.account_id, start))
            account.period_spent = held
        return held

    def admit(
        self,
        session: Session,
        account: LockedAccount,
        spent: RdpCurve,
        composed: RdpCurve,
        parts: tuple[RdpCurve, ...],
        epsilon: float,
        now: datetime,
        writes: AdmissionWrites | None,
    ) -> tuple[datetime, RdpCurve] | None:
        """Decide a charge against both caps with the one budget rule: ``composed`` is
        ``spent`` with ``parts`` (the query's curve, then its degree release's if any) added
        in that order. Raise :class:`BudgetExhausted` (with the reset time when the period cap
        refuses), else return the window as it will be once the charge is written (the
        caller sets it on the account after adding the charge). Without a period this is
        exactly the lifetime check, and nothing is read."""
        held = self.window(session, account, now, writes)
        after = None
        if held is not None:
            period = held[1]
            for part in parts:
                period = period + part
            after = (held[0], period)
        refused = account_cap_exceeded(
            composed, account.delta, account.cap_epsilon,
            None if after is None else after[1], account.period_cap_epsilon,
        )  # fmt: skip
        if refused is None:
            return after
        view = locked_view(account, spent)
        retry = None
        if refused == PERIOD_CAP and view.period is not None:
            retry = seconds_until(view.period.resets_at, now)
        raise BudgetExhausted(view, epsilon, retry_after=retry)


def locked_view(account: LockedAccount, spent: RdpCurve | None = None) -> BudgetView:
    """The budget view of a locked account, with its period's figures if its window is held."""
    held = account.period_spent
    figures = None
    if account.period is not None and account.period_cap_epsilon is not None and held is not None:
        figures = period_figures(
            account.period, account.period_cap_epsilon, account.delta, held[0], held[1]
        )
    curve = spent_curve(account) if spent is None else spent
    return budget_view(account, account, curve, figures)
