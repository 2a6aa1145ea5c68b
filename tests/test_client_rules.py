"""The client's rules that need no server: every error code of the service has its typed
exception, requests carry only what the caller gave, answers from a newer server still read,
and the retry policy retries exactly what is safe to retry. (Everything that talks to the
service is in ``test_client.py``, against the real one.)"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

import service
from service.api.error_responses import _HTTP_CODES
from service.client import (
    ERROR_CLASSES,
    AccountExists,
    Conflict,
    InvalidResponse,
    PprAnswer,
    PprError,
    RateLimited,
    RetryPolicy,
    calls,
)
from service.client.calls import error_from_response
from service.client.errors import error_class
from service.client.retry import parse_retry_after
from service.errors import ServiceError


def _server_error_classes() -> list[type[ServiceError]]:
    for module in pkgutil.walk_packages(service.__path__, "service."):
        if not module.name.startswith("service.client") and "__main__" not in module.name:
            importlib.import_module(module.name)
    found: list[type[ServiceError]] = []
    pending: list[type[ServiceError]] = [ServiceError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_error_code_of_the_service_has_its_exception() -> None:
    for cls in _server_error_classes():
        if cls.__module__.startswith(
            ("service.batch", "service.cli", "service.loadtest", "service.evaluation")
        ):
            continue  # errors of commands (exit 2), never answered over HTTP
        client_cls = error_class(cls.code)
        assert client_cls is not PprError, f"{cls.__name__} ({cls.code}) has no client class"
        assert client_cls.default_status == cls.status, cls.code
    for code in [*_HTTP_CODES.values(), "malformed_json"]:
        assert code in ERROR_CLASSES, code
    assert issubclass(AccountExists, Conflict)


def test_the_client_imports_nothing_of_the_server() -> None:
    script = (
        "import sys, service.client\n"
        "heavy = {'fastapi', 'starlette', 'numpy', 'scipy', 'sqlalchemy', 'redis', 'uvicorn'}\n"
        "loaded = {m.split('.')[0] for m in sys.modules} & heavy\n"
        "own = [m for m in sys.modules if m.startswith('service.')"
        " and not m.startswith('service.client')]\n"
        "assert not loaded and not own, (loaded, own)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def _request(call: calls.Call[Any]) -> httpx.Request:
    with httpx.Client(base_url="http://service") as http:
        return call.request(http.build_request)


def test_requests_carry_only_what_was_given() -> None:
    plain = _request(calls.ppr("a/b c", k=5))
    assert plain.url.raw_path == b"/v1/ppr/a%2Fb%20c?k=5"
    assert plain.headers["Idempotency-Key"] and plain.headers["X-Request-ID"]
    full = _request(
        calls.ppr(7, mode="edge", fresh=True, exclude_neighbors=True, mechanism="pushflowcap")
    )
    assert dict(full.url.params) == {
        "mode": "edge",
        "fresh": "true",
        "exclude_neighbors": "true",
        "mechanism": "pushflowcap",
    }
    body = _request(calls.batch([1, "2"], epsilon=0.1)).read()
    assert body == b'{"nodes":["1","2"],"epsilon":0.1}'
    assert b"mechanism" in _request(calls.batch(["1"], mechanism="x")).read()
    assert _request(calls.set_scopes(3, may_create_seed_accounts=False)).read() == (
        b'{"may_create_seed_accounts":false}'
    )


def test_each_call_has_its_own_key_and_keeps_it() -> None:
    call = calls.ppr("1")
    assert _request(call).headers["Idempotency-Key"] == _request(call).headers["Idempotency-Key"]
    assert call.idempotency_key != calls.ppr("1").idempotency_key
    assert calls.ppr("1", idempotency_key="mine").idempotency_key == "mine"
    assert calls.budget().idempotency_key is None
    assert not calls.create_account("user").resend_safe
    assert not calls.create_key(1).resend_safe
    assert calls.revoke_key(1).resend_safe and calls.batch(["1"]).resend_safe


def test_answers_of_a_newer_server_still_read() -> None:
    answer = PprAnswer.model_validate(
        {
            "node": "1",
            "graph_version": "v",
            "results": [{"node": "2", "score": 0.5, "rank": 1}],
            "mechanism": {"name": "new", "mode": "group", "epsilon": 0.1, "delta": 1e-6, "x": 1},
            "budget": {
                "account_id": 1,
                "spent_epsilon": 0.1,
                "cap_epsilon": 1,
                "remaining_epsilon": 0.9,
                "delta": 1e-6,
                "charges": 1,
            },
            "replayed": False,
            "request_id": "r",
            "epsilon_charged": 0.1,
            "cost": {"new": True},
        }
    )
    assert answer.mechanism.mode == "group" and answer.mechanism.model_extra == {"x": 1}
    assert answer.mechanism.steps is None and answer.model_extra == {"cost": {"new": True}}


def _response(status: int, body: Any = None, **headers: str) -> httpx.Response:
    request = httpx.Request("GET", "http://service/v1/ppr/1")
    if isinstance(body, str):
        return httpx.Response(status, text=body, headers=headers, request=request)
    return httpx.Response(status, json=body, headers=headers, request=request)


def _error(code: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": f"{code}!", "details": details}}


def test_error_mapping() -> None:
    newer = error_from_response(_response(418, _error("teapot"), **{"X-Request-ID": "r1"}))
    assert type(newer) is PprError and (newer.code, newer.status) == ("teapot", 418)
    assert newer.request_id == "r1" and str(newer) == "teapot (418): teapot!; request id r1"
    limited = error_from_response(_response(429, _error("rate_limited", retry_after_seconds=3)))
    assert isinstance(limited, RateLimited) and limited.retry_after == 3
    proxy = error_from_response(_response(502, "<html>bad gateway</html>", **{"Retry-After": "2"}))
    assert isinstance(proxy, InvalidResponse) and proxy.status == 502 and proxy.retry_after == 2
    with pytest.raises(InvalidResponse):
        calls.budget().result(_response(200, {"account_id": "not a budget"}))


def test_retry_after_forms() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("7") == 7 and parse_retry_after(None) is None
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90)), now=now) == 90
    assert parse_retry_after("soon") is None


def _wait(policy: RetryPolicy, status: int, code: str, *, attempt: int = 1, safe: bool = True,
          retry_after: float | None = None) -> float | None:  # fmt: skip
    error = error_class(code)("m", status=status, code=code, retry_after=retry_after)
    return policy.after_error(error, attempt, resend_safe=safe)


def test_what_is_retried() -> None:
    policy = RetryPolicy(attempts=3, backoff=0.1, max_backoff=0.3, max_retry_after=10)
    assert _wait(policy, 409, "request_in_progress", retry_after=1) is not None
    assert _wait(policy, 503, "overloaded", retry_after=2) == pytest.approx(2.05, abs=0.051)
    assert _wait(policy, 503, "overloaded", safe=False) is not None
    assert _wait(policy, 503, "charge_settled", safe=False) is None
    assert _wait(policy, 504, "invalid_response") is not None
    assert _wait(policy, 503, "overloaded", attempt=3) is None  # attempts are bounded
    assert _wait(policy, 503, "overloaded", retry_after=11) is None  # too long: raised
    assert _wait(policy, 429, "rate_limited", retry_after=1) is None
    polite = RetryPolicy(retry_rate_limited=True)
    assert _wait(polite, 429, "rate_limited", retry_after=1) is not None
    assert _wait(polite, 429, "service_quota_exhausted", retry_after=1) is None
    for status, code in [(403, "budget_exhausted"), (422, "invalid_parameter"), (500, "x")]:
        assert _wait(policy, status, code) is None

    request = httpx.Request("GET", "http://service/")
    refused = httpx.ConnectError("refused", request=request)
    dropped = httpx.RemoteProtocolError("dropped", request=request)
    slow = httpx.ReadTimeout("slow", request=request)
    assert policy.after_transport_error(refused, 1, resend_safe=False) is not None
    assert policy.after_transport_error(dropped, 1, resend_safe=True) is not None
    assert policy.after_transport_error(dropped, 1, resend_safe=False) is None
    assert policy.after_transport_error(slow, 1, resend_safe=False) is None
    assert policy.after_transport_error(slow, 3, resend_safe=True) is None
    waits = [policy.backoff_seconds(n) for n in (1, 2, 3, 4) for _ in range(50)]
    assert all(0.05 <= w <= 0.3 for w in waits)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
