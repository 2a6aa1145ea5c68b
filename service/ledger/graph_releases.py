"""Graph-wide releases: one release per graph version and mechanism, drawn once, shared by all."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.ledger.exposure_shards import ExposureShards
from service.ledger.ledger_rows import remove_from_shard
from service.ledger.locked_rows import AdmissionWrites
from service.ledger.records import (
    ChargeSettled,
    GraphCap,
)
from service.ledger.tables import (
    GraphRelease,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)
from service.privacy.accountant import RdpCurve

log = logging.getLogger(__name__)


class GraphReleases(LedgerPart):
    """The single release of a mechanism about a graph version (e.g. noisy degrees)."""

    def __init__(self, transactions: LedgerTransactions, shards: ExposureShards) -> None:
        super().__init__(transactions)
        self._shards = shards

    def graph_release(
        self,
        graph_version: str,
        mechanism: str,
        *,
        epsilon: float,
        curve: RdpCurve,
        draw: Callable[[], bytes],
        wait_seconds: float = 30.0,
        cap: GraphCap | None = None,
        heartbeat_seconds: float = 5.0,
    ) -> bytes:
        """The single release of ``mechanism`` about graph ``graph_version`` (e.g. noisy degrees).

        The first caller, in any process, commits its charge to the graph-wide exposure, then
        calls ``draw()`` and stores the bytes; every other caller gets those same bytes. If the
        drawing process died before storing, the release is reconciled (refunded) after
        ``wait_seconds`` and the next caller draws anew. With a graph-wide ``cap``, a release
        that would pass it is refused (:class:`GraphBudgetExhausted`) and nothing is drawn.
        While ``draw()`` runs, a thread refreshes the release's heartbeat every
        ``heartbeat_seconds``, so a long draw is not taken for a dead one.
        """
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._reading() as session:
                row = self._live_graph_release(session, graph_version, mechanism)
                if row is not None and row.state == "released" and row.payload is not None:
                    return bytes(row.payload)
            if row is None:
                release_id = self._admit_graph_release(
                    graph_version, mechanism, epsilon, curve, cap
                )
                if release_id is not None:
                    beat = functools.partial(self.beat, release_id)
                    try:
                        with Heartbeat(beat, heartbeat_seconds):
                            payload = draw()
                    except BaseException:
                        self._settle_graph_release(release_id, None)  # nothing was drawn/kept
                        raise
                    self._settle_graph_release(release_id, payload)
                    return payload
                continue  # a twin won the insert: read its release
            if time.monotonic() > deadline:
                # only this release's twin: another (a long synthesis run) has its own heartbeat
                self.reconcile_graph_releases(
                    utcnow() - timedelta(seconds=wait_seconds), mechanism=mechanism
                )
                deadline = time.monotonic() + wait_seconds
            time.sleep(0.05)

    def graph_release_state(self, graph_version: str, mechanism: str) -> str | None:
        """The state of the live (not refunded) release of ``mechanism`` about
        ``graph_version`` (``admitted`` or ``released``), or None; its payload is not read."""
        with self._reading() as session:
            state: str | None = session.scalar(
                select(GraphRelease.state).where(
                    GraphRelease.graph_version == graph_version,
                    GraphRelease.mechanism == mechanism,
                    GraphRelease.state != "refunded",
                )
            )
            return state

    def graph_release_curve(self, graph_version: str, mechanism: str) -> RdpCurve | None:
        """The curve stored with the live release of ``mechanism`` about ``graph_version``
        (what it was charged, sampler share included), or None."""
        with self._reading() as session:
            rdp: dict[str, Any] | None = session.scalar(
                select(GraphRelease.rdp).where(
                    GraphRelease.graph_version == graph_version,
                    GraphRelease.mechanism == mechanism,
                    GraphRelease.state != "refunded",
                )
            )
        return None if rdp is None else RdpCurve.from_json(rdp)

    def graph_release_cost(
        self, graph_version: str, mechanism: str
    ) -> tuple[float, RdpCurve] | None:
        """The epsilon and curve stored with the live release of ``mechanism`` about
        ``graph_version`` (what an account receiving it is charged), or None."""
        with self._reading() as session:
            row = session.execute(
                select(GraphRelease.epsilon, GraphRelease.rdp).where(
                    GraphRelease.graph_version == graph_version,
                    GraphRelease.mechanism == mechanism,
                    GraphRelease.state != "refunded",
                )
            ).one_or_none()
        return None if row is None else (float(row.epsilon), RdpCurve.from_json(row.rdp))

    def _admit_graph_release(
        self, version: str, mechanism: str, epsilon: float, curve: RdpCurve, cap: GraphCap | None
    ) -> int | None:
        try:
            with self._writing() as session:
                return self.admit_in(session, version, mechanism, epsilon, curve, cap).id
        except IntegrityError:
            return None

    def admit_in(
        self,
        session: Session,
        version: str,
        mechanism: str,
        epsilon: float,
        curve: RdpCurve,
        cap: GraphCap | None,
        actor: int | None = None,
    ) -> GraphRelease:
        """Charge the graph-wide exposure and insert the ``admitted`` release row, in the
        caller's write transaction (GraphBudgetExhausted past the cap: nothing written)."""
        # a one-time release: the exact cap check (every shard locked) is cheap enough
        writes = AdmissionWrites()
        shard = self._shards.add_exposure(session, curve, cap, cap is not None, writes)
        writes.finish(session)
        now = utcnow()
        row = GraphRelease(
            graph_version=version,
            mechanism=mechanism,
            epsilon=float(epsilon),
            rdp=curve.to_json(),
            pure_epsilon=curve.pure,
            state="admitted",
            exposure_shard=shard,
            created_at=now,
            heartbeat_at=now,
        )
        session.add(row)
        self._audit(
            session, "graph_release.admit", actor=actor, target=None,
            details={"graph_version": version, "mechanism": mechanism, "epsilon": epsilon},
        )  # fmt: skip
        session.flush()
        return row

    def beat(self, release_id: int) -> bool:
        """Refresh an ``admitted`` release's heartbeat; False once it is settled (e.g. refunded
        by the reconciler: then its draw must not be released)."""
        with self._writing() as session:
            done = session.execute(
                update(GraphRelease)
                .where(GraphRelease.id == release_id, GraphRelease.state == "admitted")
                .values(heartbeat_at=utcnow())
            )
            return bool(getattr(done, "rowcount", 0))

    def _settle_graph_release(self, release_id: int, payload: bytes | None) -> None:
        with self._writing() as session:
            self.settle_in(session, release_id, payload)

    def settle_in(
        self, session: Session, release_id: int, payload: bytes | None, cutoff: Any = None
    ) -> bool:
        """Release (``payload``) or refund (None) an ``admitted`` release, in the caller's
        transaction; ChargeSettled if it is no longer admitted. With ``cutoff`` (the
        reconciler), refund only if its heartbeat is still older than that, else return False.
        """
        row = session.get(GraphRelease, release_id, with_for_update=True, populate_existing=True)
        assert row is not None
        if row.state != "admitted":
            raise ChargeSettled(
                f"graph release {release_id} is {row.state}", details={"id": release_id}
            )
        if cutoff is not None and naive_utc_of(_last_sign(row)) >= naive_utc_of(cutoff):
            return False  # it beat since it was selected: alive
        row.settled_at = utcnow()
        if payload is None:
            row.state = "refunded"
            remove_from_shard(
                self._lock_shard(session, row.exposure_shard), RdpCurve.from_json(row.rdp)
            )
        else:
            row.state = "released"
            row.payload = payload
        return True

    def reconcile_graph_releases(self, cutoff: Any, *, mechanism: str | None = None) -> list[int]:
        """Refund the ``admitted`` releases whose last heartbeat is older than ``cutoff`` (all,
        or those of one ``mechanism``); returns their ids."""
        last_sign = func.coalesce(GraphRelease.heartbeat_at, GraphRelease.created_at)
        query = select(GraphRelease.id).where(GraphRelease.state == "admitted", last_sign < cutoff)
        if mechanism is not None:
            query = query.where(GraphRelease.mechanism == mechanism)
        with self._reading() as session:
            ids = list(session.scalars(query))
        refunded: list[int] = []
        for release_id in ids:
            try:
                with self._writing() as session:
                    if self.settle_in(session, release_id, None, cutoff=cutoff):
                        refunded.append(release_id)
            except ChargeSettled:
                continue
        return refunded


def _last_sign(row: GraphRelease) -> datetime:
    return row.heartbeat_at if row.heartbeat_at is not None else row.created_at


def naive_utc_of(moment: datetime) -> datetime:
    """Comparable across backends: SQLite hands back naive UTC, PostgreSQL aware values."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


class Heartbeat:
    """While open, call ``beat`` every ``seconds`` from a daemon thread (``seconds`` <= 0: no
    thread). ``beat`` refreshes a release's heartbeat and returns False once the release is no
    longer admitted; ``alive`` then turns False for good (the draw must not be released)."""

    def __init__(self, beat: Callable[[], bool], seconds: float) -> None:
        self._beat = beat
        self._seconds = seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.alive = True

    def beat(self) -> None:
        try:
            alive = self._beat()
        except Exception:  # a database hiccup: the next beat retries
            log.warning("graph release heartbeat failed", exc_info=True)
            return
        self.alive = self.alive and alive

    def _loop(self) -> None:
        while not self._stop.wait(self._seconds):
            self.beat()

    def __enter__(self) -> Heartbeat:
        if self._seconds > 0:
            self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
