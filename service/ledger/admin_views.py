"""Read-only views of the ledger for admins: the accounts table, usage per hour, refusals by
reason, an account's composed curve, a service account's charges to others, the audit log.

Everything here is computed in SQL where it can be (sorting, filtering, paging, grouping by
hour) so it stays fast with many accounts; only an account's own curve is composed in Python,
by the same RDP accountant that admission uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import and_, case, func, literal, or_, select
from sqlalchemy.orm import Session

from service.errors import InvalidParameter
from service.ledger.exposure import _as_time, _hour
from service.ledger.ledger import QUOTA_WINDOW, Ledger
from service.ledger.tables import Account, AuditLog, Budget, Charge, Refusal, Spend, iso
from service.privacy.accountant import RdpCurve, curve_key

AccountSort = Literal[
    "account_id", "spent", "remaining", "used", "cap", "delta", "charges", "last_charge", "created"
]
ACCOUNT_SORTS: tuple[str, ...] = (
    "account_id", "spent", "remaining", "used", "cap", "delta", "charges", "last_charge", "created",
)  # fmt: skip
AccountStatus = Literal["any", "active", "near_cap", "over_cap", "idle"]

#: How many points of an account's curve are returned at most (the last point always is).
CURVE_POINTS_MAX = 2000


@dataclass(frozen=True)
class AccountFilter:
    type: str | None = None
    #: Free text: an account id, a node id (exact or prefix) or part of a label.
    q: str | None = None
    status: AccountStatus = "any"
    #: ``near_cap``: spent at least this fraction of the cap.
    near_cap_fraction: float = 0.8
    min_spent_epsilon: float | None = None


@dataclass(frozen=True)
class AccountRow:
    account_id: int
    type: str
    node_id: str | None
    label: str | None
    cap_epsilon: float
    delta: float
    spent_epsilon: float
    remaining_epsilon: float
    used_fraction: float
    charges: int
    last_charge_at: str | None
    created_at: str


@dataclass(frozen=True)
class Page:
    total: int
    limit: int
    offset: int
    items: list[Any]


@dataclass(frozen=True)
class AuditPage(Page):
    #: Every action that occurs in the log (for a filter's choices).
    actions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HourUsage:
    at: str
    queries: int
    epsilon: float
    refunded: int
    refusals: int


@dataclass(frozen=True)
class CurvePoint:
    at: str
    charge_id: int
    epsilon: float  # this charge's own per-query epsilon
    composed_epsilon: float  # everything so far, composed by the accountant at the delta
    naive_epsilon: float  # the per-query epsilons added up


@dataclass(frozen=True)
class AccountCurve:
    account_id: int
    delta: float
    cap_epsilon: float
    charges: int
    composed_epsilon: float
    naive_epsilon: float
    points: list[CurvePoint] = field(default_factory=list)


@dataclass(frozen=True)
class BudgetPreview:
    account_id: int
    cap_epsilon: float
    delta: float
    spent_epsilon: float
    remaining_epsilon: float
    cap_below_spent: bool


@dataclass(frozen=True)
class ServiceUsage:
    """What a service account charged to other accounts (seed users, personalized mode)."""

    account_id: int
    modes: list[str]
    may_create_seed_accounts: bool
    quota_epsilon: float
    quota_is_default: bool
    used_24h_epsilon: float
    charges_to_others: int
    epsilon_to_others: float
    accounts_charged: int
    top_charged: list[dict[str, Any]]


def _spent_col() -> Any:
    return Spend.epsilon


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
    raise InvalidParameter("sort", f"must be one of {', '.join(ACCOUNT_SORTS)}, got {sort!r}")


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _filtered(stmt: Any, flt: AccountFilter, key: Any = None) -> Any:
    """``stmt`` with the filter's conditions. ``key`` is the account id column of ``stmt``'s
    tables: free text then matches through ``key IN (matching accounts)``, so the accounts are
    scanned once (a hashed subquery) rather than probed row by row along the sort's index."""
    if flt.type is not None:
        stmt = stmt.where(Account.type == flt.type)
    if flt.q:
        q = flt.q.strip()
        like = _escape_like(q)
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


def _hours_back(hours: int, now: datetime | None = None) -> tuple[datetime, list[datetime]]:
    """The start of the window and every hour in it, oldest first (the current hour last)."""
    now = now or datetime.now(UTC)
    top = now.replace(minute=0, second=0, microsecond=0)
    slots = [top - timedelta(hours=h) for h in range(hours - 1, -1, -1)]
    return slots[0], slots


def _naive(moment: datetime, session: Session) -> datetime:
    """SQLite stores naive UTC: compare with naive values there."""
    if session.get_bind().dialect.name == "sqlite":
        return moment.replace(tzinfo=None)
    return moment


class AdminViews:
    """The admin's read-only views over one ledger (each call one read transaction)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def _reading(self) -> Any:
        return self._ledger._reading()

    # --- the accounts table ------------------------------------------------------------------

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
        rows.sort(key=lambda row: position[row[0].id])
        return Page(total, limit, offset, [_account_row(r) for r in rows])

    # --- overview ------------------------------------------------------------------------------

    def usage_per_hour(self, hours: int, now: datetime | None = None) -> list[HourUsage]:
        """Queries charged (live), their per-query eps summed, refunds and refusals per hour
        over the last ``hours`` hours, every hour present (zeros where nothing happened)."""
        start, slots = _hours_back(hours, now)
        with self._reading() as session:
            engine = session.get_bind()
            hour = _hour(engine, Charge.created_at)
            since = _naive(start, session)
            charges = session.execute(
                select(
                    hour,
                    func.sum(case((Charge.state != "refunded", 1), else_=0)),
                    func.sum(case((Charge.state != "refunded", Charge.epsilon), else_=0.0)),
                    func.sum(case((Charge.state == "refunded", 1), else_=0)),
                )
                .where(Charge.created_at >= since)
                .group_by(hour)
            ).all()
            refusal_hour = _hour(engine, Refusal.created_at)
            refusals = session.execute(
                select(refusal_hour, func.count(Refusal.id))
                .where(Refusal.created_at >= since)
                .group_by(refusal_hour)
            ).all()
        by_hour: dict[datetime, list[float]] = {s: [0, 0.0, 0, 0] for s in slots}
        for at, queries, eps, refunded in charges:
            slot = by_hour.setdefault(_as_time(at), [0, 0.0, 0, 0])
            slot[0], slot[1], slot[2] = int(queries or 0), float(eps or 0.0), int(refunded or 0)
        for at, n in refusals:
            by_hour.setdefault(_as_time(at), [0, 0.0, 0, 0])[3] = int(n)
        return [
            HourUsage(iso(at) or "", int(v[0]), float(v[1]), int(v[2]), int(v[3]))
            for at, v in sorted(by_hour.items())
            if at >= start
        ]

    def refusals_by_reason(
        self, hours: int | None = None, now: datetime | None = None
    ) -> dict[str, int]:
        """Refused queries by reason, over the last ``hours`` hours (None: ever)."""
        stmt = select(Refusal.reason, func.count(Refusal.id)).group_by(Refusal.reason)
        with self._reading() as session:
            if hours is not None:
                since = (now or datetime.now(UTC)) - timedelta(hours=hours)
                stmt = stmt.where(Refusal.created_at >= _naive(since, session))
            rows = session.execute(stmt.order_by(Refusal.reason)).all()
        return {str(reason): int(n) for reason, n in rows}

    # --- one account ---------------------------------------------------------------------------

    def _budget(self, session: Session, account_id: int) -> Budget:
        return Ledger._budget_row(session, account_id)

    def account_curve(self, account_id: int) -> AccountCurve:
        """The account's live charges in the order they were admitted, with the spend after
        each one composed by the RDP accountant at the account's delta, beside the naive sum
        of the per-query epsilons (what composition by addition would claim)."""
        with self._reading() as session:
            budget = self._budget(session, account_id)
            rows = session.execute(
                select(Charge.id, Charge.created_at, Charge.epsilon, Charge.rdp)
                .where(Charge.charged_account_id == account_id, Charge.state != "refunded")
                .order_by(Charge.created_at, Charge.id)
            ).all()
            delta, cap = float(budget.delta), float(budget.cap_epsilon)
        parsed: dict[str, RdpCurve] = {}
        running = RdpCurve.zero()
        naive_terms: list[float] = []
        points: list[CurvePoint] = []
        for charge_id, created_at, eps, rdp in rows:
            key = curve_key(rdp)
            curve = parsed.get(key)
            if curve is None:
                curve = parsed[key] = RdpCurve.from_json(rdp)
            running = running + curve
            naive_terms.append(float(eps))
            points.append(
                CurvePoint(
                    at=iso(created_at) or "",
                    charge_id=int(charge_id),
                    epsilon=float(eps),
                    composed_epsilon=running.epsilon(delta),
                    naive_epsilon=math.fsum(naive_terms),
                )
            )
        if len(points) > CURVE_POINTS_MAX:  # keep an even sample and the last point
            step = math.ceil(len(points) / CURVE_POINTS_MAX)
            points = points[::step] + ([points[-1]] if (len(points) - 1) % step else [])
        return AccountCurve(
            account_id=account_id,
            delta=delta,
            cap_epsilon=cap,
            charges=len(rows),
            composed_epsilon=running.epsilon(delta),
            naive_epsilon=math.fsum(naive_terms),
            points=points,
        )

    def preview_budget(
        self, account_id: int, *, cap_epsilon: float | None, delta: float | None
    ) -> BudgetPreview:
        """What the budget would be with this cap and/or delta (nothing is written)."""
        with self._reading() as session:
            budget = self._budget(session, account_id)
            spend = session.get(Spend, account_id)
            assert spend is not None
            cap = float(budget.cap_epsilon if cap_epsilon is None else cap_epsilon)
            dlt = float(budget.delta if delta is None else delta)
            spent = RdpCurve.from_json(spend.rdp).epsilon(dlt)
        return BudgetPreview(
            account_id=account_id,
            cap_epsilon=cap,
            delta=dlt,
            spent_epsilon=spent,
            remaining_epsilon=max(0.0, cap - spent),
            cap_below_spent=cap < spent,
        )

    def charges_page(
        self,
        account_id: int,
        *,
        role: Literal["charged", "principal"] = "charged",
        state: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page:
        """An account's charges, newest first (id breaks ties): those charged to it, or those
        it made as the principal (a service account's queries)."""
        column = Charge.charged_account_id if role == "charged" else Charge.principal_account_id
        where = [column == account_id]
        if state is not None:
            where.append(Charge.state == state)
        with self._reading() as session:
            Ledger._account(session, account_id)
            total = int(session.scalar(select(func.count(Charge.id)).where(*where)) or 0)
            rows = list(
                session.scalars(
                    select(Charge)
                    .where(*where)
                    .order_by(Charge.created_at.desc(), Charge.id.desc())
                    .limit(limit)
                    .offset(offset)
                )
            )
            items = [
                {
                    "charge_id": c.id,
                    "created_at": iso(c.created_at) or "",
                    "settled_at": iso(c.settled_at),
                    "charged_account_id": c.charged_account_id,
                    "principal_account_id": c.principal_account_id,
                    "seed": c.seed,
                    "mechanism": c.mechanism,
                    "mode": c.mode,
                    "epsilon": c.epsilon,
                    "state": c.state,
                    "graph_version": c.graph_version,
                    "request_id": c.request_id,
                    "idempotency_key": c.idempotency_key,
                    "params": dict(c.params),
                }
                for c in rows
            ]
        return Page(total, limit, offset, items)

    def service_usage(
        self, account_id: int, *, default_quota: float, now: datetime | None = None
    ) -> ServiceUsage:
        """A service account's scopes, its quota and what it charged to other accounts."""
        now = now or datetime.now(UTC)
        with self._reading() as session:
            account = Ledger._account(session, account_id)
            if account.type != "service":
                raise InvalidParameter("account_id", "only service accounts charge others")
            others = and_(
                Charge.principal_account_id == account_id,
                Charge.charged_account_id != account_id,
                Charge.state != "refunded",
            )
            count, eps, distinct = session.execute(
                select(
                    func.count(Charge.id),
                    func.coalesce(func.sum(Charge.epsilon), 0.0),
                    func.count(func.distinct(Charge.charged_account_id)),
                ).where(others)
            ).one()
            since = _naive(now - QUOTA_WINDOW, session)
            used = session.scalar(
                select(func.coalesce(func.sum(Charge.epsilon), 0.0)).where(
                    others, Charge.created_at > since
                )
            )
            top = session.execute(
                select(
                    Charge.charged_account_id,
                    func.count(Charge.id).label("n"),
                    func.sum(Charge.epsilon).label("eps"),
                )
                .where(others)
                .group_by(Charge.charged_account_id)
                .order_by(func.sum(Charge.epsilon).desc(), Charge.charged_account_id)
                .limit(10)
            ).all()
            modes = [m for m in (account.modes or "").split(",") if m]
            quota = account.quota_epsilon
            may_create = bool(account.may_create_seed_accounts)
        return ServiceUsage(
            account_id=account_id,
            modes=modes,
            may_create_seed_accounts=may_create,
            quota_epsilon=float(default_quota if quota is None else quota),
            quota_is_default=quota is None,
            used_24h_epsilon=float(used or 0.0),
            charges_to_others=int(count),
            epsilon_to_others=float(eps),
            accounts_charged=int(distinct),
            top_charged=[
                {"account_id": int(a), "charges": int(n), "epsilon": float(e)} for a, n, e in top
            ],
        )

    # --- the audit log -------------------------------------------------------------------------

    def audit_page(
        self,
        *,
        action: str | None = None,
        actor_account_id: int | None = None,
        target_account_id: int | None = None,
        account_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> AuditPage:
        """Audit rows, newest first. ``action`` matches exactly or as a prefix ending in '.'
        (``budget.`` finds every budget action); ``account_id`` matches actor or target."""
        where: list[Any] = []
        if action:
            if action.endswith("."):
                where.append(AuditLog.action.like(f"{_escape_like(action)}%", escape="\\"))
            else:
                where.append(AuditLog.action == action)
        if actor_account_id is not None:
            where.append(AuditLog.actor_account_id == actor_account_id)
        if target_account_id is not None:
            where.append(AuditLog.target_account_id == target_account_id)
        if account_id is not None:
            where.append(
                or_(
                    AuditLog.actor_account_id == account_id,
                    AuditLog.target_account_id == account_id,
                )
            )
        with self._reading() as session:
            total = int(session.scalar(select(func.count(AuditLog.id)).where(*where)) or 0)
            rows = session.scalars(
                select(AuditLog)
                .where(*where)
                .order_by(AuditLog.id.desc())
                .limit(limit)
                .offset(offset)
            )
            items = [
                {
                    "id": row.id,
                    "created_at": iso(row.created_at) or "",
                    "actor_account_id": row.actor_account_id,
                    "action": row.action,
                    "target_account_id": row.target_account_id,
                    "details": row.details,
                }
                for row in rows
            ]
            actions = [
                str(a)
                for a in session.scalars(
                    select(AuditLog.action).distinct().order_by(AuditLog.action)
                )
            ]
        return AuditPage(total, limit, offset, items, actions)

    # --- health --------------------------------------------------------------------------------

    def in_flight(self, now: datetime | None = None) -> tuple[int, float | None]:
        """Charges admitted but not settled, and the age in seconds of the oldest."""
        now = now or datetime.now(UTC)
        with self._reading() as session:
            count, oldest = session.execute(
                select(func.count(Charge.id), func.min(Charge.created_at)).where(
                    Charge.state == "admitted"
                )
            ).one()
        age = None if oldest is None else (now - _as_time(oldest)).total_seconds()
        return int(count), age
