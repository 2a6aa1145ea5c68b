"""When each account runs out of budget at its recent rate (read-only, for the admin dashboard).

The projection, exactly: take the account's live (not refunded) charges created in the last
``window_days`` days (7 by default), degree releases included, and compose their RDP curves:
that is one window's spend W. Assume the account keeps charging at that rate: after t more
days it will have spent S + (t / window_days) W, where S is its composed spend now (the ledger's
spend curve), curves added order by order. It runs out at the first t where that converts at
the account's delta to its cap or more (:func:`service.privacy.horizon.days_until_cap`,
bisection to a minute). Composing the curves matters: extrapolating the converted epsilon
linearly would say an account with many small charges runs out far too early. An account
already at its cap runs out now (t = 0); one that charged nothing in the window never does at
its rate (no date); nor one whose projection stays below the cap for a century.

:meth:`RunOutView.near_cap` lists the accounts near their cap (spent >= fraction x cap), the
``scan`` most used of them, sorted by that date (soonest first, then those with no date).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from service.ledger.account_listing import AccountListing
from service.ledger.admin_records import AccountFilter, AccountRow, naive_utc
from service.ledger.tables import Budget, Charge, Spend, iso
from service.ledger.transactions import LedgerPart
from service.privacy.accountant import RdpCurve, curve_key
from service.privacy.horizon import days_until_cap

#: The default window of the recent rate, in days.
WINDOW_DAYS = 7.0
#: Near-cap accounts :meth:`RunOutView.near_cap` projects at most (the most used first).
SCAN_MAX = 1000


@dataclass(frozen=True)
class RunOut:
    """One account's projection."""

    account_id: int
    cap_epsilon: float
    delta: float
    spent_epsilon: float
    window_days: float
    #: Live charges created in the window, and their composition converted at ``delta``.
    window_charges: int
    window_epsilon: float
    #: Days from ``as_of`` until the cap (None: not at this rate), and that moment.
    days_left: float | None
    runs_out_at: str | None
    as_of: str


@dataclass(frozen=True)
class NearCapRunOut:
    """Near-cap accounts sorted by when they run out."""

    as_of: str
    window_days: float
    near_cap_fraction: float
    near_cap_total: int
    scanned: int
    items: list[tuple[AccountRow, RunOut]] = field(default_factory=list)


class RunOutView(LedgerPart):
    """Run-out projections (each call one read transaction)."""

    def run_out(
        self,
        account_ids: Sequence[int],
        *,
        window_days: float = WINDOW_DAYS,
        now: datetime | None = None,
    ) -> dict[int, RunOut]:
        """The projection of each of ``account_ids`` (unknown ids are left out; see
        :meth:`run_out_of` for one account, 404 when unknown)."""
        now = now or datetime.now(UTC)
        ids = sorted({int(a) for a in account_ids})
        if not ids:
            return {}
        with self._reading() as session:
            budgets = session.execute(
                select(Budget.account_id, Budget.cap_epsilon, Budget.delta, Spend.rdp)
                .join(Spend, Spend.account_id == Budget.account_id)
                .where(Budget.account_id.in_(ids))
            ).all()
            since = naive_utc(now - timedelta(days=window_days), session)
            charges = session.execute(
                select(Charge.charged_account_id, Charge.rdp).where(
                    Charge.charged_account_id.in_(ids),
                    Charge.created_at >= since,
                    Charge.state != "refunded",
                )
            ).all()
        parsed: dict[str, RdpCurve] = {}

        def curve(data: dict[str, Any]) -> RdpCurve:
            key = curve_key(data)
            hit = parsed.get(key)
            if hit is None:
                hit = parsed[key] = RdpCurve.from_json(data)
            return hit

        windows: dict[int, RdpCurve] = {}
        counts: dict[int, int] = {}
        for charge in charges:
            a = int(charge.charged_account_id)
            windows[a] = windows.get(a, RdpCurve.zero()) + curve(charge.rdp)
            counts[a] = counts.get(a, 0) + 1
        as_of = iso(now) or ""
        result: dict[int, RunOut] = {}
        for row in budgets:
            a, cap, delta = int(row.account_id), float(row.cap_epsilon), float(row.delta)
            spent = curve(row.rdp)
            window = windows.get(a, RdpCurve.zero())
            days = days_until_cap(spent, window, window_days, cap, delta)
            result[a] = RunOut(
                account_id=a,
                cap_epsilon=cap,
                delta=delta,
                spent_epsilon=spent.epsilon(delta),
                window_days=window_days,
                window_charges=counts.get(a, 0),
                window_epsilon=window.epsilon(delta),
                days_left=days,
                runs_out_at=None if days is None else iso(now + timedelta(days=days)),
                as_of=as_of,
            )
        return result

    def run_out_of(
        self, account_id: int, *, window_days: float = WINDOW_DAYS, now: datetime | None = None
    ) -> RunOut:
        """One account's projection (``unknown_account`` when there is no such account)."""
        with self._reading() as session:
            self._account(session, account_id)
        return self.run_out([account_id], window_days=window_days, now=now)[account_id]

    def near_cap(
        self,
        *,
        near_cap_fraction: float = 0.8,
        window_days: float = WINDOW_DAYS,
        limit: int = 10,
        scan: int = SCAN_MAX,
        now: datetime | None = None,
    ) -> NearCapRunOut:
        """The accounts with spent >= ``near_cap_fraction`` x cap (the ``scan`` most used of
        them), sorted by when they run out: soonest first, those with no date last (by share
        used, then id)."""
        now = now or datetime.now(UTC)
        page = AccountListing(self._transactions).accounts_page(
            AccountFilter(status="near_cap", near_cap_fraction=near_cap_fraction),
            sort="used",
            limit=scan,
        )
        rows: list[AccountRow] = page.items
        projections = self.run_out([r.account_id for r in rows], window_days=window_days, now=now)
        paired = [(r, projections[r.account_id]) for r in rows if r.account_id in projections]

        def order(pair: tuple[AccountRow, RunOut]) -> tuple[bool, float, float, int]:
            row, run = pair
            days = run.days_left
            return (days is None, days if days is not None else 0.0, -row.used_fraction,
                    row.account_id)  # fmt: skip

        paired.sort(key=order)
        return NearCapRunOut(
            as_of=iso(now) or "",
            window_days=window_days,
            near_cap_fraction=near_cap_fraction,
            near_cap_total=page.total,
            scanned=len(rows),
            items=paired[:limit],
        )
