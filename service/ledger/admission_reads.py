"""A service account's reads counted in the admission transaction that charges them.

A service account that receives a release has it counted in its read figure (the composition
of every distinct release it received, checked against its read cap: ``read_figures.py``).
For a release it is charged for now, that count is made here, in the admission's own
transaction and under the same lock (the reader's spend row): the read cap is one more check
of admission, made before the charge is added, so a query past it is refused with
``read_cap_exhausted`` writing nothing (no charge to refund, no noise drawn), and an admitted
one is counted before any noise is drawn, with no transaction of its own.

The release is a new charge's, so no reader can have counted it yet; the graph-wide release an
answer is built on (``blended``'s degree release) is counted the first time this reader gets
it, as :meth:`ReadFigures.record_reads` counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from service.ledger.array_writes import insert_rows
from service.ledger.budget_rule import fits_under_cap
from service.ledger.json_text import EncodedJson
from service.ledger.locked_rows import NewCharge
from service.ledger.read_figures import (
    SERVICE_READS,
    ReaderFigure,
    has_read_graph_release,
    reader_figure,
    write_reader_figure,
)
from service.ledger.records import ReadAsk, ReadCapExhausted, ReadView
from service.ledger.tables import GraphRelease, utcnow
from service.ledger.transactions import live_graph_release
from service.privacy.accountant import RdpCurve


@dataclass
class _Reader:
    """One reader's figure as this transaction sees it, and the reads it adds."""

    figure: ReaderFigure
    #: Graph releases (ids) the reader has, counted before or in this transaction.
    graph_releases: set[int] = field(default_factory=set)
    #: (the charge, or None for a graph release; the read's row values)
    added: list[tuple[NewCharge | None, dict[str, object]]] = field(default_factory=list)


@dataclass(frozen=True)
class PendingRead:
    """A read that fits under the cap, to be kept once its charge is added."""

    reader: int
    composed: RdpCurve
    rows: list[dict[str, object]]
    graph_release_id: int | None


class AdmissionReads:
    """The reads one admission transaction counts (:meth:`check`, then :meth:`keep` once
    the query's charge is added; :meth:`write` before the commit). The caller holds each
    reader's spend-row lock before its first :meth:`check`."""

    def __init__(self) -> None:
        self._readers: dict[int, _Reader] = {}
        #: The live graph-wide releases asked for, by (graph version, mechanism), read once
        #: per transaction (a group's readers ask for the one degree release, query after query).
        self._graph_releases: dict[tuple[str, str], GraphRelease | None] = {}

    def check(
        self,
        session: Session,
        reader: int,
        ask: ReadAsk,
        curve: RdpCurve,
        epsilon: float,
        rdp: EncodedJson,
    ) -> PendingRead:
        """The reader's figure with this release (and the graph-wide release the answer is
        built on, if the reader has not got it yet), or :class:`ReadCapExhausted` past its
        cap, changing nothing."""
        state = self._readers.get(reader)
        if state is None:
            state = self._readers[reader] = _Reader(
                reader_figure(session, reader, ask.default_cap_epsilon)
            )
        figure = state.figure
        now = utcnow()
        composed = figure.total + curve
        rows: list[dict[str, object]] = [
            {
                "reader_account_id": reader, "charge_id": None, "graph_release_id": None,
                "epsilon": float(epsilon), "rdp": rdp, "pure_epsilon": curve.pure,
                "created_at": now,
            }
        ]  # fmt: skip
        release_id = None
        if ask.graph_release is not None:
            release = self._live_graph_release(session, ask.graph_release)
            if release is not None and release.id not in state.graph_releases:
                if not has_read_graph_release(session, reader, release.id):
                    release_id = release.id
                    composed = composed + RdpCurve.from_json(release.rdp)
                    rows.append({
                        "reader_account_id": reader, "charge_id": None,
                        "graph_release_id": release.id, "epsilon": release.epsilon,
                        "rdp": release.rdp, "pure_epsilon": release.pure_epsilon,
                        "created_at": now,
                    })  # fmt: skip
                else:
                    state.graph_releases.add(release.id)
        if figure.cap is not None:  # no cap: no conversion to epsilon per query
            after = composed.epsilon(figure.delta)
            if not fits_under_cap(after, figure.cap):
                before = ReadView(
                    reader, figure.total.epsilon(figure.delta), figure.delta, figure.releases,
                    figure.cap,
                )  # fmt: skip
                raise ReadCapExhausted(before, after)
        return PendingRead(reader, composed, rows, release_id)

    def _live_graph_release(self, session: Session, asked: tuple[str, str]) -> GraphRelease | None:
        if asked not in self._graph_releases:
            self._graph_releases[asked] = live_graph_release(session, *asked)
        return self._graph_releases[asked]

    def keep(self, pending: PendingRead, charge: NewCharge) -> None:
        """Count ``pending`` (checked by :meth:`check`) for ``charge``, added since."""
        state = self._readers[pending.reader]
        state.figure.total = pending.composed
        state.figure.releases += len(pending.rows)
        state.added.append((charge, pending.rows[0]))
        for row in pending.rows[1:]:
            state.added.append((None, row))
        if pending.graph_release_id is not None:
            state.graph_releases.add(pending.graph_release_id)

    def write(self, session: Session) -> None:
        """Insert the reads and write each reader's figure (the charges are written already,
        so each read names its charge's id)."""
        rows: list[dict[str, object]] = []
        for reader, state in self._readers.items():
            if not state.added:
                continue
            for charge, row in state.added:
                if charge is not None:
                    assert charge.id, "a charge is written before the reads of it"
                    row = {**row, "charge_id": charge.id}
                rows.append(row)
            state.added = []
            write_reader_figure(session, reader, state.figure, utcnow())
        if rows:  # one statement on PostgreSQL, as ReadFigures.record_reads writes them
            insert_rows(session, SERVICE_READS, rows)
