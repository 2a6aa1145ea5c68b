"""Request and response bodies of the synthesis job API (``/v1/admin/synthetic``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.ledger.synthesis_jobs import JobRecord
from service.synthetic.communities import CommunityParams
from service.synthetic.privdpr import PrivdprParams

_PRIVDPR = PrivdprParams()
_COMMUNITIES = CommunityParams()


class StartSynthesis(BaseModel):
    """What ``POST /v1/admin/synthetic`` takes: the command line's options."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["communities", "privdpr", "chung_lu"] = Field(
        "communities",
        description="communities (edge-level DP), privdpr (node-level DP), chung_lu (free: "
        "post-processing of the service's degree release)",
    )
    # epsilon and delta are checked by the run's plan (422 invalid_parameter naming them), not
    # in the schema: the same names carry other limits on the query endpoints (docs/api.md)
    epsilon: float | None = Field(
        None, description="The run's epsilon, > 0 (required; not for chung_lu)."
    )
    delta: float = Field(_PRIVDPR.delta, description="privdpr's delta, in (0, 1).")
    epochs: int = Field(_PRIVDPR.epochs, ge=1, le=100, description="privdpr's epochs.")
    score_rounds: int = Field(
        _PRIVDPR.score_rounds, ge=1, le=10_000, description="privdpr's score samplings."
    )
    groups: int = Field(_COMMUNITIES.groups, ge=2, le=256, description="communities' groups.")
    rounds: int = Field(
        _COMMUNITIES.rounds, ge=1, le=64, description="communities' group-count rounds."
    )


class SynthesisError(BaseModel):
    code: str
    message: str


class SynthesisJob(BaseModel):
    """A synthesis run (started here or by the ``synthesize`` command) and its release."""

    job_id: str
    state: Literal["running", "done", "failed"]
    progress: float = Field(description="Fraction done, 0 to 1 (privdpr reports steps).")
    method: str
    privacy_unit: Literal["edge", "node"] = Field(
        description="edge: edge-level DP (communities, chung_lu); node: node-level (privdpr)"
    )
    epsilon: float = Field(description="What the run charged the graph-wide exposure (0: free).")
    delta: float
    charge_state: Literal["admitted", "released", "refunded"] = Field(
        description="admitted while it runs; released when stored; refunded if it failed"
    )
    parameters: dict[str, Any]
    source: Literal["cli", "api"]
    release_name: str
    graph_version: str
    nodes: int | None
    edges: int | None
    sha256: str | None = Field(description="SHA-256 of the edge list file (when done).")
    note: str | None
    error: SynthesisError | None
    created_at: str | None
    heartbeat_at: str | None
    finished_at: str | None
    file_url: str | None = Field(description="Where to download the edge list (when done).")

    @classmethod
    def of(cls, job: JobRecord) -> SynthesisJob:
        return cls(
            job_id=job.job_id,
            state=job.state,
            progress=job.progress,
            method=job.method,
            privacy_unit=job.privacy_unit,
            epsilon=job.epsilon,
            delta=job.delta,
            charge_state=job.release_state,
            parameters=job.parameters,
            source=job.source,
            release_name=job.release_name,
            graph_version=job.graph_version,
            nodes=job.nodes,
            edges=job.edges,
            sha256=job.sha256,
            note=job.note,
            error=SynthesisError(code=job.error_code, message=job.error_message or "")
            if job.error_code
            else None,
            created_at=job.created_at,
            heartbeat_at=job.heartbeat_at,
            finished_at=job.finished_at,
            file_url=f"/v1/admin/synthetic/{job.job_id}/file" if job.state == "done" else None,
        )


class SynthesisJobs(BaseModel):
    jobs: list[SynthesisJob]
    total: int
