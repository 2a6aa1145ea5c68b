"""Budgets and scopes: an account's cap and delta, a service account's modes, quota and read cap."""

from __future__ import annotations

from typing import Any

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
from service.ledger.records import (
    AccountRecord,
    BudgetView,
)
from service.ledger.tables import (
    Spend,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)


class Budgets(LedgerPart):
    """The budget of each account and the scopes of service accounts (both audited)."""

    def __init__(self, transactions: LedgerTransactions, api_keys: ApiKeys) -> None:
        super().__init__(transactions)
        self._api_keys = api_keys  # a scope change forgets this process's cached lookups

    def budget(self, account_id: int) -> BudgetView:
        with self._reading() as session:
            budget = self._budget_row(session, account_id)
            spend = session.get(Spend, account_id)
            assert spend is not None  # created with the budget row
            return budget_view(budget, spend)

    def account_delta(self, account_id: int) -> float:
        with self._reading() as session:
            return self._budget_row(session, account_id).delta

    def set_budget(
        self,
        account_id: int,
        *,
        cap_epsilon: float | None = None,
        delta: float | None = None,
        actor_account_id: int | None = None,
    ) -> BudgetView:
        """Change the cap and/or delta. The spend is an RDP curve, so a new delta re-converts
        it; a cap below the spend is allowed and simply refuses further queries."""
        cap = None if cap_epsilon is None else valid_cap(cap_epsilon)
        dlt = None if delta is None else valid_delta(delta)
        with self._writing() as session:
            spend = self._lock_spend(session, account_id)  # serialise with admissions
            budget = self._budget_row(session, account_id)
            changes: dict[str, Any] = {}
            if cap is not None and cap != budget.cap_epsilon:
                changes["cap_epsilon"] = {"old": budget.cap_epsilon, "new": cap}
                budget.cap_epsilon = cap
            if dlt is not None and dlt != budget.delta:
                changes["delta"] = {"old": budget.delta, "new": dlt}
                budget.delta = dlt
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
            return budget_view(budget, spend)

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
