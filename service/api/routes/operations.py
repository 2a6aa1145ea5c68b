"""Liveness, readiness and metrics (no authentication: they reveal nothing about the graph
beyond its version, and they are what load balancers and Prometheus scrape)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from service.api.deps import RuntimeDep
from service.api.observability import metrics_response

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up and serving HTTP."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready: graph or database"}})
def readyz(runtime: RuntimeDep) -> JSONResponse:
    """Ready: graph loaded and database reachable. A Redis outage shows as `degraded` but keeps
    the process ready: answers and charges never depend on the cache."""
    ready, checks = runtime.readiness()
    cache_ok = checks["cache"].get("status") == "ok"
    body: dict[str, Any] = {
        "status": ("ok" if cache_ok else "degraded") if ready else "unavailable",
        "checks": checks,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response)
def metrics() -> Response:
    """Prometheus text format."""
    return metrics_response()
