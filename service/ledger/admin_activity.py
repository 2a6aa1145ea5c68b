"""The admin's overview of the ledger's activity: queries charged, refunded and refused per
hour, refusals by reason, and the charges still in flight (admitted, not yet settled).

Grouping by hour is done in SQL, so the overview stays fast with many charges.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select

from service.ledger.admin_records import HourUsage, naive_utc
from service.ledger.exposure import as_time, hour_of
from service.ledger.tables import Charge, Refusal, iso
from service.ledger.transactions import LedgerPart


def _hours_back(hours: int, now: datetime | None = None) -> tuple[datetime, list[datetime]]:
    """The start of the window and every hour in it, oldest first (the current hour last)."""
    now = now or datetime.now(UTC)
    top = now.replace(minute=0, second=0, microsecond=0)
    slots = [top - timedelta(hours=h) for h in range(hours - 1, -1, -1)]
    return slots[0], slots


class Activity(LedgerPart):
    """Usage per hour, refusals and charges in flight (each call one read transaction)."""

    def usage_per_hour(self, hours: int, now: datetime | None = None) -> list[HourUsage]:
        """Queries charged (live), their per-query eps summed, refunds and refusals per hour
        over the last ``hours`` hours, every hour present (zeros where nothing happened)."""
        start, slots = _hours_back(hours, now)
        with self._reading() as session:
            engine = self._transactions.engine  # the engine of this read transaction
            hour = hour_of(engine, Charge.created_at)
            since = naive_utc(start, session)
            charges: Sequence[Any] = session.execute(
                select(
                    hour,
                    func.sum(case((Charge.state != "refunded", 1), else_=0)),
                    func.sum(case((Charge.state != "refunded", Charge.epsilon), else_=0.0)),
                    func.sum(case((Charge.state == "refunded", 1), else_=0)),
                )
                .where(Charge.created_at >= since)
                .group_by(hour)
            ).all()
            refusal_hour = hour_of(engine, Refusal.created_at)
            refusals: Sequence[Any] = session.execute(
                select(refusal_hour, func.count(Refusal.id))
                .where(Refusal.created_at >= since)
                .group_by(refusal_hour)
            ).all()
        by_hour: dict[datetime, list[float]] = {s: [0, 0.0, 0, 0] for s in slots}
        for at, queries, eps, refunded in charges:
            slot = by_hour.setdefault(as_time(at), [0, 0.0, 0, 0])
            slot[0], slot[1], slot[2] = int(queries or 0), float(eps or 0.0), int(refunded or 0)
        for at, n in refusals:
            by_hour.setdefault(as_time(at), [0, 0.0, 0, 0])[3] = int(n)
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
                stmt = stmt.where(Refusal.created_at >= naive_utc(since, session))
            rows = session.execute(stmt.order_by(Refusal.reason)).all()
        return {str(reason): int(n) for reason, n in rows}

    def in_flight(self, now: datetime | None = None) -> tuple[int, float | None]:
        """Charges admitted but not settled, and the age in seconds of the oldest."""
        now = now or datetime.now(UTC)
        with self._reading() as session:
            count, oldest = session.execute(
                select(func.count(Charge.id), func.min(Charge.created_at)).where(
                    Charge.state == "admitted"
                )
            ).one()
        age = None if oldest is None else (now - as_time(oldest)).total_seconds()
        return int(count), age
