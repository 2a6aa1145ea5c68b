"""Synthesis as an admin job: start a run, follow it, download its edge list.

``POST /v1/admin/synthetic`` validates the run like ``synthesize`` does (422
``invalid_parameter``, nothing charged), refuses it when this worker's job slots are full (429
``synthesis_busy``) or the graph-wide cap does not allow it (403 ``graph_budget_exhausted``),
and otherwise admits and charges it and returns 202 with the job; the run proceeds in a thread
of this worker. Its state is in the ledger: any worker answers ``GET .../{job}`` and serves
``GET .../{job}/file`` (the stored release's bytes).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response, status

from service.api.deps import AdminDep, RuntimeDep
from service.api.models import ErrorResponse
from service.api.params import Limit, Offset
from service.api.strict import StrictRoute
from service.api.synthetic_models import StartSynthesis, SynthesisJob, SynthesisJobs
from service.errors import Conflict
from service.release_payload import decode_payload
from service.synthetic.release import synthesis_request

router = APIRouter(prefix="/v1/admin/synthetic", tags=["admin"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse},
    403: {"model": ErrorResponse, "description": "`forbidden`, `graph_budget_exhausted`"},
    404: {"model": ErrorResponse, "description": "`unknown_synthesis_job`"},
    409: {"model": ErrorResponse, "description": "`synthesis_not_done`"},
    422: {"model": ErrorResponse},
    429: {"model": ErrorResponse, "description": "`synthesis_busy`"},
}

JobIdPath = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="The job's id.")]


class SynthesisNotDone(Conflict):
    code = "synthesis_not_done"


@router.post(
    "",
    operation_id="startSynthesis",
    response_model=SynthesisJob,
    status_code=status.HTTP_202_ACCEPTED,
    responses=_ERRORS,
)
def start_synthesis(body: StartSynthesis, runtime: RuntimeDep, admin: AdminDep) -> SynthesisJob:
    """Start a synthesis run of the served graph: one graph-wide release, charged now (before
    anything is drawn) and refunded if the run fails (docs/synthetic.md)."""
    if runtime.sandbox is not None:
        raise Conflict(
            "this service is a sandbox serving a synthetic release: synthesize on the service "
            "that serves the real graph"
        )
    request = synthesis_request(
        body.method, body.epsilon, popular_epsilon=runtime.settings.popular_epsilon,
        delta=body.delta, epochs=body.epochs, score_rounds=body.score_rounds,
        groups=body.groups, rounds=body.rounds,
    )  # fmt: skip
    job = runtime.synthesis.start(
        runtime.graphs.current, request, actor_account_id=admin.account_id
    )
    return SynthesisJob.of(job)


@router.get("", operation_id="listSynthesisJobs", response_model=SynthesisJobs, responses=_ERRORS)
def list_synthesis(
    runtime: RuntimeDep, admin: AdminDep, limit: Limit = 100, offset: Offset = 0
) -> SynthesisJobs:
    """Every synthesis run (command line and API), newest first."""
    jobs, total = runtime.ledger.synthesis.synthesis_jobs(limit=limit, offset=offset)
    return SynthesisJobs(jobs=[SynthesisJob.of(j) for j in jobs], total=total)


@router.get(
    "/{job_id}", operation_id="getSynthesisJob", response_model=SynthesisJob, responses=_ERRORS
)
def get_synthesis(job_id: JobIdPath, runtime: RuntimeDep, admin: AdminDep) -> SynthesisJob:
    """A run's state, progress, charge and error."""
    return SynthesisJob.of(runtime.ledger.synthesis.synthesis_job(job_id))


@router.get(
    "/{job_id}/file",
    operation_id="getSynthesisFile",
    response_class=Response,
    responses={**_ERRORS, 200: {"content": {"text/plain": {}}, "description": "the edge list"}},
)
def synthesis_file(job_id: JobIdPath, runtime: RuntimeDep, admin: AdminDep) -> Response:
    """The run's edge list (``u v`` lines), as the command line writes it."""
    payload = runtime.ledger.synthesis.synthesis_payload(job_id)
    if payload is None:
        job = runtime.ledger.synthesis.synthesis_job(job_id)
        raise SynthesisNotDone(
            f"synthesis job {job_id} is {job.state}: its file exists once it is done",
            details={"job_id": job_id, "state": job.state},
        )
    header, text = decode_payload(payload)
    name = re.sub(r"[^a-z_]", "", str(header.get("method", "synthetic")))
    return Response(
        content=text,
        media_type="text/plain; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="synthetic-{name}-{job_id[:12]}.txt"',
            "X-Content-SHA256": str(header.get("sha256", "")),
        },
    )
