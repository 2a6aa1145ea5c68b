"""Synthesis runs as jobs: each is one graph-wide release plus a ``synthesis_jobs`` row.

Starting a run admits its release against the graph-wide cap and inserts the job in ONE
transaction (refused past the cap: nothing written). The running process beats (the release's
and the job's heartbeat, with the job's progress); finishing stores the payload and marks the
job ``done`` in one transaction, failing refunds the release and marks it ``failed``. A job
whose process stopped beating is failed, and its release refunded, by :meth:`reconcile` (which
the ledger's reconciler calls): the database, not a process, decides.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.errors import ServiceError, shown
from service.ledger.graph_releases import GraphReleases
from service.ledger.records import ChargeSettled, GraphCap
from service.ledger.tables import GraphRelease, SynthesisJob, iso, utcnow
from service.ledger.transactions import LedgerPart, LedgerTransactions
from service.privacy.accountant import RdpCurve

#: Prefix of the ledger's mechanism name of every synthetic release.
RELEASE_PREFIX = "synthetic:"
#: The error code of a job whose process stopped beating.
WORKER_LOST = "worker_lost"


class UnknownSynthesisJob(ServiceError):
    code = "unknown_synthesis_job"
    status = 404


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    release_id: int
    release_name: str
    graph_version: str
    method: str
    privacy_unit: str
    epsilon: float
    delta: float
    parameters: dict[str, Any]
    source: str
    state: str
    progress: float
    release_state: str
    actor_account_id: int | None
    nodes: int | None
    edges: int | None
    sha256: str | None
    note: str | None
    error_code: str | None
    error_message: str | None
    created_at: str | None
    heartbeat_at: str | None
    finished_at: str | None


def _record(job: SynthesisJob, release: GraphRelease) -> JobRecord:
    return JobRecord(
        job_id=job.id,
        release_id=job.release_id,
        release_name=release.mechanism,
        graph_version=job.graph_version,
        method=job.method,
        privacy_unit=job.privacy_unit,
        epsilon=job.epsilon,
        delta=job.delta,
        parameters=dict(job.parameters),
        source=job.source,
        state=job.state,
        progress=job.progress,
        release_state=release.state,
        actor_account_id=job.actor_account_id,
        nodes=job.nodes,
        edges=job.edges,
        sha256=job.sha256,
        note=job.note,
        error_code=job.error_code,
        error_message=job.error_message,
        created_at=iso(job.created_at),
        heartbeat_at=iso(job.heartbeat_at),
        finished_at=iso(job.finished_at),
    )


class SynthesisJobs(LedgerPart):
    def __init__(self, transactions: LedgerTransactions, releases: GraphReleases) -> None:
        super().__init__(transactions)
        self._releases = releases

    def start_synthesis(
        self,
        graph_version: str,
        method: str,
        *,
        epsilon: float,
        delta: float,
        curve: RdpCurve,
        privacy_unit: str,
        parameters: dict[str, Any],
        cap: GraphCap | None,
        source: str,
        actor_account_id: int | None = None,
    ) -> JobRecord:
        """Admit the run's release (charged before anything is drawn) and record its job."""
        job_id = uuid.uuid4().hex
        name = f"{RELEASE_PREFIX}{method}:{job_id}"
        with self._writing() as session:
            release = self._releases.admit_in(
                session, graph_version, name, epsilon, curve, cap, actor=actor_account_id
            )
            job = SynthesisJob(
                id=job_id, release_id=release.id, graph_version=graph_version, method=method,
                privacy_unit=privacy_unit, epsilon=float(epsilon), delta=float(delta),
                parameters=parameters, source=source, state="running", progress=0.0,
                actor_account_id=actor_account_id, created_at=release.created_at,
                heartbeat_at=release.created_at,
            )  # fmt: skip
            session.add(job)
            session.flush()
            return _record(job, release)

    def beat_synthesis(self, job_id: str, progress: float | None) -> bool:
        """Refresh the job's and its release's heartbeat (and progress); False once the job is
        no longer running or its release no longer admitted (its draw must then be dropped)."""
        now = utcnow()
        values: dict[str, Any] = {"heartbeat_at": now}
        if progress is not None:
            values["progress"] = min(max(float(progress), 0.0), 1.0)
        with self._writing() as session:
            job = session.execute(
                update(SynthesisJob)
                .where(SynthesisJob.id == job_id, SynthesisJob.state == "running")
                .values(**values)
                .returning(SynthesisJob.release_id)
            ).scalar_one_or_none()
            if job is None:
                return False
            release = session.execute(
                update(GraphRelease)
                .where(GraphRelease.id == job, GraphRelease.state == "admitted")
                .values(heartbeat_at=now)
                .returning(GraphRelease.id)
            ).scalar_one_or_none()
            return release is not None

    def finish_synthesis(
        self,
        job_id: str,
        payload: bytes,
        *,
        nodes: int,
        edges: int,
        sha256: str,
        parameters: dict[str, Any],
        note: str,
    ) -> JobRecord:
        """Store the run's payload and mark it done (one transaction). ChargeSettled if the
        release was refunded meanwhile (e.g. reconciled): then nothing may be released."""
        with self._writing() as session:
            job = self._job_for_update(session, job_id)
            if job.state != "running":
                raise ChargeSettled(
                    f"synthesis job {job_id} is {job.state}", details={"job_id": job_id}
                )
            self._releases.settle_in(session, job.release_id, payload)
            now = utcnow()
            job.state, job.progress, job.finished_at, job.heartbeat_at = "done", 1.0, now, now
            job.nodes, job.edges, job.sha256, job.note = nodes, edges, sha256, note or None
            job.parameters = parameters
            release = session.get(GraphRelease, job.release_id)
            assert release is not None
            return _record(job, release)

    def fail_synthesis(self, job_id: str, code: str, message: str) -> bool:
        """Refund the run's release and mark the job failed; False if it was already settled."""
        with self._writing() as session:
            job = self._job_for_update(session, job_id)
            if job.state != "running":
                return False
            with contextlib.suppress(ChargeSettled):  # refunded already: the job follows it
                self._releases.settle_in(session, job.release_id, None)
            job.state, job.finished_at = "failed", utcnow()
            job.error_code, job.error_message = code, message[:2000]
            return True

    def reconcile_synthesis(self, cutoff: Any) -> list[str]:
        """Fail every running job that has not beaten since ``cutoff`` (its process died) and
        refund its release; returns their ids."""
        with self._reading() as session:
            ids = list(
                session.scalars(
                    select(SynthesisJob.id).where(
                        SynthesisJob.state == "running", SynthesisJob.heartbeat_at < cutoff
                    )
                )
            )
        failed: list[str] = []
        for job_id in ids:
            with self._writing() as session:
                job = self._job_for_update(session, job_id)
                if job.state != "running" or _after(job.heartbeat_at, cutoff):
                    continue
                with contextlib.suppress(ChargeSettled):
                    self._releases.settle_in(session, job.release_id, None)
                job.state, job.finished_at = "failed", utcnow()
                job.error_code = WORKER_LOST
                job.error_message = (
                    "the process running this job stopped before it finished; "
                    "its charge was refunded"
                )
                failed.append(job_id)
        return failed

    def synthesis_job(self, job_id: str) -> JobRecord:
        with self._reading() as session:
            row = session.execute(
                select(SynthesisJob, GraphRelease)
                .join(GraphRelease, GraphRelease.id == SynthesisJob.release_id)
                .where(SynthesisJob.id == job_id)
            ).one_or_none()
            if row is None:
                raise _unknown(job_id)
            return _record(row[0], row[1])

    def synthesis_jobs(self, *, limit: int = 100, offset: int = 0) -> tuple[list[JobRecord], int]:
        """The newest runs first, and how many there are."""
        with self._reading() as session:
            total = session.scalar(select(func.count()).select_from(SynthesisJob)) or 0
            rows = session.execute(
                select(SynthesisJob, GraphRelease)
                .join(GraphRelease, GraphRelease.id == SynthesisJob.release_id)
                .order_by(SynthesisJob.created_at.desc(), SynthesisJob.id)
                .limit(limit)
                .offset(offset)
            ).all()
            return [_record(job, release) for job, release in rows], int(total)

    def any_synthetic_release(self) -> bool:
        """Whether any synthesis run finished (a cheap test before hashing a graph file)."""
        with self._reading() as session:
            found = session.scalar(
                select(SynthesisJob.id).where(SynthesisJob.state == "done").limit(1)
            )
            return found is not None

    def synthetic_release_by_sha256(self, sha256: str) -> JobRecord | None:
        """The finished run whose edge list has this SHA-256 (the oldest, if several)."""
        with self._reading() as session:
            row = session.execute(
                select(SynthesisJob, GraphRelease)
                .join(GraphRelease, GraphRelease.id == SynthesisJob.release_id)
                .where(
                    SynthesisJob.sha256 == sha256,
                    SynthesisJob.state == "done",
                    GraphRelease.state == "released",
                )
                .order_by(SynthesisJob.created_at, SynthesisJob.id)
                .limit(1)
            ).one_or_none()
            return None if row is None else _record(row[0], row[1])

    def synthesis_payload(self, job_id: str) -> bytes | None:
        """The stored payload of a done job (None while it runs or after it failed)."""
        with self._reading() as session:
            row = session.execute(
                select(SynthesisJob.state, GraphRelease.payload)
                .join(GraphRelease, GraphRelease.id == SynthesisJob.release_id)
                .where(SynthesisJob.id == job_id)
            ).one_or_none()
            if row is None:
                raise _unknown(job_id)
            state, payload = row
            return bytes(payload) if state == "done" and payload is not None else None

    @staticmethod
    def _job_for_update(session: Session, job_id: str) -> SynthesisJob:
        job = session.get(SynthesisJob, job_id, with_for_update=True, populate_existing=True)
        if job is None:
            raise _unknown(job_id)
        return job


def _unknown(job_id: str) -> UnknownSynthesisJob:
    return UnknownSynthesisJob(
        f"no synthesis job {shown(job_id)}: list them at GET /v1/admin/synthetic",
        details={"job_id": job_id},
    )


def _after(moment: datetime, cutoff: datetime) -> bool:
    from service.ledger.graph_releases import naive_utc_of

    return naive_utc_of(moment) >= naive_utc_of(cutoff)
