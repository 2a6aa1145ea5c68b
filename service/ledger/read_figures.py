"""What a service account has read: its read figure and the cap on it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, insert, select, type_coerce
from sqlalchemy.orm import Session

from service.ledger.budget_rule import fits_under_cap
from service.ledger.id_lists import one_of
from service.ledger.records import (
    ReadCapExhausted,
    ReadView,
)
from service.ledger.tables import (
    Account,
    Budget,
    Charge,
    EncodedJson,
    ReadTotal,
    ServiceRead,
    utcnow,
)
from service.ledger.transactions import LedgerPart, unknown_account
from service.privacy.accountant import RdpCurve


@dataclass(frozen=True)
class _NewRead:
    """A release a reader is about to receive: its row's values and its parsed curve."""

    charge_id: int | None
    graph_release_id: int | None
    epsilon: float
    rdp: Any  # the stored JSON (a charge's curve: its text as stored)
    pure_epsilon: float
    curve: RdpCurve


@dataclass
class ReaderFigure:
    """A service account's read figure as a transaction holding its spend-row lock reads it:
    the composition and its count, the delta and cap it is checked at, and its row (None
    before its first read)."""

    total: RdpCurve
    releases: int
    delta: float
    cap: float | None
    row: ReadTotal | None


def reader_figure(session: Session, reader: int, default_cap_epsilon: float | None) -> ReaderFigure:
    """The reader's figure; its cap is its ``read_cap_epsilon``, else ``default_cap_epsilon``
    (None: no cap). An unknown account is :class:`UnknownAccount`."""
    # one statement for the three rows (an admission's hot path: one round trip, not three)
    found = session.execute(
        select(Account, Budget, ReadTotal)
        .join(Budget, Budget.account_id == Account.id)
        .outerjoin(ReadTotal, ReadTotal.account_id == Account.id)
        .where(Account.id == reader)
    ).first()
    if found is None:
        raise unknown_account(reader)
    account, budget, row = found
    delta = budget.delta
    cap = account.read_cap_epsilon
    cap = default_cap_epsilon if cap is None else cap
    total = RdpCurve.zero() if row is None else RdpCurve.from_json(row.rdp)
    return ReaderFigure(total, 0 if row is None else row.releases, delta, cap, row)


def has_read_graph_release(session: Session, reader: int, graph_release_id: int) -> bool:
    """Whether the reader's figure counts the graph-wide release already."""
    return (
        session.scalar(
            select(ServiceRead.id).where(
                ServiceRead.reader_account_id == reader,
                ServiceRead.graph_release_id == graph_release_id,
            )
        )
        is not None
    )


class ReadFigures(LedgerPart):
    """The releases each service account has received, composed, against its read cap."""

    def record_reads(
        self,
        reader_account_id: int,
        *,
        charge_ids: Sequence[int] = (),
        graph_release: tuple[str, str] | None = None,
        default_cap_epsilon: float | None = None,
    ) -> ReadView:
        """Count the releases a service account is about to receive in its read figure, or
        refuse with :class:`ReadCapExhausted` writing nothing.

        ``charge_ids`` name query releases (their charges' curves), ``graph_release`` a
        ``(graph_version, mechanism)`` graph-wide release. A release already counted for this
        reader adds nothing (unique per reader, so this holds across workers); the new ones are
        composed with the figure and checked against the reader's cap (its
        ``read_cap_epsilon``, else ``default_cap_epsilon``; None: no cap) at its delta, under
        the reader's spend-row lock, and recorded in the same transaction.
        """
        with self._writing() as session:
            self._lock_principal(session, reader_account_id)
            figure = reader_figure(session, reader_account_id, default_cap_epsilon)
            delta, cap, total_row = figure.delta, figure.cap, figure.row
            total, count = figure.total, figure.releases
            new: list[_NewRead] = []
            wanted = sorted(set(charge_ids))
            if wanted:
                seen = set(
                    session.scalars(
                        select(ServiceRead.charge_id).where(
                            ServiceRead.reader_account_id == reader_account_id,
                            one_of(session, ServiceRead.charge_id, wanted),
                        )
                    )
                )
                # the curves as stored (JSON text), parsed once per distinct curve (a group's
                # charges mostly share one) and copied into the reads as they are
                parsed: dict[str, RdpCurve] = {}
                for charge_id, epsilon, rdp in session.execute(
                    select(Charge.id, Charge.epsilon, type_coerce(Charge.rdp, Text))
                    .where(one_of(session, Charge.id, [c for c in wanted if c not in seen]))
                    .order_by(Charge.id)
                ):
                    curve = parsed.get(rdp)
                    if curve is None:
                        curve = parsed[rdp] = RdpCurve.from_json(json.loads(rdp))
                    new.append(
                        _NewRead(charge_id, None, epsilon, EncodedJson(rdp), curve.pure, curve)
                    )
            if graph_release is not None:
                row = self._live_graph_release(session, *graph_release)
                if row is not None and not has_read_graph_release(
                    session, reader_account_id, row.id
                ):
                    curve = RdpCurve.from_json(row.rdp)
                    new.append(
                        _NewRead(None, row.id, row.epsilon, row.rdp, row.pure_epsilon, curve)
                    )
            before = ReadView(reader_account_id, total.epsilon(delta), delta, count, cap)
            if not new:
                return before
            composed = total
            for read in new:
                composed = composed + read.curve
            after = composed.epsilon(delta)
            if cap is not None and not fits_under_cap(after, cap):
                raise ReadCapExhausted(before, after)
            now = utcnow()
            # one prepared statement per row in a pipeline (a multi-row INSERT of many reads
            # has too many parameters for psycopg's cache of parsed statements)
            session.execute(
                insert(ServiceRead),
                [
                    {
                        "reader_account_id": reader_account_id, "charge_id": read.charge_id,
                        "graph_release_id": read.graph_release_id, "epsilon": read.epsilon,
                        "rdp": read.rdp, "pure_epsilon": read.pure_epsilon, "created_at": now,
                    }
                    for read in new
                ],
            )  # fmt: skip
            if total_row is None:
                total_row = ReadTotal(account_id=reader_account_id)
                session.add(total_row)
            total_row.rdp = composed.to_json()
            total_row.pure_epsilon = composed.pure
            total_row.releases = count + len(new)
            total_row.updated_at = now
            session.flush()
            return ReadView(reader_account_id, after, delta, count + len(new), cap)

    def read_view(self, account_id: int, *, default_cap_epsilon: float | None = None) -> ReadView:
        """A service account's read figure (zero before its first answer)."""
        with self._reading() as session:
            account = self._account(session, account_id)
            delta = self._budget_row(session, account_id).delta
            cap = account.read_cap_epsilon
            cap = default_cap_epsilon if cap is None else cap
            row = session.get(ReadTotal, account_id)
            if row is None:
                return ReadView(account_id, 0.0, delta, 0, cap)
            return ReadView(
                account_id, RdpCurve.from_json(row.rdp).epsilon(delta), delta, row.releases, cap
            )
