"""The admin's page of one account: its composed privacy curve, a budget change previewed,
its charges (charged to it, or made by it as a service account) and, for a service account,
what it charged to other accounts.

The curve is the one part composed in Python, by the same RDP accountant admission uses; the
rest is SQL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import func, select

from service.errors import InvalidParameter
from service.ledger.admin_records import (
    CURVE_POINTS_MAX,
    AccountCurve,
    BudgetPreview,
    CurvePoint,
    Page,
    ServiceUsage,
    naive_utc,
)
from service.ledger.quota_and_degree import QUOTA_WINDOW
from service.ledger.quota_buckets import charges_to_others, window_sum
from service.ledger.tables import Charge, Spend, iso
from service.ledger.transactions import LedgerPart
from service.privacy.accountant import RdpCurve, curve_key


class AccountViews(LedgerPart):
    """One account's curve, budget preview, charges and service usage (each call one read
    transaction)."""

    def account_curve(self, account_id: int) -> AccountCurve:
        """The account's live charges in the order they were admitted, with the spend after
        each one composed by the RDP accountant at the account's delta, beside the naive sum
        of the per-query epsilons (what composition by addition would claim)."""
        with self._reading() as session:
            budget = self._budget_row(session, account_id)
            rows: Sequence[Any] = session.execute(
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
            budget = self._budget_row(session, account_id)
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
            self._account(session, account_id)
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
            account = self._account(session, account_id)
            if account.type != "service":
                raise InvalidParameter("account_id", "only service accounts charge others")
            others = charges_to_others(account_id)
            count, eps, distinct = session.execute(
                select(
                    func.count(Charge.id),
                    func.coalesce(func.sum(Charge.epsilon), 0.0),
                    func.count(func.distinct(Charge.charged_account_id)),
                ).where(others)
            ).one()
            used = window_sum(session, account_id, naive_utc(now - QUOTA_WINDOW, session))
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
            used_24h_epsilon=used,
            charges_to_others=int(count),
            epsilon_to_others=float(eps),
            accounts_charged=int(distinct),
            top_charged=[
                {"account_id": int(a), "charges": int(n), "epsilon": float(e)} for a, n, e in top
            ],
        )
