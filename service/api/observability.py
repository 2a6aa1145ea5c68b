"""Metrics (Prometheus) and one structured JSON log line per request.

Never logged or exported: noisy vectors, exact degrees, PPR values, API keys. A log line holds
the request id, route, status, latency, account id, epsilon charged and outcome.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from service.privacy.modes import Mode
    from service.serving.schemas import ChargedAnswer

REQUESTS = Counter(
    "ppr_http_requests_total", "HTTP requests by route, method and status",
    ["route", "method", "status"],
)  # fmt: skip
LATENCY = Histogram(
    "ppr_http_request_seconds", "HTTP request latency by route", ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)  # fmt: skip
EPSILON_CHARGED = Counter(
    "ppr_epsilon_charged_total",
    "Sum of per-query epsilons charged (not a composed spend)",
    ["mode"],
)
CHARGES = Counter("ppr_charges_total", "Queries admitted and charged", ["mode"])
REFUSALS = Counter("ppr_refusals_total", "Queries refused by admission", ["reason"])
REPLAYS = Counter("ppr_replays_total", "Queries answered from a stored release", ["source"])
REFUNDS = Counter("ppr_refunds_total", "Charges refunded because no noise was drawn")
CACHE_EVENTS = Counter("ppr_cache_events_total", "Cache lookups", ["cache", "result"])
CONNECTIONS_SHED = Counter(
    "ppr_http_connections_shed_total",
    "Connections at a worker's connection bound: 'shed' (an older one still waiting for its "
    "request head answered 503 and closed), 'refused' (a new one answered 503)",
    ["action"],
)

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

access_log = logging.getLogger("service.access")


def count_answer(
    request: Request, answer: ChargedAnswer, mode: Mode, idempotency_key: str | None
) -> None:
    """One answer's outcome and charge, in the request's log line and the metrics: a replay
    (of the release its Idempotency-Key is bound to, or of an identical query's), an answer
    that charged nothing now (``popular``: the graph version's degree release), or a charge."""
    request.state.epsilon_charged = answer.epsilon_charged
    if answer.replayed:
        request.state.outcome = "replayed"
        REPLAYS.labels("idempotency" if idempotency_key else "release").inc()
    elif answer.epsilon_charged == 0.0:
        request.state.outcome = "graph_release"  # popular: post-processing, nothing charged
    else:
        request.state.outcome = "charged"
        CHARGES.labels(mode.value).inc()
        EPSILON_CHARGED.labels(mode.value).inc(answer.epsilon_charged)


def metrics_response() -> Response:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        data = generate_latest(registry)
    else:
        data = generate_latest()
    return Response(data, media_type=CONTENT_TYPE_LATEST)


def internal_error_response(request: Request, exc: BaseException) -> Response:
    """500 ``internal_error`` for an unexpected failure: logged with its request id, which the
    body quotes; never a trace to the client."""
    request_id = getattr(request.state, "request_id", None)
    logging.getLogger("service.api").error(
        "unhandled error", exc_info=exc, extra={"request_id": request_id, "path": request.url.path}
    )
    request.state.outcome = "internal_error"
    body = {
        "error": {
            "code": "internal_error",
            "message": "the service failed unexpectedly and returned no answer. "
            f"Quote request id {request_id} to the operator",
        }
    }
    return JSONResponse(body, status_code=500)


def request_id_from(request: Request) -> str:
    """This request's id: always fresh (a random UUID's hex), so it is unique across requests
    and the ledger's ``charges.request_id`` cannot be made to collide with another request's.
    A well-formed client ``X-Request-ID`` (1-64 of ``A-Za-z0-9._:-``) is kept as its prefix,
    ``<client id>.<fresh hex>``, so the client can still find its own requests; anything else
    the client sends is ignored."""
    fresh = uuid.uuid4().hex
    given = request.headers.get("x-request-id", "")
    return f"{given}.{fresh}" if _SAFE_REQUEST_ID.match(given) else fresh


class RequestObservation:
    """The outermost ASGI middleware: the request id (``request.state.request_id`` and the
    ``X-Request-ID`` header), the metrics and the access log line of every HTTP request; an
    exception no handler answered becomes a 500 ``internal_error`` if no response has started.

    A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: the request runs in the
    caller's task, with no task, stream or queue of its own per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request_id = request_id_from(request)
        request.state.request_id = request_id
        start = time.perf_counter()
        status = 500
        started = observed = False

        def observe() -> None:
            nonlocal observed
            if not observed:
                observed = True
                _observe(request, status, time.perf_counter() - start)

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                observe()  # before the last of the body is sent: logged when it is received
            await send(message)

        try:
            try:
                await self.app(scope, receive, send_with_id)
            except Exception as exc:  # not a ServiceError: those are answered by their handler
                if started:
                    raise
                await internal_error_response(request, exc)(scope, receive, send_with_id)
        finally:
            observe()


def _observe(request: Request, status: int, elapsed: float) -> None:
    """A finished request's metrics and access log line."""
    route_obj = request.scope.get("route")
    route = getattr(route_obj, "path_format", getattr(route_obj, "path", "unmatched"))
    REQUESTS.labels(route, request.method, str(status)).inc()
    LATENCY.labels(route, request.method).observe(elapsed)
    access_log.info(
        "request",
        extra={
            "request_id": request.state.request_id,
            "method": request.method,
            "route": route,
            "status": status,
            "duration_ms": round(elapsed * 1000, 2),
            "account": getattr(request.state, "account_id", None),
            "epsilon_charged": getattr(request.state, "epsilon_charged", 0.0),
            "outcome": getattr(request.state, "outcome", "ok" if status < 400 else "error"),
        },
    )
