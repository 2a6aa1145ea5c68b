"""Synthesis jobs in a serving worker: ``POST /v1/admin/synthetic`` runs here, off the
request path.

Starting validates the request (InvalidParameter, nothing charged), takes one of this worker's
``PPR_SYNTHESIS_JOBS_PER_WORKER`` slots (429 ``synthesis_busy`` when none is free, nothing
charged), admits the run against the graph-wide cap and records its job in one transaction (403
``graph_budget_exhausted``: nothing written), then draws in a thread. The job's state lives in
the ledger, so any worker answers its status and serves its file; a worker that dies mid-job
stops beating, and the reconciler fails the job and refunds its release.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from service.config import Settings
from service.errors import ServiceError
from service.graph.model import Graph
from service.ledger import GraphCap, Ledger
from service.ledger.synthesis_jobs import JobRecord
from service.synthetic.release import Request, plan_request, run_job, start_job

log = logging.getLogger(__name__)


class SynthesisBusy(ServiceError):
    code = "synthesis_busy"
    status = 429

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this worker already runs {limit} synthesis job(s) (PPR_SYNTHESIS_JOBS_PER_WORKER); "
            "nothing was charged: retry when one has finished",
            details={"limit": limit, "retry_after_seconds": 30},
        )
        self.retry_after = 30


class SynthesisRunner:
    """Runs this worker's synthesis jobs, at most ``settings.synthesis_jobs_per_worker`` at
    once, each in its own daemon thread."""

    def __init__(
        self,
        ledger: Ledger,
        settings: Settings,
        degrees: Callable[[Graph, GraphCap | None], tuple[np.ndarray, str]],
        rng_factory: Callable[[], np.random.Generator],
    ) -> None:
        self._ledger = ledger
        self._settings = settings
        self._degrees = degrees
        self._rng_factory = rng_factory
        self._slots = threading.BoundedSemaphore(settings.synthesis_jobs_per_worker)
        self._lock = threading.Lock()
        self._running: dict[str, threading.Thread] = {}

    def _cap(self) -> GraphCap | None:
        if self._settings.graph_cap_epsilon is None:
            return None
        delta = self._settings.exposure_delta or self._ledger.reports.smallest_delta()
        return GraphCap(self._settings.graph_cap_epsilon, delta, max_charge=None)

    def start(self, graph: Graph, request: Request, *, actor_account_id: int | None) -> JobRecord:
        plan = plan_request(request, graph)  # InvalidParameter: nothing charged
        if not self._slots.acquire(blocking=False):
            raise SynthesisBusy(self._settings.synthesis_jobs_per_worker)
        try:
            cap = self._cap()
            job = start_job(
                self._ledger, graph, request, plan, cap=cap, source="api",
                actor_account_id=actor_account_id,
            )  # fmt: skip
        except BaseException:
            self._slots.release()
            raise

        def degrees() -> tuple[np.ndarray, str]:
            return self._degrees(graph, cap)

        def work() -> None:
            try:
                run_job(
                    self._ledger, job, graph, request, plan, degrees=degrees,
                    rng_factory=self._rng_factory,
                    heartbeat_seconds=self._settings.release_heartbeat_seconds,
                )  # fmt: skip
            except Exception as exc:  # recorded on the job (failed, refunded) by run_job
                log.warning(
                    "synthesis job failed",
                    extra={"job_id": job.job_id, "error": getattr(exc, "code", type(exc).__name__)},
                )
            finally:
                with self._lock:
                    self._running.pop(job.job_id, None)
                self._slots.release()

        thread = threading.Thread(target=work, name=f"synthesis-{job.job_id[:8]}", daemon=True)
        with self._lock:
            self._running[job.job_id] = thread
        thread.start()
        return job

    def close(self, wait_seconds: float = 5.0) -> None:
        """Fail (and refund) this worker's running jobs: a stopping worker releases nothing."""
        with self._lock:
            running: dict[str, Any] = dict(self._running)
        for job_id in running:
            try:
                self._ledger.synthesis.fail_synthesis(
                    job_id, "worker_stopped", "the worker stopped before the job finished"
                )
            except Exception:
                log.warning("could not fail a synthesis job at shutdown", exc_info=True)
        for thread in running.values():
            thread.join(timeout=wait_seconds)
