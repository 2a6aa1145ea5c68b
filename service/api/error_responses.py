"""Every error leaves as ``{"error": {"code", "message", ...}}`` with a stable code; never a trace.

Framework errors are mapped too: a wrong type in a query parameter becomes
``invalid_parameter`` naming the parameter, an unknown route ``not_found``, a wrong method
``method_not_allowed``. Anything unexpected is logged with its request id and answered with
``internal_error`` and that id, so an operator can find it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.api.observability import REFUSALS, internal_error_response
from service.api.params import ACCOUNT_NODE_ID_PATTERN, NODE_ID_PATTERN
from service.bounds import PRINTABLE
from service.errors import ServiceError, bounded, echoed, shown

#: Retry-After of a 503 that names no wait of its own (the ledger database is unreachable).
LEDGER_RETRY_AFTER_SECONDS = 5
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")

#: Refusals of an admissible-looking query by the ledger, counted by reason.
REFUSAL_CODES = frozenset(
    {
        "budget_exhausted",
        "service_quota_exhausted",
        "graph_budget_exhausted",
        "mode_not_allowed",
        "read_cap_exhausted",
    }
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
    431: "headers_too_large",
}


#: What a value that misses one of the schema's patterns should look like, in words.
_PATTERNS = {
    NODE_ID_PATTERN: "a node id has no whitespace (spaces, tabs, line ends) or commas",
    ACCOUNT_NODE_ID_PATTERN: "a node id has no whitespace, commas or control characters",
    PRINTABLE: "must not contain control characters",
}


class DuplicateHeader(ServiceError):
    """A header that must be sent at most once was sent several times."""

    code = "duplicate_header"
    status = 400

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the {name} header was sent more than once; send it exactly once",
            details={"header": name},
        )


#: Where FastAPI says a request value came from (the first part of a validation error's loc).
_LOCATIONS = ("query", "path", "body", "header", "cookie")


def error_response(
    status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The error envelope; its texts bounded, however it was built (:func:`bounded`)."""
    return JSONResponse({"error": bounded(body)}, status_code=status, headers=headers)


async def handle_service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    request.state.outcome = exc.code
    if exc.code in REFUSAL_CODES:
        REFUSALS.labels(exc.code).inc()
    body = exc.to_dict()
    headers: dict[str, str] = {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    retry_after = exc.retry_after
    if retry_after is None and exc.status == 503:
        retry_after = LEDGER_RETRY_AFTER_SECONDS
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return error_response(exc.status, body, headers)


async def handle_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        request.state.outcome = "malformed_json"
        where = first.get("ctx", {}).get("error", "")
        return error_response(
            400,
            {"code": "malformed_json", "message": f"the body is not valid JSON: {where}".strip()},
        )
    where_from, *inside = first.get("loc", ("",)) or ("",)
    loc = (
        [echoed(str(part)) for part in inside]
        if where_from in _LOCATIONS
        else [echoed(str(where_from)), *(echoed(str(part)) for part in inside)]
    )
    name = ".".join(part for part in loc if part) or "request"
    if where_from == "header":  # as it is written in requests: Idempotency-Key
        name = "-".join(part.capitalize() for part in loc[-1].split("-")) if loc else "header"
    reason = str(first.get("msg", "is not valid")).removeprefix("Value error, ")
    if first.get("type") == "string_pattern_mismatch":
        reason = _PATTERNS.get(first.get("ctx", {}).get("pattern", ""), reason)
    given = first.get("input")
    message = f"{name}: {reason}" + (
        f", got {shown(given)}" if isinstance(given, str | int | float) else ""
    )
    request.state.outcome = "invalid_parameter"
    return error_response(
        422, {"code": "invalid_parameter", "message": message, "details": {"parameter": name}}
    )


async def handle_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    request.state.outcome = code
    message = str(exc.detail) if exc.detail else code.replace("_", " ")
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {shown(request.url.path)}; see /docs"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        message = f"{request.method} is not allowed here; use {', '.join(allowed)}"
    return error_response(exc.status_code, {"code": code, "message": message}, headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route accepts at the request's path (Starlette's own 405 lists only
    the first matching route's methods, e.g. GET but not POST on a path with two routes)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    return internal_error_response(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, handle_service_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected)
