"""``serve --workers 2`` outlives its database: on a PostgreSQL of its own (started here in a
temporary directory and stopped at will; never the shared one), a worker killed during an
outage longer than PPR_LEDGER_CONNECT_TIMEOUT_SECONDS is replaced, its replacement answers 503
``ledger_unavailable`` while the outage lasts, and the same server answers again when the
database returns. A failure that is not an outage stops the server with a non-zero status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from service.loadtest.soak import worker_pids
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    Server,
    bearer,
    free_port,
    user_with_key,
    uvicorn_server,
)
from tests.connection_support import new_connection_each
from tests.own_postgres import OwnPostgres, can_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_run(), reason="needs PostgreSQL binaries and root (runuser)"),
]

#: Bound on every wait for the server to reach a state (never a timing assertion).
WAIT_SECONDS = 120.0


@pytest.fixture
def graph_path(tmp_path: Path) -> Path:
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    return path


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    pg = OwnPostgres(free_port())
    pg.init()
    try:
        yield pg
    finally:
        pg.destroy()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_SECONDS:g} s: {what}")
        time.sleep(0.2)


def messages(server: Server, text: str) -> list[int]:
    """The pids of the log lines whose message contains ``text``."""
    return [int(line["pid"]) for line in server.log_lines() if text in str(line.get("message"))]


#: Opens a new connection for every request.
_FRESH = new_connection_each(timeout=30)


def ask(server: Server, path: str, key: str | None = None) -> httpx.Response:
    """One request on a new connection (so the kernel may hand it to either worker)."""
    headers = bearer(key) if key is not None else {}
    return _FRESH.get(f"{server.base_url}{path}", headers=headers)


def test_the_server_outlives_a_database_outage_with_a_worker_killed_during_it(
    own_postgres: OwnPostgres, graph_path: Path
) -> None:
    url = own_postgres.create_database("ledger")
    upgrade(url)
    _, key = user_with_key(url, "17", cap_epsilon=10.0)
    backend = Backend("own-postgres", url, None, graph_path)
    env = {"PPR_LEDGER_CONNECT_TIMEOUT_SECONDS": "1", "PPR_RECONCILE_INTERVAL_SECONDS": "0"}
    query = "/v1/ppr/17?k=5&fresh=true"  # fresh: always admitted by the ledger, never a replay
    with uvicorn_server(backend, workers=2, extra_env=env, forked=True) as server:
        assert ask(server, query, key).status_code == 200
        before = worker_pids(server.pid)
        assert len(before) == 2

        own_postgres.stop()
        lost = ask(server, query, key)
        assert lost.status_code == 503 and lost.json()["error"]["code"] == "ledger_unavailable"
        os.kill(before[0], signal.SIGKILL)

        # The replacement waits PPR_LEDGER_CONNECT_TIMEOUT_SECONDS, then serves without the
        # ledger (and keeps connecting); uvicorn's supervisor keeps running.
        def replaced() -> bool:
            pids = worker_pids(server.pid)
            return len(pids) == 2 and before[0] not in pids

        wait_until(replaced, "a replacement worker")
        (replacement,) = set(worker_pids(server.pid)) - set(before)
        wait_until(
            lambda: replacement in messages(server, "serving 503 ledger_unavailable"),
            "the replacement serving during the outage",
        )
        for _ in range(8):  # new connections: both workers answer, neither is ready
            assert ask(server, "/healthz").status_code == 200
            assert ask(server, "/readyz").status_code == 503
            refused = ask(server, query, key)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "ledger_unavailable"
            assert refused.headers["retry-after"]
        assert os.path.exists(f"/proc/{server.pid}"), "the supervisor must not exit"

        def refused_by_replacement() -> bool:
            assert ask(server, query, key).status_code == 503
            return any(
                int(line["pid"]) == replacement and line.get("status") == 503
                for line in server.log_lines()
                if line.get("route") == "/v1/ppr/{node_id}"
            )

        wait_until(refused_by_replacement, "a 503 from the replacement during the outage")

        own_postgres.start()
        wait_until(
            lambda: replacement in messages(server, "the ledger database answers again"),
            "the replacement reaching the ledger again",
        )

        def answered_by_replacement() -> bool:
            if ask(server, query, key).status_code != 200:
                return False
            return any(
                int(line["pid"]) == replacement and line.get("status") == 200
                for line in server.log_lines()
                if line.get("route") == "/v1/ppr/{node_id}"
            )

        wait_until(answered_by_replacement, "an answer from the replacement worker")
        for _ in range(6):
            assert ask(server, "/readyz").status_code == 200
            assert ask(server, query, key).status_code == 200
        assert sorted(worker_pids(server.pid)) == sorted([before[1], replacement])


def test_a_real_failure_after_an_outage_stops_the_server_with_a_non_zero_status(
    own_postgres: OwnPostgres, graph_path: Path, tmp_path: Path
) -> None:
    """The database does not exist when the server starts (an outage: the server starts and
    answers 503); it then appears un-migrated (a real failure): the server stops, non-zero."""
    url = own_postgres.url("later")
    env = {
        **os.environ,
        "PPR_GRAPH_PATH": str(graph_path),
        "PPR_DATABASE_URL": url,
        "PPR_STEPS": "30",
        "PPR_GRAPH_SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        "PPR_PREFIX_TABLE_BYTES": "0",
        "PPR_LEDGER_CONNECT_TIMEOUT_SECONDS": "0.5",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = tmp_path / "server.log"
    for attempt in range(3):
        proc, server = _serve_on_a_free_port(env, log_path)
        try:
            _wait_for_both_workers_without_ledger(proc, server, log_path)
            break
        except _PortTaken:
            assert attempt < 2, log_path.read_text()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    try:
        assert ask(server, "/healthz").status_code == 200
        assert ask(server, "/readyz").status_code == 503
        refused = ask(server, "/v1/ppr/1", "ppr_" + "x" * 30)
        assert refused.json()["error"]["code"] == "ledger_unavailable"
        assert proc.poll() is None

        own_postgres.create_database("later")  # reachable now, but not migrated
        returncode = proc.wait(timeout=WAIT_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert returncode != 0, log
    assert "the runtime cannot be built" in log
    assert "failed to start" in log


class _PortTaken(Exception):
    """The port :func:`free_port` chose was bound by another process before the server."""


def _serve_on_a_free_port(
    env: dict[str, str], log_path: Path
) -> tuple[subprocess.Popen[bytes], Server]:
    port = free_port()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(port), "--workers", "2"],
            env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, Server(f"http://127.0.0.1:{port}", log_path, proc.pid)


def _still_running(proc: subprocess.Popen[bytes], log_path: Path) -> bool:
    """True while the server runs; raises when it has stopped: :class:`_PortTaken` when its
    port was taken in between (it is started again on another), else with its log."""
    if proc.poll() is None:
        return True
    log = log_path.read_text()
    if "Address already in use" in log:
        raise _PortTaken(log)
    raise AssertionError(f"the server stopped before both workers served:\n{log}")


def _wait_for_both_workers_without_ledger(
    proc: subprocess.Popen[bytes], server: Server, log_path: Path
) -> None:
    wait_until(
        lambda: (
            _still_running(proc, log_path)
            and len(set(messages(server, "serving 503 ledger_unavailable"))) == 2
            and _answers(server)
        ),
        "both workers serving without their ledger",
    )


def _answers(server: Server) -> bool:
    """Whether the server answers ``/healthz``: a worker logs that it serves without its ledger
    just before it listens, so on a busy machine a request can come in between and be
    refused."""
    try:
        return ask(server, "/healthz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("when", ["after_the_revision_check", "after_the_ledger_opened"])
def test_a_worker_whose_database_stops_while_it_starts_serves_when_it_returns(
    own_postgres: OwnPostgres,
    graph_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """The database stops at a point of a worker's start-up after it first answered: between
    reading the ledger's revision and its order grid, or once the ledger is open and before
    the graph's public version id is recorded. Both are outages: the worker starts without
    its runtime (503 ledger_unavailable), keeps connecting, and builds it, with the graph's
    version recorded, once the database is back. Before, the first was reported as an
    un-migrated ledger, a real failure that stopped the worker (and the server with it).

    The real database is stopped at that point by wrapping the function that ends it."""
    from service.api import runtime as runtime_module
    from service.config import Settings
    from service.ledger import database

    url = own_postgres.create_database("ledger")
    upgrade(url)
    stopped: list[str] = []

    def stop_once() -> None:
        if not stopped:
            own_postgres.stop()
            stopped.append(when)

    if when == "after_the_revision_check":
        check_grid = database.check_grid

        def stop_then_check_grid(engine: Any) -> None:
            stop_once()
            check_grid(engine)

        monkeypatch.setattr(database, "check_grid", stop_then_check_grid)
    else:
        open_ledger = runtime_module.open_ledger

        def open_then_stop(*args: Any, **kwargs: Any) -> Any:
            ledger = open_ledger(*args, **kwargs)
            stop_once()
            return ledger

        monkeypatch.setattr(runtime_module, "open_ledger", open_then_stop)
    settings = Settings(
        database_url=url, graph_path=graph_path, steps=30, prefix_table_bytes=0,
        graph_snapshot_dir=tmp_path / "snapshots", ledger_connect_timeout_seconds=0.5,
    )  # fmt: skip
    ready: list[Any] = []
    failures: list[BaseException] = []
    starter = runtime_module.RuntimeStarter(
        settings, on_ready=ready.append, on_failure=failures.append
    )
    runtime = None
    try:
        assert starter.start() is None, "the worker should start without its runtime"
        assert stopped == [when] and not failures
        own_postgres.start()
        wait_until(lambda: bool(ready or failures), "the runtime built once the database is back")
        assert not failures, failures
        runtime = ready[0]
        served = runtime.graphs.current.version
        assert runtime.ledger.graph_versions.current_graph_version() == served
    finally:
        starter.stop()
        if runtime is not None:
            runtime.close()
