"""The OpenAPI document reads cleanly into a generated client (issue 31, item 6).

A backend team generates a client from ``/openapi.json`` with a standard generator. Every
operation has an explicit, stable, unique operation id (camelCase: ``getPpr``,
``postPprBatch``), so generated method names are readable and do not change when a path or a
function is renamed; no model name collides with one a generator derives for an inline schema
(``Exposure.by_mode`` became ``ExposureByMode``, which was also a model: openapi-python-client
dropped ``Exposure``). Checked statically, then by generating a client with
``openapi-python-client`` (a dev dependency) and asking a live server a query with it.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

import service.api.routes
from service.api.app import create_app
from service.config import Settings
from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from tests.api_support import GRAPH_EDGES, GRAPH_NODES, Backend, user_with_key, uvicorn_server

OPERATION_ID = re.compile(r"^[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)*$")
PACKAGE = "ppr_generated_client"

# The served document (built from a new app, about 0.5 CPU-s) and the client generated from it
# (openapi-python-client, about 1.2) are module fixtures: its tests run on one xdist worker, so
# that they are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_openapi_clients")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    app = create_app(Settings(), configure_logs=False)
    document: dict[str, Any] = app.openapi()
    return document


def _pascal(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def test_every_operation_has_an_explicit_unique_camel_case_id(schema: dict[str, Any]) -> None:
    routers = [
        importlib.import_module(f"service.api.routes.{info.name}").router
        for info in pkgutil.iter_modules(service.api.routes.__path__)
    ]  # every route module (each has a router), so a new one cannot be left out
    routes = [
        route
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
    ]
    assert len(routes) == sum(len(methods) for methods in schema["paths"].values())
    implicit = [f"{sorted(r.methods)} {r.path}" for r in routes if r.operation_id is None]
    assert not implicit, f"routes without an explicit operation_id: {implicit}"
    ids = [
        operation["operationId"]
        for methods in schema["paths"].values()
        for operation in methods.values()
    ]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert all(OPERATION_ID.fullmatch(i) for i in ids), [
        i for i in ids if not OPERATION_ID.fullmatch(i)
    ]
    assert {"getPpr", "postPprBatch", "getEmbedding", "postEmbeddingsBatch"} <= set(ids)


def _inline_object(schema: dict[str, Any]) -> bool:
    """A property schema a generator turns into a model of its own (named parent+property)."""
    if "$ref" in schema:
        return False
    if schema.get("type") == "object" or "properties" in schema or "additionalProperties" in schema:
        return True
    return any(_inline_object(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))


def test_no_model_name_collides_with_one_a_generator_derives(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    classes = {_pascal(name): name for name in components}
    assert len(classes) == len(components), "two schema names map to one class name"
    derived: dict[str, str] = {}
    for name, body in components.items():
        for prop, prop_schema in body.get("properties", {}).items():
            if _inline_object(prop_schema):
                derived[f"{_pascal(name)}{_pascal(prop)}"] = f"{name}.{prop}"
    clashes = {d: where for d, where in derived.items() if d in classes}
    assert not clashes, f"inline schemas named like a model: {clashes}"


@pytest.fixture(scope="module")
def generated(schema: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The client ``openapi-python-client`` generates from the served document."""
    tool = Path(sys.executable).with_name("openapi-python-client")
    if not tool.exists():
        pytest.skip("openapi-python-client is not installed (pip install -e '.[dev]')")
    work = tmp_path_factory.mktemp("generated")
    (work / "openapi.json").write_text(json.dumps(schema))
    config = {"project_name_override": "ppr-generated-client", "package_name_override": PACKAGE}
    (work / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [str(tool), "generate", "--path", str(work / "openapi.json"), "--config",
         str(work / "config.json"), "--output-path", str(work / "client")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Warning" not in output and "duplicate" not in output, output
    sys.path.insert(0, str(work / "client"))
    try:
        yield work / "client"
    finally:
        sys.path.remove(str(work / "client"))
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[module]


def test_the_generated_client_has_every_model_and_readable_methods(generated: Path) -> None:
    models = importlib.import_module(f"{PACKAGE}.models")
    for name in ("Exposure", "ModeExposure", "PprAnswer", "BatchQuery", "EmbeddingBatchQuery"):
        assert hasattr(models, name), name
    for module in ("queries.get_ppr", "queries.post_ppr_batch", "embeddings.post_embeddings_batch",
                   "admin.get_exposure"):  # fmt: skip
        importlib.import_module(f"{PACKAGE}.api.{module}")


def test_the_generated_client_asks_a_live_server_a_query(generated: Path, tmp_path: Path) -> None:
    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    _, key = user_with_key(url, "5", cap_epsilon=10.0)
    client_module = importlib.import_module(PACKAGE)
    get_ppr = importlib.import_module(f"{PACKAGE}.api.queries.get_ppr")
    with uvicorn_server(Backend("sqlite", url, None, graph_path), forked=True) as server:
        client = client_module.AuthenticatedClient(base_url=server.base_url, token=key)
        with client as http:
            answer = get_ppr.sync(node_id="5", client=http, k=5, epsilon=0.1)
            again = get_ppr.sync_detailed(node_id="5", client=http, k=5, epsilon=0.1)
    assert answer is not None and type(answer).__name__ == "PprAnswer", answer
    assert answer.node == "5" and len(answer.results) == 5
    assert answer.budget.charges >= 1 and not answer.replayed
    assert again.status_code == 200 and again.parsed is not None and again.parsed.replayed
