"""Liveness, readiness and metrics: what load balancers and Prometheus scrape, so no API key.
Without an admin key they say little: ``/readyz`` only its status; ``/metrics`` can require a
token of its own (``PPR_METRICS_TOKEN``)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.api.deps import RuntimeDep, is_admin_request
from service.api.error_responses import DuplicateHeader
from service.api.observability import metrics_response
from service.api.runtime import Runtime
from service.api.strict import StrictRoute
from service.errors import Unauthorized

router = APIRouter(tags=["operations"], route_class=StrictRoute)


@router.get("/healthz", operation_id="getHealthz")
def healthz() -> dict[str, str]:
    """The process is up and serving HTTP."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    operation_id="getReadyz",
    responses={503: {"description": "not ready: graph or database"}},
)
def readyz(request: Request) -> JSONResponse:
    """Ready: graph loaded and database reachable. A Redis outage shows as `degraded` but keeps
    the process ready: answers and charges never depend on the cache. Only the status is shown,
    unless the request carries an admin key: then the checks (graph version and source,
    database, cache state, the prefix table's state: off, absent, building or ready) too."""
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:  # the ledger database has not answered since this process started
        return JSONResponse({"status": "unavailable"}, status_code=503)
    ready, checks = runtime.readiness()
    cache_ok = checks["cache"].get("status") == "ok"
    body: dict[str, Any] = {
        "status": ("ok" if cache_ok else "degraded") if ready else "unavailable",
    }
    if is_admin_request(request, runtime):
        body["checks"] = checks
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    operation_id="getMetrics",
    response_class=Response,
    responses={401: {"description": "PPR_METRICS_TOKEN is set and the request lacks it"}},
)
def metrics(request: Request, runtime: RuntimeDep) -> Response:
    """Prometheus text format. With PPR_METRICS_TOKEN set, send
    `Authorization: Bearer <token>` (Prometheus: `authorization: {credentials: <token>}`)."""
    token = runtime.settings.metrics_token
    if token is not None:
        sent = request.headers.getlist("authorization")
        if len(sent) > 1:
            raise DuplicateHeader("Authorization")
        scheme, _, given = (sent[0] if sent else "").partition(" ")
        expected = token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise Unauthorized("send 'Authorization: Bearer <PPR_METRICS_TOKEN>'", reason="metrics")
    return metrics_response()
