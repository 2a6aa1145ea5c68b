"""What a service account has read: its read figure and the cap on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, Text, bindparam, insert, select, type_coerce, update
from sqlalchemy.orm import Session

from service.ledger.array_writes import insert_rows
from service.ledger.budget_rule import fits_under_cap
from service.ledger.id_lists import one_of
from service.ledger.json_text import EncodedJson, decode_curve_json
from service.ledger.records import (
    ReadCapExhausted,
    ReadView,
)
from service.ledger.tables import Account, Budget, Charge, ReadTotal, ServiceRead, utcnow
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
    the composition and its count, the delta and cap it is checked at, and whether its
    ``read_totals`` row exists (not before its first read)."""

    total: RdpCurve
    releases: int
    delta: float
    cap: float | None
    stored: bool


READ_TOTALS = cast(Table, ReadTotal.__table__)
SERVICE_READS = cast(Table, ServiceRead.__table__)
#: The reader's cap, delta and read total, one statement (an admission's hot path: one round
#: trip, no ORM objects).
_READER_FIGURE = (
    select(
        Account.read_cap_epsilon,
        Budget.delta,
        READ_TOTALS.c.account_id.label("total_of"),
        READ_TOTALS.c.rdp,
        READ_TOTALS.c.releases,
    )
    .join(Budget, Budget.account_id == Account.id)
    .outerjoin(READ_TOTALS, READ_TOTALS.c.account_id == Account.id)
    .where(Account.id == bindparam("reader"))
)
#: A reader's ``read_totals`` row as written: its first read inserts it, later ones update it
#: (parameters ``reader``, ``rdp``, ``pure_epsilon``, ``releases``, ``now``).
_READ_TOTAL_VALUES = {
    "rdp": bindparam("rdp", type_=READ_TOTALS.c.rdp.type),
    "pure_epsilon": bindparam("pure_epsilon"),
    "releases": bindparam("releases"),
    "updated_at": bindparam("now", type_=READ_TOTALS.c.updated_at.type),
}
_INSERT_READ_TOTAL = insert(READ_TOTALS).values(
    account_id=bindparam("reader"), **_READ_TOTAL_VALUES
)
_UPDATE_READ_TOTAL = (
    update(READ_TOTALS)
    .where(READ_TOTALS.c.account_id == bindparam("reader"))
    .values(**_READ_TOTAL_VALUES)
)


def reader_figure(session: Session, reader: int, default_cap_epsilon: float | None) -> ReaderFigure:
    """The reader's figure; its cap is its ``read_cap_epsilon``, else ``default_cap_epsilon``
    (None: no cap). An unknown account is :class:`UnknownAccount`."""
    found = session.execute(_READER_FIGURE, {"reader": reader}).first()
    if found is None:
        raise unknown_account(reader)
    cap = default_cap_epsilon if found.read_cap_epsilon is None else found.read_cap_epsilon
    stored = found.total_of is not None
    total = RdpCurve.from_json(found.rdp) if stored else RdpCurve.zero()
    return ReaderFigure(total, int(found.releases) if stored else 0, found.delta, cap, stored)


def write_reader_figure(session: Session, reader: int, figure: ReaderFigure, now: Any) -> None:
    """Write the reader's figure (``total``, ``releases``) to its ``read_totals`` row, made on
    its first read; under the reader's spend-row lock, so no two transactions make it."""
    params = {
        "reader": reader, "rdp": figure.total.to_json(), "pure_epsilon": figure.total.pure,
        "releases": figure.releases, "now": now,
    }  # fmt: skip
    session.execute(_UPDATE_READ_TOTAL if figure.stored else _INSERT_READ_TOTAL, params)
    figure.stored = True


_HAS_READ_GRAPH_RELEASE = select(ServiceRead.id).where(
    ServiceRead.reader_account_id == bindparam("reader"),
    ServiceRead.graph_release_id == bindparam("release"),
)


def has_read_graph_release(session: Session, reader: int, graph_release_id: int) -> bool:
    """Whether the reader's figure counts the graph-wide release already."""
    found = session.scalar(_HAS_READ_GRAPH_RELEASE, {"reader": reader, "release": graph_release_id})
    return found is not None


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
            delta, cap = figure.delta, figure.cap
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
                        curve = parsed[rdp] = RdpCurve.from_json(decode_curve_json(rdp))
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
            # one statement of one array per column on PostgreSQL (a multi-row INSERT of many
            # reads has too many parameters for psycopg's cache of parsed statements)
            insert_rows(
                session,
                SERVICE_READS,
                [
                    {
                        "reader_account_id": reader_account_id, "charge_id": read.charge_id,
                        "graph_release_id": read.graph_release_id, "epsilon": read.epsilon,
                        "rdp": read.rdp, "pure_epsilon": read.pure_epsilon, "created_at": now,
                    }
                    for read in new
                ],
            )  # fmt: skip
            figure.total, figure.releases = composed, count + len(new)
            write_reader_figure(session, reader_account_id, figure, now)
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
