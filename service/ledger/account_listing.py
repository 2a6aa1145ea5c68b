"""The admin's accounts table: one page of accounts with their budgets and spend, filtered
(type, free text, status, least spend) and sorted in SQL, with ties broken by account id.

A page reads its ids first from only the tables its filter and sort need (an index scan for
the default order), then the page's full rows, so deep pages stay cheap with many accounts.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, literal, or_, select

from service.errors import InvalidParameter, shown
from service.ledger.admin_records import (
    ACCOUNT_SORTS,
    AccountFilter,
    AccountRow,
    Page,
    escape_like,
)
from service.ledger.tables import Account, Budget, Spend, iso
from service.ledger.transactions import LedgerPart


def _remaining_col() -> Any:
    return case(
        (Budget.cap_epsilon > Spend.epsilon, Budget.cap_epsilon - Spend.epsilon), else_=literal(0.0)
    )


def _used_col() -> Any:
    return Spend.epsilon / Budget.cap_epsilon


#: Sort key -> (column, tie-breaker). The tie-breaker is the account id *of the same table*,
#: so an index on (column, account_id) serves the order without a sort on either database.
_SORT_COLUMNS: dict[str, tuple[Any, Any]] = {
    "account_id": (Account.id, None),
    "spent": (Spend.epsilon, Spend.account_id),
    "charges": (Spend.charges, Spend.account_id),
    "cap": (Budget.cap_epsilon, Budget.account_id),
    "delta": (Budget.delta, Budget.account_id),
    "created": (Account.created_at, Account.id),
}


def _sort_columns(sort: str) -> tuple[Any, Any]:
    if sort in _SORT_COLUMNS:
        return _SORT_COLUMNS[sort]
    if sort == "remaining":
        return _remaining_col(), Spend.account_id
    if sort == "used":
        return _used_col(), Spend.account_id
    if sort == "last_charge":
        # never-charged accounts sort as the oldest
        return func.coalesce(Spend.last_charge_at, Account.created_at), Spend.account_id
    raise InvalidParameter("sort", f"must be one of {', '.join(ACCOUNT_SORTS)}, got {shown(sort)}")


def _filtered(stmt: Any, flt: AccountFilter, key: Any = None) -> Any:
    """``stmt`` with the filter's conditions. ``key`` is the account id column of ``stmt``'s
    tables: free text then matches through ``key IN (matching accounts)``, so the accounts are
    scanned once (a hashed subquery) rather than probed row by row along the sort's index."""
    if flt.type is not None:
        stmt = stmt.where(Account.type == flt.type)
    if flt.q:
        q = flt.q.strip()
        like = escape_like(q)
        clauses: list[Any] = [
            Account.node_id == q,
            Account.node_id.like(f"{like}%", escape="\\"),
            func.lower(Account.label).like(f"%{like.lower()}%", escape="\\"),
        ]
        if q.isdigit() and len(q) <= 12:
            clauses.append(Account.id == int(q))
        if key is None:
            stmt = stmt.where(or_(*clauses))
        else:
            stmt = stmt.where(key.in_(select(Account.id).where(or_(*clauses))))
    if flt.status == "active":
        stmt = stmt.where(Spend.epsilon > 0)
    elif flt.status == "idle":
        stmt = stmt.where(Spend.epsilon <= 0)
    elif flt.status == "near_cap":
        # spent >= fraction * cap > 0: the first condition narrows by the spend index
        stmt = stmt.where(
            Spend.epsilon > 0, Spend.epsilon >= Budget.cap_epsilon * flt.near_cap_fraction
        )
    elif flt.status == "over_cap":
        stmt = stmt.where(Spend.epsilon > 0, Spend.epsilon > Budget.cap_epsilon)
    if flt.min_spent_epsilon is not None:
        stmt = stmt.where(Spend.epsilon >= flt.min_spent_epsilon)
    return stmt


def _joined(stmt: Any) -> Any:
    return stmt.join(Budget, Budget.account_id == Account.id).join(
        Spend, Spend.account_id == Account.id
    )


_SORT_TABLES: dict[str, frozenset[str]] = {
    "account_id": frozenset({"account"}),
    "created": frozenset({"account"}),
    "spent": frozenset({"spend"}),
    "charges": frozenset({"spend"}),
    "cap": frozenset({"budget"}),
    "delta": frozenset({"budget"}),
    "remaining": frozenset({"spend", "budget"}),
    "used": frozenset({"spend", "budget"}),
    "last_charge": frozenset({"spend", "account"}),
}


def _tables_read(flt: AccountFilter) -> set[str]:
    tables: set[str] = set()
    if flt.status != "any" or flt.min_spent_epsilon is not None:
        tables.add("spend")
    if flt.status in ("near_cap", "over_cap"):
        tables.add("budget")
    if flt.type is not None:
        tables.add("account")
    return tables


def _from(tables: set[str] | frozenset[str], *columns: Any) -> Any:
    """``select(columns)`` over just these tables, joined on the account id (every account has
    exactly one budget and one spend row, so leaving a table out never changes the rows)."""
    order = [t for t in ("spend", "budget", "account") if t in tables] or ["account"]
    keys = {"spend": Spend.account_id, "budget": Budget.account_id, "account": Account.id}
    models = {"spend": Spend, "budget": Budget, "account": Account}
    stmt = select(*columns).select_from(models[order[0]])
    for table in order[1:]:
        stmt = stmt.join(models[table], keys[table] == keys[order[0]])
    return stmt


def _id_column(tables: set[str] | frozenset[str]) -> Any:
    for table, key in (("spend", Spend.account_id), ("budget", Budget.account_id)):
        if table in tables:
            return key
    return Account.id


def _account_row(row: Any) -> AccountRow:
    account, cap, delta, spent, charges, last = row
    return AccountRow(
        account_id=account.id,
        type=account.type,
        node_id=account.node_id,
        label=account.label,
        cap_epsilon=float(cap),
        delta=float(delta),
        spent_epsilon=float(spent),
        remaining_epsilon=max(0.0, float(cap) - float(spent)),
        used_fraction=float(spent) / float(cap),
        charges=int(charges),
        last_charge_at=iso(last),
        created_at=iso(account.created_at) or "",
    )


class AccountListing(LedgerPart):
    """The accounts table (each call one read transaction)."""

    def accounts_page(
        self,
        flt: AccountFilter,
        *,
        sort: str = "spent",
        descending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> Page:
        """One page of accounts with their budgets, sorted and filtered in SQL; ties are
        broken by account id (same direction), so the order is stable across pages."""
        column, tie = _sort_columns(sort)
        order = [column.desc() if descending else column.asc()]
        if tie is not None:
            order.append(tie.desc() if descending else tie.asc())
        filtered = _tables_read(flt)
        # The page's ids first, from only the tables the filter and the sort read (an index
        # scan for the default order), then the 50 full rows: deep pages stay cheap.
        needed = filtered | _SORT_TABLES[sort]
        ids_stmt = _filtered(_from(needed, _id_column(needed)), flt, _id_column(needed))
        count = _filtered(_from(filtered, func.count()), flt, _id_column(filtered))
        with self._reading() as session:
            total = int(session.scalar(count) or 0)
            ids = [
                int(i)
                for i in session.scalars(ids_stmt.order_by(*order).limit(limit).offset(offset))
            ]
            rows = session.execute(
                _joined(
                    select(
                        Account,
                        Budget.cap_epsilon,
                        Budget.delta,
                        Spend.epsilon,
                        Spend.charges,
                        Spend.last_charge_at,
                    )
                ).where(Account.id.in_(ids))
            ).all()
        position = {account_id: i for i, account_id in enumerate(ids)}
        ordered = sorted(rows, key=lambda row: position[row[0].id])
        return Page(total, limit, offset, [_account_row(r) for r in ordered])
