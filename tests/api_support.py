"""Running the real app against a real ledger database (SQLite file or PostgreSQL) and cache
(in-process or Redis) for the API tests, in-process (ASGI) or as a uvicorn server."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import Settings
from service.ledger.ledger import Ledger
from service.loadtest.server import wait_until_serving
from tests.cli_runner_support import ForkedProcess
from tests.cli_runner_support import shared as shared_runner
from tests.connection_support import new_connection_each

#: A small deterministic graph keeps the API tests fast; answers still use the full engine.
GRAPH_NODES = 400
GRAPH_EDGES = 2400


@dataclass
class Backend:
    """Where the ledger and cache of one test live."""

    name: str
    database_url: str
    redis_url: str | None
    graph_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "graph_path": self.graph_path,
            "database_url": self.database_url,
            "redis_url": self.redis_url,
            "steps": 30,
            "default_cap_epsilon": 1.0,
            # the tests written for the diffusion check its curves; tests of the other rankings
            # (and of the service's real default) override this
            "default_mechanism": "noisy_diffusion",
            # the machine-wide prefix table is built in the background: tests of it turn it on
            # (tests/test_prefix_table.py), the others answer the same way whenever it is ready
            "prefix_table_bytes": 0,
            **overrides,
        }
        return Settings(**values)


@contextmanager
def running_app(backend: Backend, **overrides: Any) -> Iterator[TestClient]:
    """The app with its lifespan (ledger opened, graph loaded) behind an HTTP test client."""
    app = create_app(backend.settings(**overrides), configure_logs=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def ledger_of(client: TestClient) -> Ledger:
    ledger: Ledger = client.app.state.runtime.ledger  # type: ignore[attr-defined]
    return ledger


@contextmanager
def open_ledger(database_url: str) -> Iterator[Ledger]:
    """The ledger at ``database_url`` outside any app, closed afterwards."""
    ledger = Ledger.from_url(database_url)
    try:
        yield ledger
    finally:
        ledger.dispose()


def user_with_key(database_url: str, node: str, *, cap_epsilon: float = 1.0) -> tuple[int, str]:
    """A user account for ``node`` (delta 1e-6) and its API key, made directly in the ledger."""
    with open_ledger(database_url) as ledger:
        user = ledger.accounts.create_account(
            "user", node_id=node, cap_epsilon=cap_epsilon, delta=1e-6
        )
        key, _ = ledger.api_keys.create_api_key(user.account_id)
    return user.account_id, key


def database_goes_away_then(admin: Engine, name: str | None, real: Callable[..., Any]) -> Any:
    """``real``, called only once PostgreSQL database ``name`` refuses new connections and its
    open ones are terminated (through ``admin``, an AUTOCOMMIT engine on another database): the
    database goes away just before ``real`` runs. Connections are allowed again by
    ``ALTER DATABASE ... ALLOW_CONNECTIONS true``."""

    def after_the_database_went_away(*args: Any, **kwargs: Any) -> Any:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        return real(*args, **kwargs)

    return after_the_database_went_away


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    base_url: str
    log_path: Path
    pid: int = 0  # the ``serve`` process (uvicorn's supervisor with several workers)

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines the server wrote so far (non-JSON lines skipped)."""
        lines = []
        for raw in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue
        return lines


def wait_for(
    check: Callable[[], bool], what: str, seconds: float = 120.0, every: float = 0.1
) -> None:
    """Until ``check()`` holds, looking every ``every`` seconds; fails naming ``what`` after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(every)


def wait_until_ready(
    process: subprocess.Popen[bytes], base_url: str, log: Path, *, seconds: float
) -> None:
    """Until ``process`` (a server writing to ``log``) answers ``/readyz`` with 200 at
    ``base_url``; fails with the log's end if it exits or is not ready within ``seconds``."""
    deadline = time.monotonic() + seconds
    with new_connection_each(base_url, timeout=2) as http:
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            try:
                if http.get("/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)


def _healthz_pids(server: Server) -> set[int]:
    return {int(line["pid"]) for line in server.log_lines() if line.get("route") == "/healthz"}


@contextmanager
def uvicorn_server(
    backend: Backend, *, workers: int = 1, extra_env: dict[str, str] | None = None,
    forked: bool = False,
) -> Iterator[Server]:  # fmt: skip
    """``python -m service serve`` in a subprocess; yields once every worker is ready.

    ``forked``: the ``serve`` process is forked from a process that has imported the service
    (tests/cli_runner_support.py), not a new interpreter: 1.5 of a start's 2.6 CPU-s saved,
    for tests whose subject is what the server answers, not how its process starts."""
    port = free_port()
    env = {
        **os.environ,
        "PPR_GRAPH_PATH": str(backend.graph_path),
        "PPR_DATABASE_URL": backend.database_url,
        "PPR_STEPS": "30",
        "PPR_LOG_LEVEL": "info",
        "PPR_DEFAULT_MECHANISM": "noisy_diffusion",
        "PPR_GRAPH_SNAPSHOT_DIR": str(backend.graph_path.parent / "graph-snapshots"),
        "PPR_PREFIX_TABLE_BYTES": "0",  # as in Backend.settings
        **({"PPR_REDIS_URL": backend.redis_url} if backend.redis_url else {}),
        **(extra_env or {}),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = backend.graph_path.parent / f"server-{port}.log"
    argv = ["serve", "--port", str(port), "--workers", str(workers)]
    proc: subprocess.Popen[bytes] | ForkedProcess
    if forked:
        proc = shared_runner().start(
            argv, env=env, cwd=Path.cwd(), stdout=log_path, stderr=log_path, server=True
        )
    else:
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service", *argv],
                env=env, stdout=log_file, stderr=subprocess.STDOUT,
            )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", log_path, proc.pid)
    try:
        deadline = time.monotonic() + 120
        # one client for the polls (building one per poll took ~25 ms of CPU, its TLS context)
        with new_connection_each(server.base_url, timeout=2) as http:
            wait_until_serving(proc, http, log_path, workers, 120)
            # Every worker has finished starting once each has answered a request of its own
            # (a new connection each time, so the kernel can hand it to any worker).
            while len(_healthz_pids(server)) < workers and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    http.get("/healthz")
                time.sleep(0.02)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
