"""A route whose well-formed requests skip FastAPI's per-request dependency bookkeeping.

FastAPI works out on every request what could be worked out once per route: for each
dependency its cache key and whether it is a generator or uses security scopes, for each
parameter its aliases and whether it is a sequence, a JSON field or a model. On
``GET /v1/ppr/{node}``, whose replays cost about twice a ``/healthz``, that bookkeeping was
about a quarter of a replay's CPU in the worker (measured in process: 1.8-2.0 ms a replay
through FastAPI's handler, 1.3-1.5 ms the direct way, same process, rounds interleaved).

:class:`DirectRoute` works it out once, when the route's handler is built
(:func:`plan_route`): the endpoint's own path, query and header parameters, each validated by
the pydantic field FastAPI made for it, under the same alias and location; its dependencies,
called in FastAPI's order (each one's own dependencies first), with FastAPI's per-request
cache, a ``yield`` dependency entered on the exit stack of its scope through FastAPI's own
helper. A request goes the direct way only when all its parameters validate. Any other
request (a parameter missing, malformed or out of range) is handed to FastAPI's handler,
which answers it as it always has: the dependencies first (authentication, the rate limit,
the engine's queue), then ``422 invalid_parameter``. Validating a parameter has no side
effect, so trying them first and handing the request over changes nothing it does.

The direct way is used only where it gives what FastAPI's handler gives: an ``async``
endpoint that returns a :class:`~starlette.responses.Response` and takes no body; parameters
that are plain fields (no sequences, models or JSON); dependencies that are ``async``
functions or ``async`` generators taking only the request (or connection) and other such
dependencies. Another route keeps FastAPI's handler, and so does a request while the app
overrides dependencies or FastAPI's telemetry traces the request. It leans on FastAPI's
internals (the helpers its own handler calls), so ``pyproject.toml`` pins FastAPI's minor
series; ``tests/unit/api/test_direct_route.py`` checks that both ways answer alike, and is the
check to run before moving the pin.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from fastapi._compat import ModelField, Undefined
from fastapi._compat.shared import field_annotation_is_sequence
from fastapi.dependencies.models import Dependant, _get_cache_key
from fastapi.dependencies.utils import (
    _get_param_aliases,
    _get_param_model,
    _is_json_field,
    _solve_generator,
    _validate_value_with_model_field,
)
from fastapi.routing import _effective_route_context_var
from fastapi.telemetry._api import _get_request_telemetry
from starlette.requests import Request
from starlette.responses import Response

from service.api.strict import StrictRoute

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


@dataclass(frozen=True, slots=True)
class _Param:
    """One of the endpoint's own parameters, as FastAPI reads it."""

    field: ModelField
    source: str  # "path", "query" or "header"
    aliases: tuple[tuple[str, str], ...]  # (validation alias, request key), preferred first


@dataclass(frozen=True, slots=True)
class _Dependency:
    """One dependency, its own dependencies solved first (as FastAPI does)."""

    dependant: Dependant
    subs: tuple[_Dependency, ...]
    key: Any  # FastAPI's cache key
    generator: bool  # an async generator: entered on an exit stack


@dataclass(frozen=True, slots=True)
class DirectPlan:
    """What a route's requests need, worked out once."""

    params: tuple[_Param, ...]
    dependencies: tuple[_Dependency, ...]
    request_param: str | None
    call: Callable[..., Coroutine[Any, Any, Any]]


def _plain_param(field: ModelField, source: str) -> _Param | None:
    if (
        _get_param_model(field) is not None
        or _is_json_field(field)
        or field_annotation_is_sequence(field.field_info.annotation)
    ):
        return None
    return _Param(field, source, tuple(_get_param_aliases(field)))


def _takes_only_the_request(dependant: Dependant) -> bool:
    return not (
        dependant.path_params
        or dependant.query_params
        or dependant.header_params
        or dependant.cookie_params
        or dependant.body_params
        or dependant.websocket_param_name
        or dependant.response_param_name
        or dependant.background_tasks_param_name
        or dependant.security_scopes_param_name
        or dependant.concurrency is not None
    )


def _is_async_call(call: Any) -> bool:
    if inspect.isfunction(call) or inspect.ismethod(call):
        return inspect.iscoroutinefunction(call)
    return inspect.iscoroutinefunction(type(call).__call__)


def _plan_dependency(dependant: Dependant) -> _Dependency | None:
    call = dependant.call
    if call is None or not _takes_only_the_request(dependant):
        return None
    generator = inspect.isasyncgenfunction(call)
    if not generator and not _is_async_call(call):
        return None  # a sync function runs in the threadpool, a sync generator too
    subs = [_plan_dependency(sub) for sub in dependant.dependencies]
    if any(sub is None for sub in subs):
        return None
    return _Dependency(
        dependant, tuple(s for s in subs if s is not None), _get_cache_key(dependant=dependant),
        generator,
    )  # fmt: skip


def _effective(route: StrictRoute) -> Any:
    """The route as FastAPI builds its handler: an included route's effective context (its
    router's prefix and dependencies, its app's dependency overrides) while it is built."""
    context = _effective_route_context_var.get()
    return context if context is not None and context.original_route is route else route


def plan_route(route: StrictRoute) -> DirectPlan | None:
    """The route's plan, or None where the direct way would not give what FastAPI gives."""
    dependant = _effective(route).dependant
    call = dependant.call
    if (
        call is None
        or not inspect.iscoroutinefunction(call)
        or _effective(route).body_field is not None
        or dependant.body_params
        or dependant.cookie_params
        or dependant.websocket_param_name
        or dependant.http_connection_param_name
        or dependant.response_param_name
        or dependant.background_tasks_param_name
        or dependant.security_scopes_param_name
    ):
        return None
    found = [
        _plain_param(field, source)
        for source, fields in (
            ("path", dependant.path_params),
            ("query", dependant.query_params),
            ("header", dependant.header_params),
        )
        for field in fields
    ]
    dependencies = [_plan_dependency(sub) for sub in dependant.dependencies]
    if any(p is None for p in found) or any(d is None for d in dependencies):
        return None
    return DirectPlan(
        params=tuple(p for p in found if p is not None),
        dependencies=tuple(d for d in dependencies if d is not None),
        request_param=dependant.request_param_name,
        call=call,
    )


def _param_values(plan: DirectPlan, request: Request) -> dict[str, Any] | None:
    """The parameters' values as FastAPI validates them; None if any of them fails (the
    request then goes through FastAPI, which reports it)."""
    sources: dict[str, Any] = {
        "path": request.path_params,
        "query": request.query_params,
        "header": request.headers,
    }
    values: dict[str, Any] = {}
    by_source: dict[str, dict[str, Any]] = {"path": {}, "query": {}, "header": {}}
    for param in plan.params:
        received = sources[param.source]
        aliases = param.aliases
        alias = next((key for _, key in aliases if key in received), aliases[0][1])
        value = received.get(alias, None)
        if value is None:
            value = Undefined
        own = by_source[param.source]
        validated, errors = _validate_value_with_model_field(
            field=param.field, value=value, values=own, loc=(param.source, alias)
        )
        if errors:
            return None
        own[param.field.name] = validated
        values[param.field.name] = validated
    return values


async def _solve(
    dependencies: tuple[_Dependency, ...],
    request: Request,
    cache: dict[Any, Any],
    values: dict[str, Any],
) -> None:
    """FastAPI's ``solve_dependencies`` for a planned tree: each dependency's own ones first,
    then the dependency (or its cached value), in declaration order."""
    for dep in dependencies:
        sub_values: dict[str, Any] = {}
        await _solve(dep.subs, request, cache, sub_values)
        dependant = dep.dependant
        if dependant.use_cache and dep.key in cache:
            solved = cache[dep.key]
        else:
            if dependant.http_connection_param_name:
                sub_values[dependant.http_connection_param_name] = request
            if dependant.request_param_name:
                sub_values[dependant.request_param_name] = request
            if dep.generator:
                scope = request.scope
                stack = scope["fastapi_function_astack" if dependant.scope == "function" else
                              "fastapi_inner_astack"]  # fmt: skip
                solved = await _solve_generator(
                    request=request, dependant=dependant, stack=stack, sub_values=sub_values
                )
            else:
                assert dependant.call is not None
                solved = await dependant.call(**sub_values)
        if dependant.name is not None:
            values[dependant.name] = solved
        if dep.key not in cache:
            cache[dep.key] = solved


class DirectRoute(StrictRoute):
    """A :class:`StrictRoute` whose well-formed requests are answered on a plan made once
    (:func:`plan_route`), others through FastAPI's handler."""

    def request_handler(self) -> Handler:
        handler = super().request_handler()
        plan = plan_route(self)
        if plan is None:
            return handler
        provider = _effective(self).dependency_overrides_provider

        async def direct_handler(request: Request) -> Response:
            scope = request.scope
            if (
                (provider is not None and getattr(provider, "dependency_overrides", None))
                or not isinstance(scope.get("fastapi_inner_astack"), AsyncExitStack)
                or not isinstance(scope.get("fastapi_function_astack"), AsyncExitStack)
                or _get_request_telemetry() is not None
            ):
                return await handler(request)
            values = _param_values(plan, request)
            if values is None:
                return await handler(request)
            await _solve(plan.dependencies, request, {}, values)
            if plan.request_param:
                values[plan.request_param] = request
            response = await plan.call(**values)
            if not isinstance(response, Response):
                raise TypeError(f"{self.path}: a direct route's endpoint returns a Response")
            return response

        return direct_handler
