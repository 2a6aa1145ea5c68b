"""Graph-wide releases: one release per graph version and mechanism, drawn once, shared by all."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from service.ledger.exposure_shards import ExposureShards
from service.ledger.ledger_rows import _remove_from_shard
from service.ledger.locked_rows import AdmissionWrites
from service.ledger.records import (
    ChargeSettled,
    GraphCap,
)
from service.ledger.tables import (
    GraphRelease,
    utcnow,
)
from service.ledger.unit_of_work import (
    LedgerPart,
    UnitOfWork,
)
from service.privacy.accountant import RdpCurve


class GraphReleases(LedgerPart):
    """The single release of a mechanism about a graph version (e.g. noisy degrees)."""

    def __init__(self, uow: UnitOfWork, shards: ExposureShards) -> None:
        super().__init__(uow)
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
    ) -> bytes:
        """The single release of ``mechanism`` about graph ``graph_version`` (e.g. noisy degrees).

        The first caller, in any process, commits its charge to the graph-wide exposure, then
        calls ``draw()`` and stores the bytes; every other caller gets those same bytes. If the
        drawing process died before storing, the release is reconciled (refunded) after
        ``wait_seconds`` and the next caller draws anew. With a graph-wide ``cap``, a release
        that would pass it is refused (:class:`GraphBudgetExhausted`) and nothing is drawn.
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
                    try:
                        payload = draw()
                    except BaseException:
                        self._settle_graph_release(release_id, None)  # nothing was drawn/kept
                        raise
                    self._settle_graph_release(release_id, payload)
                    return payload
                continue  # a twin won the insert: read its release
            if time.monotonic() > deadline:
                self._reconcile_graph_releases(utcnow() - timedelta(seconds=wait_seconds))
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

    def _admit_graph_release(
        self, version: str, mechanism: str, epsilon: float, curve: RdpCurve, cap: GraphCap | None
    ) -> int | None:
        try:
            with self._writing() as session:
                # a one-time release: the exact cap check (every shard locked) is cheap enough
                writes = AdmissionWrites()
                shard = self._shards._add_exposure(session, curve, cap, cap is not None, writes)
                writes.finish(session)
                row = GraphRelease(
                    graph_version=version,
                    mechanism=mechanism,
                    epsilon=float(epsilon),
                    rdp=curve.to_json(),
                    pure_epsilon=curve.pure,
                    state="admitted",
                    exposure_shard=shard,
                    created_at=utcnow(),
                )
                session.add(row)
                self._audit(
                    session, "graph_release.admit", actor=None, target=None,
                    details={"graph_version": version, "mechanism": mechanism, "epsilon": epsilon},
                )  # fmt: skip
                session.flush()
                return row.id
        except IntegrityError:
            return None

    def _settle_graph_release(self, release_id: int, payload: bytes | None) -> None:
        with self._writing() as session:
            row = session.get(GraphRelease, release_id)
            assert row is not None
            if row.state != "admitted":
                raise ChargeSettled(
                    f"graph release {release_id} is {row.state}", details={"id": release_id}
                )
            row.settled_at = utcnow()
            if payload is None:
                row.state = "refunded"
                _remove_from_shard(
                    self._lock_shard(session, row.exposure_shard), RdpCurve.from_json(row.rdp)
                )
            else:
                row.state = "released"
                row.payload = payload

    def _reconcile_graph_releases(self, cutoff: Any) -> None:
        with self._reading() as session:
            ids = list(
                session.scalars(
                    select(GraphRelease.id).where(
                        GraphRelease.state == "admitted", GraphRelease.created_at < cutoff
                    )
                )
            )
        for release_id in ids:
            try:
                self._settle_graph_release(release_id, None)
            except ChargeSettled:
                continue
