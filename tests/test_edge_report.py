"""``ledger edge-report``: its figures, its errors, and proof that it reaches admins only.

Confinement: (i) no HTTP route or OpenAPI schema serves a per-edge figure, and neither the API,
the server nor ``python -m service`` imports the per-edge code (checked in a fresh process);
(ii) neither the report nor a serving session around it logs a figure or the edge's ids;
(iii) admission, calibration and the serving path never import it (static import graph), the
report writes nothing to the ledger, and charges are identical with and without a report.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session

from service.cli import main
from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from service.ledger.tables import Charge
from tests.api_support import Backend, bearer, open_ledger, running_app

REPO = Path(__file__).resolve().parents[1]
PER_EDGE_MODULES = ("service.privacy.per_edge", "service.edge_report", "service.cli.edge_report")
#: Node ids that appear nowhere else (a log line naming the edge would contain them).
PREFIX = "qz"
#: Words a per-edge route or schema field would carry.
FORBIDDEN_WORDS = ("per_edge", "per-edge", "edge_report", "edge-report", "per-instance",
                   "per_instance", "pdp")  # fmt: skip


def _graph_file(path: Path) -> Path:
    """A generated 120-node graph whose ids are ``qz0`` .. ``qz119``."""
    raw = path.with_suffix(".raw")
    write_generated_edge_list(raw, 120, 600, seed=4)
    lines = [line.split() for line in raw.read_text().splitlines() if line.strip()]
    path.write_text("".join(f"{PREFIX}{a} {PREFIX}{b}\n" for a, b, *_ in lines))
    return path


@pytest.fixture
def world(tmp_path: Path, ledger_url: str) -> Iterator[dict[str, Any]]:
    graph = _graph_file(tmp_path / "graph.txt")
    upgrade(ledger_url)
    keys: dict[str, str] = {}
    ids: dict[str, int] = {}
    with open_ledger(ledger_url) as ledger:
        for node in ("qz1", "qz2"):
            account = ledger.accounts.create_account(
                "user", node_id=node, cap_epsilon=5.0, delta=1e-6
            )
            keys[node], _ = ledger.api_keys.create_api_key(account.account_id)
            ids[node] = account.account_id
    yield {"graph": graph, "url": ledger_url, "keys": keys, "ids": ids,
           "backend": Backend("t", ledger_url, None, graph)}  # fmt: skip


def _queries(client: Any, keys: dict[str, str]) -> None:
    for node, mode in (("qz1", "personalized"), ("qz1", "edge"), ("qz2", "personalized")):
        for eps in (0.1, 0.3):
            response = client.get(
                f"/v1/ppr/{node}", params={"epsilon": eps, "mode": mode, "fresh": "true"},
                headers=bearer(keys[node]),
            )  # fmt: skip
            assert response.status_code == 200, response.text


def _edge_endpoints(graph: Path, avoid: set[str]) -> tuple[str, str]:
    for line in graph.read_text().splitlines():
        a, b = line.split()
        if a not in avoid and b not in avoid:
            return a, b
    raise AssertionError("no edge away from the seeds")


def _report(capsys: pytest.CaptureFixture[str], w: dict[str, Any], *args: str) -> Any:
    code = main(["ledger", "edge-report", "--graph", str(w["graph"]),
                 "--database-url", w["url"], "--json", *args])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_report_composes_the_releases(
    capsys: pytest.CaptureFixture[str], world: dict[str, Any]
) -> None:
    with running_app(world["backend"]) as client:
        _queries(client, world["keys"])
    u, v = _edge_endpoints(world["graph"], {"qz1", "qz2"})
    report = _report(capsys, world, "--edge", u, v)
    assert report["edge_in_graph"] and report["scope"] == "graph-wide"
    assert report["total"]["releases"] == 6
    assert set(report["by_mode"]) == {"personalized", "edge"}
    assert report["by_mode"]["edge"]["releases"] == 2
    for row in (report["total"], *report["by_mode"].values()):
        assert 0 < row["per_edge_epsilon"] <= row["worst_case_epsilon"]
        assert row["ratio"] == pytest.approx(row["per_edge_epsilon"] / row["worst_case_epsilon"])
    # the worst case is what the ledger charged for the same releases (delta 1e-6)
    with open_ledger(world["url"]) as ledger:
        assert report["total"]["worst_case_epsilon"] == pytest.approx(
            ledger.reports.exposure(delta=1e-6).epsilon, rel=1e-9
        )
    # one account's releases, at its delta
    mine = _report(capsys, world, "--edge", u, v, "--account", str(world["ids"]["qz2"]))
    assert mine["total"]["releases"] == 2 and mine["by_mode"].keys() == {"personalized"}
    # an edge at the seed: personalized releases to that seed do not protect it
    neighbour = next(
        b for a, b in (line.split() for line in world["graph"].read_text().splitlines())
        if a == "qz1" and b != "qz2"
    )  # fmt: skip
    own = _report(capsys, world, "--edge", "qz1", neighbour)
    assert own["not_covered"]["seed_own_edge"] == 2
    assert own["total"]["releases"] == 4 and own["by_mode"]["edge"]["releases"] == 2
    # a pair that is not an edge: the loss of adding it
    absent = _report(capsys, world, "--edge", "qz0", "qz119")
    assert not absent["edge_in_graph"] and absent["total"]["releases"] == 6
    # the text form: one row per mode and the whole
    code, out, err = _cli(capsys, "ledger", "edge-report", "--graph", str(world["graph"]),
                          "--database-url", world["url"], "--edge", u, v)  # fmt: skip
    assert code == 0 and err == "" and "not a DP guarantee" in out
    assert [line.split()[0] for line in out.splitlines()[4:7]] == ["all", "edge", "personalized"]


@pytest.mark.parametrize(
    ("edge", "code"),
    [(("qz1", "nobody"), "unknown_node"), (("qz1", "qz1"), "invalid_parameter")],
)
def test_bad_edges_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], world: dict[str, Any], edge: tuple[str, str], code: str
) -> None:
    status, out, err = _cli(capsys, "ledger", "edge-report", "--graph", str(world["graph"]),
                            "--database-url", world["url"], "--edge", *edge)  # fmt: skip
    assert status == 2 and out == ""
    assert err.startswith(f"error [{code}]") and len(err.strip().splitlines()) == 1


def test_a_ledger_without_releases_is_exit_2(
    capsys: pytest.CaptureFixture[str], world: dict[str, Any]
) -> None:
    status, out, err = _cli(capsys, "ledger", "edge-report", "--graph", str(world["graph"]),
                            "--database-url", world["url"], "--edge", "qz3", "qz4")  # fmt: skip
    assert status == 2 and out == ""
    assert err.startswith("error [not_found]") and "no releases" in err
    with pytest.raises(SystemExit) as exc:  # an edge spec with one node
        main(["ledger", "edge-report", "--database-url", world["url"], "--edge", "qz3"])
    assert exc.value.code == 2


# -- (i) never in a user's or a service account's view ------------------------------------


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, endpoint) of every route, through included routers and mounts."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:  # a router included lazily
            yield from _routes(inner.routes, prefix + route.include_context.prefix)
        elif hasattr(route, "routes") and not hasattr(route, "endpoint"):
            yield from _routes(route.routes, prefix + getattr(route, "path", ""))
        else:
            yield prefix + getattr(route, "path", ""), getattr(route, "endpoint", None)


def test_no_route_or_schema_serves_a_per_edge_figure(world: dict[str, Any]) -> None:
    with running_app(world["backend"]) as client:
        found = list(_routes(client.app.routes))  # type: ignore[attr-defined]
        schema = json.dumps(client.get("/openapi.json").json()).lower()
    paths = {path for path, _ in found}
    assert {"/v1/ppr/{node_id:node}", "/v1/admin/exposure"} <= paths  # the walk sees them all
    for _, endpoint in found:
        assert not getattr(endpoint, "__module__", "").startswith(PER_EDGE_MODULES)
    for path in paths:
        assert not any(word in path.lower() for word in FORBIDDEN_WORDS)
    for word in FORBIDDEN_WORDS:
        assert word not in schema


@pytest.mark.slow
def test_serving_never_imports_the_per_edge_code() -> None:
    program = (
        "import sys\n"
        "from service.api.app import create_app\n"
        "from service.config import Settings\n"
        "import service.cli, service.cli.serve, service.cli.ledger, service.serving.ppr_query\n"
        "service.cli.build_parser()\n"
        "create_app(Settings(), configure_logs=False)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "service.api.app" in loaded and "service.cli.ledger" in loaded
    assert [m for m in loaded if m.startswith(PER_EDGE_MODULES)] == []


# -- (ii) never in logs -----------------------------------------------------------------


def test_neither_the_report_nor_serving_logs_it(
    capsys: pytest.CaptureFixture[str], world: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    u, v = _edge_endpoints(world["graph"], {"qz1", "qz2"})
    caplog.set_level(logging.DEBUG)
    with running_app(world["backend"]) as client:
        _queries(client, world["keys"])
        report = _report(capsys, world, "--edge", u, v)
        _queries(client, world["keys"])
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert len(caplog.records) > 0  # the capture sees the session's log lines
    assert [r for r in caplog.records if r.name.startswith(PER_EDGE_MODULES)] == []
    for node in (u, v):
        assert f"'{node}'" not in logged and f" {node} " not in logged and f"/{node}" not in logged
    for row in (report["total"], *report["by_mode"].values()):
        for key in ("per_edge_epsilon", "ratio"):
            value = row[key]
            for text in (repr(value), f"{value:.6g}", f"{value:.4g}"):
                # as a number of its own, not a piece of a longer one (a timing, an id)
                assert not re.search(rf"(?<![\d.]){re.escape(text)}(?!\d)", logged), text


# -- (iii) never used to admit, charge or calibrate -------------------------------------


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_import_graph_keeps_it_off_admission_and_calibration() -> None:
    graph = {_module_name(p): _imports(p) for p in (REPO / "service").rglob("*.py")}
    # who imports the per-edge code at all (at any level): the report, its CLI, and the
    # ledger command's handler (inside the function, checked by the subprocess test)
    importers = {
        name for name, imports in graph.items()
        if any(i.startswith(PER_EDGE_MODULES) for i in imports)
        and not name.startswith(PER_EDGE_MODULES)
    }  # fmt: skip
    assert importers == {"service.cli.ledger"}
    # nothing reachable from admission, calibration, charging or serving reaches it
    roots = [
        "service.ledger.admission", "service.ledger.admission_rules", "service.ledger.ledger",
        "service.privacy.calibration", "service.privacy.accountant", "service.serving.ppr_query",
        "service.api.app", "service.batch.run",
    ]  # fmt: skip
    seen: set[str] = set()
    todo = [r for r in roots if r in graph]
    assert len(todo) == len(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(i for i in graph.get(name, ()) if i in graph and i not in seen)
    assert [m for m in seen if m.startswith(PER_EDGE_MODULES)] == []
    assert "service.ledger.admission" in seen and len(seen) > 30


def _dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in primary-key order."""
    with open_ledger(url) as ledger:
        meta = MetaData()
        meta.reflect(ledger.engine)
        with Session(ledger.engine) as session:
            return {
                name: [
                    tuple(row)
                    for row in session.execute(select(table).order_by(*table.primary_key.columns))
                ]
                for name, table in meta.tables.items()
            }


def _charges(url: str) -> list[tuple[Any, ...]]:
    with open_ledger(url) as ledger, Session(ledger.engine) as session:
        return [
            (c.charged_account_id, c.seed, c.mechanism, c.mode, c.epsilon, c.pure_epsilon,
             json.dumps(c.rdp), c.state,
             json.dumps({k: v for k, v in c.params.items()}, sort_keys=True))
            for c in session.scalars(select(Charge).order_by(Charge.id))
        ]  # fmt: skip


def test_a_report_writes_nothing_and_changes_no_charge(
    capsys: pytest.CaptureFixture[str], world: dict[str, Any], tmp_path: Path
) -> None:
    # a twin ledger gets the same queries, without any report
    twin_url = f"sqlite:///{tmp_path / 'twin.db'}"
    upgrade(twin_url)
    twin_keys = {}
    with open_ledger(twin_url) as ledger:
        for node in ("qz1", "qz2"):
            account = ledger.accounts.create_account(
                "user", node_id=node, cap_epsilon=5.0, delta=1e-6
            )
            twin_keys[node], _ = ledger.api_keys.create_api_key(account.account_id)
    twin = Backend("twin", twin_url, None, world["graph"])
    u, v = _edge_endpoints(world["graph"], {"qz1", "qz2"})
    with running_app(world["backend"]) as client:
        _queries(client, world["keys"])
        before = _dump(world["url"])
        _report(capsys, world, "--edge", u, v)
        _report(capsys, world, "--edge", "qz0", "qz119", "--account", str(world["ids"]["qz1"]))
        assert _dump(world["url"]) == before  # the report wrote nothing
        _queries(client, world["keys"])
    with running_app(twin) as client:
        _queries(client, twin_keys)
        _queries(client, twin_keys)
    assert len(_charges(world["url"])) == 12
    assert _charges(world["url"]) == _charges(twin_url)
    with open_ledger(world["url"]) as a, open_ledger(twin_url) as b:
        # the same charges; each lands on a shard drawn at random, and the shards' curves are
        # summed in their own order, so the two compositions may differ in the last bits
        assert a.reports.exposure(delta=1e-6).to_dict()["epsilon"] == pytest.approx(
            b.reports.exposure(delta=1e-6).to_dict()["epsilon"], rel=1e-12
        )
