"""``python -m service loadtest``: it starts the real service, drives every phase with both
drivers, and reports what was sent (the figures themselves are never asserted on).

The command runs forked from a process that has imported the service
(tests/cli_runner_support.py: ``run_cli``), not in a new interpreter each time; the server a
``--start`` run starts is its own subprocess, as always."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from service.graph.generate import write_generated_edge_list
from service.loadtest.report import PhaseResult, refusals
from service.loadtest.workload import Workload
from service.loadtest.wrk_driver import lua_string, script_for, wrk_available
from tests.api_support import Backend, free_port, uvicorn_server
from tests.cli_runner_support import run_cli

#: The started server without its background prefix table: the phases and the refused key do
#: not depend on it, and building it takes an interpreter and seconds per run; waiting for
#: the table is test_a_started_server_is_measured_once_its_prefix_table_is_ready's subject.
NO_TABLE = {"PPR_PREFIX_TABLE_BYTES": "0"}


@pytest.fixture
def graph_path(tmp_path: Path) -> Path:
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, 300, 1500, seed=3)
    return path


def loadtest(
    graph_path: Path, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> dict[str, object]:
    command = [
        "loadtest", "--start", "--workers", "1",
        "--port", str(free_port()), "--graph", str(graph_path),
        "--database-url", f"sqlite:///{tmp_path / 'ledger.db'}",
        "--duration", "0.5", "--warmup", "0", "--concurrency", "4", "--replay-seeds", "5",
        "--json", *extra,
    ]  # fmt: skip
    done = run_cli(command, env={**os.environ, **(env or {})}, timeout=300)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "driver",
    [
        "httpx",
        pytest.param(
            "wrk", marks=pytest.mark.skipif(not wrk_available(), reason="wrk is not installed")
        ),
    ],
)
def test_every_phase_runs_against_a_started_server(
    graph_path: Path, tmp_path: Path, driver: str
) -> None:
    out = loadtest(
        graph_path, tmp_path, "--driver", driver,
        "--phases", "healthz,fresh,replay,mixed,batch", "--batch-size", "3",
        "--batch-concurrency", "2", env=NO_TABLE,
    )  # fmt: skip
    phases = {p["phase"]: p for p in out["phases"]}  # type: ignore[attr-defined]
    assert list(phases) == ["healthz", "fresh", "replay", "mixed", "batch"]
    assert out["graph"] == {"nodes": 300, "edges": 1500, "source": str(graph_path)}
    assert out["prefix_table"] == "off"  # PPR_PREFIX_TABLE_BYTES=0: the run says so
    for name, phase in phases.items():
        assert phase["driver"] == driver
        assert phase["requests"] > 0, name
        assert phase["errors"] == 0, (name, phase["statuses"])
        assert set(phase["statuses"]) == {"200"}, name
        assert phase["p50_ms"] <= phase["p90_ms"] <= phase["p99_ms"]
    assert phases["healthz"]["fraction_of_healthz"] == 1.0
    assert phases["batch"]["items_per_request"] == 3
    assert phases["batch"]["concurrency"] == 2  # --batch-concurrency, not -c
    assert phases["fresh"]["concurrency"] == out["concurrency"]
    assert phases["batch"]["items_per_second"] == pytest.approx(3 * phases["batch"]["rps"])
    assert phases["batch"]["item_errors"] == 0


@pytest.mark.slow
def test_a_started_server_is_measured_once_its_prefix_table_is_ready(tmp_path: Path) -> None:
    path = tmp_path / "bigger.txt"
    write_generated_edge_list(path, 1500, 9000, seed=4)
    # nothing built yet; at K 30 (a third of the default) the run still waits for the build,
    # about 3 s
    env = {"PPR_GRAPH_SNAPSHOT_DIR": str(tmp_path / "snap"), "PPR_STEPS": "30"}
    out = loadtest(path, tmp_path, "--phases", "healthz,fresh", env=env)
    assert out["prefix_table"] == "ready"
    assert len(list((tmp_path / "snap").glob("prefixes-*.prefixes"))) == 2
    # with the table off the run says "off": test_every_phase_runs_against_a_started_server


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    done = run_cli(["loadtest", "--phases", "healthz,nope"])
    assert done.returncode == 2
    assert "healthz, fresh, replay, mixed, batch" in done.stderr
    done = run_cli(
        ["loadtest", "--graph", str(tmp_path / "none.txt"), "--url", "http://127.0.0.1:1"]
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error [invalid_parameter]: graph:")


def test_a_ledger_database_that_does_not_answer_is_refused_before_the_server_starts(
    graph_path: Path, postgres_url: str
) -> None:
    """A database that does not exist on a live PostgreSQL: one line naming it and the
    server's reason, before a server is started (it would have kept reconnecting for the
    run's whole wait)."""
    missing = postgres_url.rsplit("/", 1)[0] + "/ppr_no_such_database"
    done = run_cli(
        ["loadtest", "--start", "--workers", "1", "--port", str(free_port()),
         "--graph", str(graph_path), "--database-url", missing, "--duration", "0.5"],
        timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    first = done.stderr.strip().splitlines()[-1]
    assert first.startswith("error [ledger_unavailable]: the ledger database postgresql")
    assert "ppr_no_such_database" in first and "does not exist" in first


def test_the_wrk_script_carries_any_node_id_and_the_key() -> None:
    assert lua_string('a"b\\c\né') == '"a\\034b\\092c\\010\\195\\169"'
    workload = Workload(
        name="batch", kind="batch", seeds=("7", 'x"y'), batch_size=2,
        headers={"Authorization": "Bearer ppr_k"},
    )  # fmt: skip
    script = script_for(workload)
    assert '["Authorization"]="Bearer ppr_k"' in script
    assert '"\\034x\\092\\034y\\034"' in script  # the JSON-encoded id '"x\"y"'
    assert "local batch_size = 2" in script


def test_the_mechanism_goes_with_every_ranking_request() -> None:
    blended = Workload(
        name="fresh", kind="ppr", seeds=("7",), mode="personalized", mechanism="blended"
    )
    assert "mechanism=blended" in blended.query_string(fresh=True)
    assert "mechanism=blended" in blended.query_string(fresh=False)
    assert blended.batch_body(["7"])["mechanism"] == "blended"
    assert lua_string('"mechanism": "blended"')[1:-1] in script_for(replace(blended, kind="batch"))
    assert "mechanism=blended" in script_for(blended)
    default = replace(blended, mechanism=None)  # the server's default: nothing sent
    assert "mechanism" not in default.query_string(fresh=True)
    assert "mechanism" not in default.batch_body(["7"])


def test_a_mechanism_the_mode_does_not_offer_is_refused_before_the_run() -> None:
    command = ["loadtest", "--url", "http://127.0.0.1:1"]
    done = run_cli([*command, "--mechanism", "blended"])  # the default mode is edge
    assert done.returncode == 2
    assert done.stderr.startswith("error [invalid_parameter]: mechanism:")
    assert "personalized mode only" in done.stderr
    done = run_cli([*command, "--mechanism", "nope"])
    assert done.returncode == 2
    assert "blended" in done.stderr  # argparse lists the choices
    done = run_cli(["loadtest", "--help"])
    assert done.returncode == 0, done.stderr
    assert "--mechanism" in done.stdout


def test_a_refused_budget_is_named_for_the_mode_it_was_charged_in() -> None:
    refused = PhaseResult(
        phase="fresh", driver="wrk", concurrency=4, seconds=1.0, requests=10, errors=1,
        p50_ms=1.0, p90_ms=1.0, p99_ms=1.0, statuses={"200": 9, "403": 1},
        error_codes={"403 budget_exhausted": 1},
    )  # fmt: skip
    (edge,) = refusals([refused])
    (personalized,) = refusals([refused], personalized=True)
    assert edge.startswith("the key was refused in the fresh phase: 403 budget_exhausted on 1")
    assert "one service account" in edge and "seed user" not in edge
    assert "seed user's account" in personalized and "--seeds" in personalized


@pytest.mark.slow
def test_personalized_blended_load_on_a_started_server(graph_path: Path, tmp_path: Path) -> None:
    out = loadtest(
        graph_path, tmp_path, "--driver", "httpx", "--mode", "personalized",
        "--mechanism", "blended", "--phases", "healthz,fresh,replay,batch", "--batch-size", "3",
        "--batch-concurrency", "2", env=NO_TABLE,
    )  # fmt: skip
    assert (out["mode"], out["mechanism"]) == ("personalized", "blended")
    for phase in out["phases"]:  # type: ignore[attr-defined]
        assert phase["requests"] > 0, phase["phase"]
        assert set(phase["statuses"]) == {"200"}, (phase["phase"], phase["statuses"])
    # every answer the run stored is a blended one, charged to a seed user it created
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        stored = set(db.execute("SELECT DISTINCT mechanism_name, mode FROM releases"))
        users = db.execute("SELECT count(*) FROM accounts WHERE type = 'user'").fetchone()[0]
    assert stored == {("blended", "personalized")}
    assert users > 0


@pytest.mark.slow
def test_a_refused_key_is_named_with_its_code_and_fails_the_run(
    graph_path: Path, tmp_path: Path
) -> None:
    from service.ledger import Ledger, upgrade

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    ledger = Ledger.from_url(url)
    try:
        spent = ledger.accounts.create_account(
            "service", cap_epsilon=1e-6, delta=1e-6, label="tiny cap"
        )
        key, _ = ledger.api_keys.create_api_key(spent.account_id)
    finally:
        ledger.dispose()
    # one server for both runs (a run's own --start is the other tests' subject)
    backend = Backend("sqlite", url, None, graph_path)
    with uvicorn_server(backend, extra_env=NO_TABLE, forked=True) as server:
        command = [
            "loadtest", "--url", server.base_url,
            "--graph", str(graph_path), "--database-url", url, "--duration", "0.5",
            "--warmup", "0", "--concurrency", "2", "--phases", "healthz,fresh", "--driver", "httpx",
        ]  # fmt: skip
        spent_run = run_cli([*command, "--key", key], timeout=300)
        unknown_run = run_cli([*command, "--key", "ppr_not_a_key"], timeout=300)
    assert spent_run.returncode == 1, spent_run.stderr
    assert "answers by status:" in spent_run.stdout
    (fresh,) = [line for line in spent_run.stdout.splitlines() if line.strip().startswith("fresh:")]
    assert "403 x" in fresh and "403 budget_exhausted" in fresh
    assert "CPU per request over each phase (from /proc):" in spent_run.stdout
    assert "  fresh phase: server " in spent_run.stdout
    assert "error [key_refused]: the key was refused in the fresh phase: 403 budget_exhausted" in (
        spent_run.stderr
    )
    assert unknown_run.returncode == 2
    assert "error [key_refused]: the key was refused: GET /v1/me/budget answered 401" in (
        unknown_run.stderr
    )
