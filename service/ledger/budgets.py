"""Budgets and scopes: an account's cap and delta, a service account's modes, quota and read cap."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.errors import InvalidParameter
from service.ledger.api_keys import ApiKeys
from service.ledger.ledger_rows import (
    account_record,
    budget_view,
    spent_curve,
    valid_cap,
    valid_delta,
    valid_modes,
    valid_quota,
    valid_read_cap,
)
from service.ledger.period_spend import PeriodAdmission, period_figures, period_spent
from service.ledger.periods import period_start, valid_period, valid_period_cap
from service.ledger.records import (
    AccountRecord,
    BudgetView,
    PeriodFigures,
)
from service.ledger.tables import (
    Budget,
    Spend,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)


class Budgets(LedgerPart):
    """The budget of each account and the scopes of service accounts (both audited)."""

    def __init__(
        self, transactions: LedgerTransactions, api_keys: ApiKeys, periods: PeriodAdmission
    ) -> None:
        super().__init__(transactions)
        self._api_keys = api_keys  # a scope change forgets this process's cached lookups
        self._periods = periods

    def budget(self, account_id: int) -> BudgetView:
        """The lifetime figure, and with a budget period the current period's (spent, cap,
        reset time) read at the database's clock."""
        with self._reading() as session:
            budget = self._budget_row(session, account_id)
            spend = session.get(Spend, account_id)
            assert spend is not None  # created with the budget row
            return budget_view(budget, spend, None, self._period_figures(session, budget))

    def _period_figures(self, session: Session, budget: Budget) -> PeriodFigures | None:
        if budget.period is None or budget.period_cap_epsilon is None:
            return None
        start = period_start(budget.period, self._periods.read_now(session))
        spent = period_spent(session, budget.account_id, start)
        return period_figures(budget.period, budget.period_cap_epsilon, budget.delta, start, spent)

    def account_delta(self, account_id: int) -> float:
        with self._reading() as session:
            return self._budget_row(session, account_id).delta

    def set_period(
        self,
        account_id: int,
        *,
        period: str | None,
        period_cap_epsilon: float | None,
        actor_account_id: int | None = None,
    ) -> BudgetView:
        """Give the account a cap per UTC ``period`` with its cap, or take it away (both
        None): :meth:`set_budget` with these alone."""
        if period is None and period_cap_epsilon is None:
            return self.set_budget(account_id, clear_period=True, actor_account_id=actor_account_id)
        if period is None or period_cap_epsilon is None:
            raise InvalidParameter(
                "period_cap_epsilon", "a period and its cap are set together, or cleared together"
            )
        return self.set_budget(
            account_id, period=period, period_cap_epsilon=period_cap_epsilon,
            actor_account_id=actor_account_id,
        )  # fmt: skip

    def set_budget(
        self,
        account_id: int,
        *,
        cap_epsilon: float | None = None,
        delta: float | None = None,
        period: str | None = None,
        period_cap_epsilon: float | None = None,
        clear_period: bool = False,
        actor_account_id: int | None = None,
    ) -> BudgetView:
        """Change the cap and/or delta, and the budget period, in one audited transaction
        (``budget.set``). The spend is an RDP curve, so a new delta re-converts it; a cap below
        the spend is allowed and simply refuses further queries.

        A ``period`` (day, week or month: UTC windows) caps what the account spends per period
        on top of its lifetime cap: both are given for an account without one, either alone
        changes that of an account with one; ``clear_period`` removes it. The charges already
        made in the current window count against a new period cap."""
        cap = None if cap_epsilon is None else valid_cap(cap_epsilon)
        dlt = None if delta is None else valid_delta(delta)
        chosen = None if period is None else valid_period(period)
        period_cap = None if period_cap_epsilon is None else valid_period_cap(period_cap_epsilon)
        if clear_period and (chosen is not None or period_cap is not None):
            raise InvalidParameter("clear_period", "cannot be given with a period or its cap")
        with self._writing() as session:
            spend = self._lock_spend(session, account_id)  # serialise with admissions
            budget = self._budget_row(session, account_id)
            new_period = None if clear_period else (chosen or budget.period)
            new_period_cap = None if clear_period else (period_cap or budget.period_cap_epsilon)
            if (new_period is None) != (new_period_cap is None):
                raise InvalidParameter(
                    "period_cap_epsilon" if new_period_cap is None else "period",
                    "the account has no budget period: give both period and period_cap_epsilon",
                )
            changes: dict[str, Any] = {}
            if cap is not None and cap != budget.cap_epsilon:
                changes["cap_epsilon"] = {"old": budget.cap_epsilon, "new": cap}
                budget.cap_epsilon = cap
            if dlt is not None and dlt != budget.delta:
                changes["delta"] = {"old": budget.delta, "new": dlt}
                budget.delta = dlt
            if new_period != budget.period:
                changes["period"] = {"old": budget.period, "new": new_period}
                budget.period = new_period
            if new_period_cap != budget.period_cap_epsilon:
                changes["period_cap_epsilon"] = {
                    "old": budget.period_cap_epsilon, "new": new_period_cap,
                }  # fmt: skip
                budget.period_cap_epsilon = new_period_cap
            if changes:
                budget.updated_at = utcnow()
                spend.epsilon = spent_curve(spend).epsilon(budget.delta)
                self._audit(
                    session,
                    "budget.set",
                    actor=actor_account_id,
                    target=account_id,
                    details=changes,
                )
                session.flush()
            return budget_view(budget, spend, None, self._period_figures(session, budget))

    def set_scopes(
        self,
        account_id: int,
        *,
        modes: tuple[str, ...] | list[str] | None = None,
        may_create_seed_accounts: bool | None = None,
        quota_epsilon: float | None = None,
        clear_quota: bool = False,
        actor_account_id: int | None = None,
        read_cap_epsilon: float | None = None,
        clear_read_cap: bool = False,
    ) -> AccountRecord:
        """Change a service account's scopes (audited): its modes, whether it may create seed
        users' accounts, its 24-hour spending quota (``clear_quota``: back to the default) and
        the cap on its read figure (``clear_read_cap``: back to the default)."""
        scoped = None if modes is None else valid_modes(modes)
        quota = valid_quota(quota_epsilon)
        read_cap = valid_read_cap(read_cap_epsilon)
        self._api_keys.forget_authentications()
        try:
            return self._set_scopes(
                account_id, scoped, may_create_seed_accounts, quota, clear_quota, actor_account_id,
                read_cap, clear_read_cap,
            )  # fmt: skip
        finally:
            self._api_keys.forget_authentications()

    def _set_scopes(
        self,
        account_id: int,
        scoped: tuple[str, ...] | None,
        may_create_seed_accounts: bool | None,
        quota: float | None,
        clear_quota: bool,
        actor_account_id: int | None,
        read_cap: float | None = None,
        clear_read_cap: bool = False,
    ) -> AccountRecord:
        with self._writing() as session:
            row = self._account(session, account_id)
            if row.type != "service":
                raise InvalidParameter("account_id", "only service accounts have scopes")
            changes: dict[str, Any] = {}
            if scoped is not None and ",".join(scoped) != row.modes:
                changes["modes"] = {"old": row.modes.split(","), "new": list(scoped)}
                row.modes = ",".join(scoped)
            if may_create_seed_accounts is not None and bool(may_create_seed_accounts) != bool(
                row.may_create_seed_accounts
            ):
                changes["may_create_seed_accounts"] = {
                    "old": bool(row.may_create_seed_accounts),
                    "new": bool(may_create_seed_accounts),
                }
                row.may_create_seed_accounts = bool(may_create_seed_accounts)
            new_quota = None if clear_quota else (quota if quota is not None else row.quota_epsilon)
            if new_quota != row.quota_epsilon:
                changes["quota_epsilon"] = {"old": row.quota_epsilon, "new": new_quota}
                row.quota_epsilon = new_quota
            new_read_cap = read_cap if read_cap is not None else row.read_cap_epsilon
            if clear_read_cap:
                new_read_cap = None
            if new_read_cap != row.read_cap_epsilon:
                changes["read_cap_epsilon"] = {"old": row.read_cap_epsilon, "new": new_read_cap}
                row.read_cap_epsilon = new_read_cap
            if changes:
                self._audit(
                    session, "scopes.set", actor=actor_account_id, target=account_id,
                    details=changes,
                )  # fmt: skip
                session.flush()
            return account_record(row)
