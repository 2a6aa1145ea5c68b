"""A synthesis run as ONE graph-wide release in the ledger, and its edge-list file.

A run is a graph-wide release with a job row (:mod:`service.ledger.synthesis_jobs`): admitted
against the graph-wide cap and charged to the graph-wide exposure in one transaction BEFORE
anything is drawn, with its job recorded in the same transaction; while the generator runs, a
heartbeat keeps the release alive for the reconciler and records the job's progress; the
synthetic edge list is stored in the ledger as the release's payload (with its method,
parameters, privacy unit, epsilon and the file's SHA-256) before the file is written. An
interrupted or failed draw refunds the charge (nothing was released) and leaves no file; a run
whose process dies is failed and refunded by the reconciler once its heartbeat lapses.

The file is written atomically (:mod:`service.atomic_files`: a 0600 temporary file in the
target directory, fsynced and renamed into place).

Methods:

- ``privdpr``: node-level (eps, delta)-DP, charged its Gaussian RDP curve (its noise an exact
  discrete Gaussian);
- ``communities``: edge-level pure eps-DP, charged the sum of its Laplace curves (drawn by the
  exact rounded-Laplace sampler);
- ``chung_lu``: post-processing of the service's degree release (``PPR_POPULAR_EPSILON``):
  charged nothing itself; recorded with epsilon 0 and the name of the release it reuses (making
  that degree release, if it does not exist yet, is charged as the degree release).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from service.atomic_files import check_output_path, write_atomically
from service.errors import InvalidParameter, ServiceError
from service.graph.model import Graph
from service.ledger import GraphCap, Ledger
from service.ledger.graph_releases import Heartbeat
from service.ledger.synthesis_jobs import JobRecord
from service.privacy.accountant import RdpCurve
from service.privacy.synthetic import EDGE_LEVEL, NODE_LEVEL
from service.release_payload import encode_payload
from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.privdpr import PrivdprParams, privdpr_synthesize
from service.synthetic.sampling import chung_lu

METHODS = ("privdpr", "communities", "chung_lu")

Progress = Callable[[int, int], None]

#: How the temporary file beside ``--out`` is named while it is written.
_TEMPORARY = ".synthetic-"


@dataclass(frozen=True)
class SyntheticRelease:
    method: str
    release_name: str
    privacy_unit: str
    epsilon: float
    delta: float
    parameters: dict[str, Any]
    nodes: int
    edges: int
    sha256: str
    note: str

    def header(self) -> dict[str, Any]:
        return asdict(self)


def edge_list_text(graph: Graph, u: np.ndarray, v: np.ndarray) -> bytes:
    """``u v`` lines of external ids (isolated nodes cannot appear in an edge list)."""
    left = graph.external_ids(u)
    right = graph.external_ids(v)
    return "".join(f"{a} {b}\n" for a, b in zip(left, right, strict=True)).encode()


@dataclass(frozen=True)
class Request:
    method: str
    epsilon: float
    privdpr: PrivdprParams = field(default_factory=PrivdprParams)
    communities: CommunityParams = field(default_factory=CommunityParams)


def synthesis_request(
    method: str,
    epsilon: float | None,
    *,
    popular_epsilon: float,
    delta: float,
    epochs: int,
    score_rounds: int,
    groups: int,
    rounds: int,
    flags: bool = False,
) -> Request:
    """A run's request, from ``POST /v1/admin/synthetic``'s body or ``synthesize``'s flags
    (``flags``: the errors name the flags). ``chung_lu`` takes no epsilon of its own: it reuses
    the degree release, at ``popular_epsilon`` (PPR_POPULAR_EPSILON); the other methods need
    one. InvalidParameter otherwise, before anything is charged."""
    if method == "chung_lu":
        if epsilon is not None:
            raise InvalidParameter(
                "epsilon",
                "chung_lu reuses the degree release (PPR_POPULAR_EPSILON): "
                + ("no --epsilon" if flags else "no epsilon"),
            )
        epsilon = popular_epsilon
    elif epsilon is None:
        raise InvalidParameter(
            "epsilon",
            f"--method {method} needs --epsilon" if flags else f"method {method} needs an epsilon",
        )
    return Request(
        method=method,
        epsilon=epsilon,
        privdpr=replace(PrivdprParams(), delta=delta, epochs=epochs, score_rounds=score_rounds),
        communities=replace(CommunityParams(), groups=groups, rounds=rounds),
    )


def _validate(request: Request, graph: Graph) -> tuple[RdpCurve, float, float, str, dict[str, Any]]:
    """(curve, epsilon charged, delta, privacy unit, parameters), or InvalidParameter."""
    if request.method not in METHODS:
        raise InvalidParameter("method", f"unknown method {request.method!r}: one of {METHODS}")
    if not (np.isfinite(request.epsilon) and request.epsilon > 0):
        raise InvalidParameter("epsilon", f"epsilon must be positive, got {request.epsilon}")
    if graph.n < 2 or graph.m < 1:
        raise InvalidParameter("graph", "the graph needs at least two nodes and one edge")
    if request.method == "privdpr":
        plan = request.privdpr.plan(graph.n, request.epsilon)
        params = {**asdict(request.privdpr), "depth": plan.depth, "steps": plan.steps,
                  "noise_multiplier": plan.multiplier}  # fmt: skip
        return plan.curve, request.epsilon, request.privdpr.delta, NODE_LEVEL, params
    if request.method == "communities":
        cplan = request.communities.plan(request.epsilon)
        return cplan.curve, cplan.epsilon, 0.0, EDGE_LEVEL, asdict(request.communities)
    return RdpCurve.zero(), 0.0, 0.0, EDGE_LEVEL, {}


class JobAbandoned(ServiceError):
    """The run's release was settled under it (its heartbeat lapsed and the reconciler refunded
    it, or the job was failed): what it drew must not be released."""

    code = "synthesis_abandoned"
    status = 503


@dataclass(frozen=True)
class Plan:
    """A validated request: its curve, epsilon charged, delta, privacy unit and parameters."""

    curve: RdpCurve
    epsilon: float
    delta: float
    privacy_unit: str
    parameters: dict[str, Any]


def plan_request(request: Request, graph: Graph) -> Plan:
    """Validate ``request`` on ``graph`` (InvalidParameter, nothing charged)."""
    return Plan(*_validate(request, graph))


def start_job(
    ledger: Ledger,
    graph: Graph,
    request: Request,
    plan: Plan,
    *,
    cap: GraphCap | None,
    source: str,
    actor_account_id: int | None = None,
) -> JobRecord:
    """Admit the run against the graph-wide cap and record its job (GraphBudgetExhausted:
    nothing written)."""
    return ledger.synthesis.start_synthesis(
        graph.version,
        request.method,
        epsilon=plan.epsilon,
        delta=plan.delta,
        curve=plan.curve,
        privacy_unit=plan.privacy_unit,
        parameters=plan.parameters,
        cap=cap,
        source=source,
        actor_account_id=actor_account_id,
    )


def run_job(
    ledger: Ledger,
    job: JobRecord,
    graph: Graph,
    request: Request,
    plan: Plan,
    *,
    degrees: Callable[[], tuple[np.ndarray, str]] | None = None,
    progress: Progress | None = None,
    rng_factory: Callable[[], np.random.Generator],
    heartbeat_seconds: float = 5.0,
    noise_factory: Callable[[], np.random.Generator] | None = None,
) -> tuple[SyntheticRelease, bytes]:
    """Draw a started job while beating its heartbeat (with its progress), then store its
    payload and mark it done. Any failure (an interrupt included) refunds it and marks it
    failed; a run whose release was settled under it stops with :class:`JobAbandoned`.

    The generator's releases draw from ``noise_factory()`` (default ``rng_factory``), through
    the exact samplers only; its public choices and post-processing from ``rng_factory()``."""
    params = dict(plan.parameters)
    fraction: list[float] = [0.0]

    def beat() -> bool:
        return ledger.synthesis.beat_synthesis(job.job_id, fraction[0])

    try:
        with Heartbeat(beat, heartbeat_seconds) as heart:

            def step(done: int, total: int) -> None:
                if not heart.alive:
                    raise JobAbandoned(
                        f"synthesis job {job.job_id} was settled while it ran: nothing released"
                    )
                fraction[0] = done / total if total > 0 else 0.0
                if progress is not None:
                    progress(done, total)

            rng = rng_factory()
            noise = rng_factory if noise_factory is None else noise_factory
            note = ""
            if request.method == "privdpr":
                u, v, _ = privdpr_synthesize(
                    graph.indptr, graph.indices, request.epsilon, request.privdpr, rng, step,
                    noise=noise(),
                )  # fmt: skip
            elif request.method == "communities":
                u, v, _, summary = community_synthesize(
                    graph.indptr, graph.indices, request.epsilon, request.communities, rng,
                    noise=noise(),
                )  # fmt: skip
                params.update(summary)
            else:
                if degrees is None:
                    raise InvalidParameter("method", "chung_lu needs the service's degree release")
                released, source = degrees()
                weights = np.maximum(released, 0.0)
                u, v = chung_lu(weights, round(float(weights.sum()) / 2.0), rng)
                params["post_processing_of"] = source
                note = f"post-processing of the degree release {source}: no charge of its own"
            if not heart.alive:
                raise JobAbandoned(
                    f"synthesis job {job.job_id} was settled while it ran: nothing released"
                )
        text = edge_list_text(graph, u, v)
        release = SyntheticRelease(
            method=request.method,
            release_name=job.release_name,
            privacy_unit=plan.privacy_unit,
            epsilon=plan.epsilon,
            delta=plan.delta,
            parameters=params,
            nodes=graph.n,
            edges=int(u.size),
            sha256=hashlib.sha256(text).hexdigest(),
            note=note,
        )
        ledger.synthesis.finish_synthesis(
            job.job_id,
            encode_payload(release.header(), text),
            nodes=release.nodes,
            edges=release.edges,
            sha256=release.sha256,
            parameters=params,
            note=note,
        )
    except BaseException as exc:
        code = getattr(exc, "code", None) or (
            "interrupted" if isinstance(exc, KeyboardInterrupt) else "internal_error"
        )
        # our errors' messages are written for people; anything else is named by its type only
        # (its message could quote data)
        message = exc.message if isinstance(exc, ServiceError) else type(exc).__name__
        ledger.synthesis.fail_synthesis(job.job_id, str(code), message)
        raise
    return release, text


def synthesize_release(
    ledger: Ledger,
    graph: Graph,
    request: Request,
    out: Path,
    *,
    cap: GraphCap | None,
    degrees: Callable[[], tuple[np.ndarray, str]] | None = None,
    progress: Progress | None = None,
    rng_factory: Callable[[], np.random.Generator],
    heartbeat_seconds: float = 5.0,
    noise_factory: Callable[[], np.random.Generator] | None = None,
) -> SyntheticRelease:
    """Admit, charge, draw, store, then write ``out`` (the command line's run). ``degrees``
    returns the service's degree release and its ledger name (``chung_lu`` only);
    ``noise_factory`` as :func:`run_job`."""
    plan = plan_request(request, graph)
    check_output_path(out, prefix=_TEMPORARY)
    if request.method == "chung_lu" and degrees is None:
        raise InvalidParameter("method", "chung_lu needs the service's degree release")
    job = start_job(ledger, graph, request, plan, cap=cap, source="cli")
    release, text = run_job(
        ledger, job, graph, request, plan, degrees=degrees, progress=progress,
        rng_factory=rng_factory, heartbeat_seconds=heartbeat_seconds,
        noise_factory=noise_factory,
    )  # fmt: skip
    write_atomically(out, text, prefix=_TEMPORARY)
    return release
