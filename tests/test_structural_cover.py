"""The structural test (tests/test_structural_leaks.py) covers every operation a user or a
service account can call: each (method, route template) of the app, from its OpenAPI document
and the pages outside it (the API description, /docs, /redoc and their assets), is requested at
least once; the keyed /v1 operations by a user key and by the service key. Only the admin API
(under ``/v1/admin``) and the dashboard's pages (under ``/admin``) are left out, by name."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import FastAPI
from starlette.routing import Route

from service.api.app import create_app
from service.config import Settings
from tests.test_structural_leaks import _requests

#: only admin keys call these: the structural test checks one is refused, not that it is covered
ADMIN_PREFIXES = ("/v1/admin", "/admin")
KEYED_PREFIX = "/v1/"
USER_KEYS = {"7", "3", "5", "8", "poor"}  # the users of _accounts


def _app(tmp_path: Path) -> FastAPI:
    """Built in-process, without its lifespan: no graph loaded, no database opened."""
    graph = tmp_path / "g.txt"
    graph.write_text("0 1\n")
    settings = Settings(graph_path=graph, database_url=f"sqlite:///{tmp_path / 'l.db'}")
    return create_app(settings, configure_logs=False)


def _operations(app: FastAPI) -> set[tuple[str, str]]:
    """(method, template) of the OpenAPI document, plus the routes kept out of it."""
    schema = app.openapi()
    operations = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    }
    for route in app.routes:  # the pages, added to the app itself
        if isinstance(route, Route) and not route.include_in_schema:
            operations |= {(m, route.path) for m in route.methods or () if m != "HEAD"}
    return operations


def _template(operations: set[tuple[str, str]], method: str, path: str) -> str:
    """The route template ``path`` reaches; a literal segment wins over a parameter."""
    found = sorted(
        (template.count("{"), template)
        for m, template in operations
        if m == method
        and re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path)
    )
    assert found, f"{method} {path} reaches no route"
    return found[0][1]


def test_every_public_operation_is_in_the_structural_test(tmp_path: Path) -> None:
    operations = _operations(_app(tmp_path))
    public = {(m, p) for m, p in operations if not p.startswith(ADMIN_PREFIXES)}
    assert len(public) >= 10, public  # the walk found the document and the pages
    by_user: set[tuple[str, str]] = set()
    by_service: set[tuple[str, str]] = set()
    requested: set[tuple[str, str]] = set()
    for who, method, path, _, _ in _requests():
        operation = (method, _template(operations, method, path))
        requested.add(operation)
        if who in USER_KEYS:
            by_user.add(operation)
        elif who == "service":
            by_service.add(operation)
    missing = public - requested
    assert not missing, f"not requested by the structural test: {sorted(missing)}"
    keyed = {op for op in public if op[1].startswith(KEYED_PREFIX)}
    assert keyed, public
    assert not keyed - by_user, f"never requested with a user key: {sorted(keyed - by_user)}"
    assert not keyed - by_service, f"never with the service key: {sorted(keyed - by_service)}"
