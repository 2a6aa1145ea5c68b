"""Unit tests of :mod:`service.api.direct_route`: the direct way answers as FastAPI's handler
does, and hands FastAPI every request it would not answer alike."""

from __future__ import annotations

from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Annotated, Any

import fastapi.routing
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.testclient import TestClient

from service.api.direct_route import DirectRoute, plan_route
from service.api.error_responses import install_error_handlers
from service.api.routes import ppr
from service.api.strict import StrictRoute


def test_the_ranking_route_is_planned_and_the_sync_ones_are_not() -> None:
    routes = {(route.path, tuple(sorted(route.methods))): route for route in ppr.router.routes}
    plan = plan_route(routes[("/v1/ppr/{node_id:node}", ("GET",))])
    assert plan is not None
    assert [p.field.name for p in plan.params] == [
        "node_id", "k", "epsilon", "mode", "mechanism", "fresh", "refresh",
        "exclude_neighbors", "idempotency_key",
    ]  # fmt: skip
    assert [d.dependant.name for d in plan.dependencies] == ["runtime", "principal", "_turn"]
    assert plan_route(routes[("/v1/me/budget", ("GET",))]) is None  # a sync endpoint


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


_bearer = HTTPBearer(auto_error=False)


def _events(request: Request) -> list[str]:
    events: list[str] = request.app.state.events
    return events


async def runtime(request: Request) -> str:
    """Counts its calls per request: a cached dependency is called once."""
    request.state.runtime_calls = getattr(request.state, "runtime_calls", 0) + 1
    return f"runtime-{request.state.runtime_calls}"


async def principal(
    request: Request,
    rt: Annotated[str, Depends(runtime)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None or credentials.credentials != "good-key":
        raise HTTPException(status_code=401, detail="no")
    _events(request).append("principal")
    return f"caller of {rt}"


async def slot(request: Request) -> AsyncIterator[None]:
    _events(request).append("enter")
    yield
    _events(request).append("exit")


async def thing(
    request: Request,
    rt: Annotated[str, Depends(runtime)],
    who: Annotated[str, Depends(principal)],
    _slot: Annotated[None, Depends(slot, scope="function")],
    name: str,
    k: Annotated[int | None, Query(ge=1, le=100)] = None,
    eps: Annotated[float | None, Query(gt=0)] = None,
    colour: Colour = Colour.RED,
    flag: bool = False,
    tag: Annotated[str | None, Header(min_length=2)] = None,
) -> Response:
    _events(request).append("endpoint")
    body = f"{rt}|{who}|{name}|{k}|{eps}|{colour.value}|{flag}|{tag}"
    return Response(content=body, media_type="text/plain")


def _app(route_class: type[StrictRoute], events: list[str]) -> FastAPI:
    """A small app of one route like the ranking's: an async dependency used twice (cached),
    one that authenticates with HTTPBearer, a function-scoped ``yield`` dependency, and plain
    path, query and header parameters."""
    router = APIRouter(prefix="/v1", route_class=route_class)
    router.add_api_route("/thing/{name}", thing, methods=["GET"])
    app = FastAPI()
    app.state.events = events
    install_error_handlers(app)  # the service's: 422 invalid_parameter, naming it
    app.include_router(router)
    return app


_REQUESTS: list[tuple[str, dict[str, str]]] = [
    ("/v1/thing/a?k=3&eps=0.5&colour=blue&flag=true", {"Tag": "xy"}),
    ("/v1/thing/a", {}),
    ("/v1/thing/a?k=3&k=4", {}),  # the last value counts
    ("/v1/thing/a?k=0", {}),  # out of range: 422
    ("/v1/thing/a?k=x&colour=green", {}),  # two errors
    ("/v1/thing/a?eps=-1", {}),
    ("/v1/thing/a?flag=maybe", {}),
    ("/v1/thing/a", {"Tag": "x"}),  # too short
    ("/v1/thing/a?unknown=1", {}),
]


@pytest.mark.parametrize(("path", "headers"), _REQUESTS)
@pytest.mark.parametrize("auth", [None, "Bearer good-key", "Bearer bad-key", "Basic abc"])
def test_both_ways_answer_alike(path: str, headers: dict[str, str], auth: str | None) -> None:
    answers: list[tuple[int, bytes, list[str]]] = []
    for route_class in (StrictRoute, DirectRoute):
        events: list[str] = []
        sent = dict(headers) if auth is None else {**headers, "Authorization": auth}
        with TestClient(_app(route_class, events)) as client:
            response = client.get(path, headers=sent)
        answers.append((response.status_code, response.content, events))
    assert answers[0] == answers[1]


def _solves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the requests that went through FastAPI's own dependency solving."""
    solved: list[int] = []
    original = fastapi.routing.solve_dependencies

    async def counting(**kwargs: Any) -> Any:
        solved.append(1)
        return await original(**kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return solved


def test_a_well_formed_request_goes_the_direct_way(monkeypatch: pytest.MonkeyPatch) -> None:
    solved = _solves(monkeypatch)
    events: list[str] = []
    with TestClient(_app(DirectRoute, events)) as client:
        response = client.get(
            "/v1/thing/a?k=3&colour=blue", headers={"Authorization": "Bearer good-key"}
        )
    assert response.status_code == 200
    assert response.text == "runtime-1|caller of runtime-1|a|3|None|blue|False|None"
    assert events == ["principal", "enter", "endpoint", "exit"]
    assert solved == []


def test_a_malformed_request_goes_through_fastapi(monkeypatch: pytest.MonkeyPatch) -> None:
    solved = _solves(monkeypatch)
    events: list[str] = []
    with TestClient(_app(DirectRoute, events)) as client:
        response = client.get("/v1/thing/a?k=0", headers={"Authorization": "Bearer good-key"})
    assert response.status_code == 422
    assert events == ["principal", "enter"]  # the dependencies ran first, as ever
    assert solved == [1]


def test_overridden_dependencies_go_through_fastapi(monkeypatch: pytest.MonkeyPatch) -> None:
    solved = _solves(monkeypatch)
    events: list[str] = []
    app = _app(DirectRoute, events)

    async def no_auth() -> None:
        return None

    app.dependency_overrides[_bearer] = no_auth
    with TestClient(app) as client:
        response = client.get("/v1/thing/a", headers={"Authorization": "Bearer good-key"})
    assert response.status_code == 401  # the override answered, not the header
    assert solved == [1]
