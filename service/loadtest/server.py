"""Starting ``python -m service serve`` for a run, and an account to load it with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from service.errors import ServiceError
from service.loadtest.run import KeyRefused


def _graph_loaded_lines(log_path: Path) -> int:
    count = 0
    for raw in log_path.read_text(errors="replace").splitlines():
        try:
            if json.loads(raw).get("message") == "graph loaded":
                count += 1
        except ValueError:
            continue
    return count


#: How long the check before a start waits for the ledger's database to answer.
DATABASE_CHECK_SECONDS = 5


def check_database(database_url: str) -> None:
    """Refuse at once, with the driver's reason, a ledger database that does not answer: a
    server started on it would keep reconnecting in the background with ``/readyz`` at 503,
    and the run would only fail when its wait for the server ran out, minutes later."""
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    from service.ledger.transactions import LedgerUnavailable

    url = make_url(database_url)
    timeout = {"connect_timeout": DATABASE_CHECK_SECONDS}
    engine = create_engine(
        url,
        poolclass=NullPool,
        connect_args=timeout if url.get_backend_name() == "postgresql" else {},
    )
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        shown = url.render_as_string(hide_password=True)
        raise LedgerUnavailable(
            f"the ledger database {shown} does not answer ({reason}); start it, create the "
            "database, or give another --database-url",
            details={"database_url": shown},
        ) from None
    finally:
        engine.dispose()


def wait_until_serving(
    proc: subprocess.Popen[bytes],
    http: httpx.Client,
    log_path: Path,
    workers: int,
    timeout_s: float,
) -> None:
    """Until each of ``workers`` has logged that its graph is loaded (in ``log_path``) and
    ``/readyz`` answers 200 through ``http`` (a client whose base URL is the server's); a
    ``ServiceError`` with the log's end if the process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-4000:]
            raise ServiceError(f"the server exited with status {proc.returncode}:\n{tail}")
        if _graph_loaded_lines(log_path) >= workers:
            try:
                if http.get("/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-4000:]
            raise ServiceError(f"the server was not ready in {timeout_s:.0f} s:\n{tail}")
        time.sleep(0.2)


@contextmanager
def served(
    *,
    port: int,
    workers: int,
    graph: Path | None,
    database_url: str,
    redis_url: str | None,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    ready_timeout_s: float = 180.0,
) -> Iterator[str]:
    """``serve`` on 127.0.0.1:``port`` (migrating the ledger first); yields its base URL once
    every worker has loaded the graph, and stops it afterwards."""
    with served_process(
        port=port, workers=workers, graph=graph, database_url=database_url,
        redis_url=redis_url, log_path=log_path, extra_env=extra_env,
        ready_timeout_s=ready_timeout_s,
    ) as (base_url, _):  # fmt: skip
        yield base_url


@contextmanager
def served_process(
    *,
    port: int,
    workers: int,
    graph: Path | None,
    database_url: str,
    redis_url: str | None,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    ready_timeout_s: float = 180.0,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """As ``served``, yielding the server's process too (its children are the workers). A
    ledger database that does not answer is refused before the server starts
    (:func:`check_database`)."""
    check_database(database_url)
    command = [
        sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--workers", str(workers), "--database-url", database_url, "--auto-migrate",
    ]  # fmt: skip
    if graph is not None:
        command += ["--graph", str(graph)]
    if redis_url:
        command += ["--redis-url", redis_url]
    env = {**os.environ, "PPR_LOG_LEVEL": "info", **(extra_env or {})}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=base_url, timeout=2) as http:
            wait_until_serving(proc, http, log_path, workers, ready_timeout_s)
        yield base_url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def admin_key(database_url: str) -> str:
    """A new admin account's API key (to read the readiness checks of a server the run
    started), made in the ledger directly."""
    from service.ledger.ledger import Ledger

    ledger = Ledger.from_url(database_url)
    try:
        account = ledger.accounts.create_account(
            "admin", cap_epsilon=1.0, delta=1e-6, label="loadtest"
        )
        key, _ = ledger.api_keys.create_api_key(account.account_id)
    finally:
        ledger.dispose()
    return key


def wait_for_prefix_table(
    base_url: str, key: str, *, workers: int, timeout_s: float, say: Callable[[str], None]
) -> str:
    """Wait (at most ``timeout_s``) while the server builds its prefix table, so that fresh
    queries are measured in the steady state; the table's last status. Done when
    ``2 x workers`` answers in a row (each on a new connection, so every worker is asked and
    maps it) say ready, or one says there is none to wait for."""
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    told = False
    in_a_row = 0
    status = "unknown"
    while True:
        try:
            body = httpx.get(f"{base_url}/readyz", headers={"Authorization": f"Bearer {key}"},
                             timeout=10).json()  # fmt: skip
            table = body.get("checks", {}).get("prefix_table", {})
            status = str(table.get("status", "off"))
        except (httpx.HTTPError, ValueError):
            table, status = {}, "unknown"
        if status in ("off", "absent"):
            return status
        in_a_row = in_a_row + 1 if status == "ready" else 0
        if in_a_row >= 2 * workers:
            if told:
                say(f"prefix table ready after {time.monotonic() - started:.1f} s")
            return status
        if not told and status == "building":
            total = sum(int(t.get("bytes", 0)) for t in table.get("tables", ()))
            say(f"waiting up to {timeout_s:.0f} s for the server's prefix table "
                f"({total / 2**20:,.0f} MiB, being built or mapped) ...")  # fmt: skip
            told = True
        if time.monotonic() > deadline:
            say(f"the prefix table is still {status} after {timeout_s:.0f} s; measuring anyway")
            return status
        time.sleep(0.1 if status == "ready" else 0.5)


def service_account_key(
    database_url: str, *, delta: float, cap_epsilon: float = 1e6, personalized: bool = False
) -> str:
    """A new service account (edge mode, a cap no load run reaches) and its API key, made in
    the ledger directly (the run names the ledger it loads). ``personalized``: the account may
    also query in personalized mode, charging the seed users' accounts, which it may create
    (the server must allow that too: ``PPR_CREATE_SEED_ACCOUNTS``), under a quota no run
    reaches."""
    from service.ledger.ledger import Ledger

    scopes: dict[str, Any] = {}
    if personalized:
        scopes = {
            "modes": ("edge", "personalized"),
            "may_create_seed_accounts": True,
            "quota_epsilon": cap_epsilon,
        }
    ledger = Ledger.from_url(database_url)
    try:
        account = ledger.accounts.create_account(
            "service", cap_epsilon=cap_epsilon, delta=delta, label="loadtest", **scopes
        )
        key, _ = ledger.api_keys.create_api_key(account.account_id)
    finally:
        ledger.dispose()
    return key


def check_key(base_url: str, key: str, *, say: Callable[[str], None]) -> None:
    """Before the load: the key is accepted, and how much budget its account has left."""
    try:
        response = httpx.get(
            f"{base_url}/v1/me/budget", headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
    except httpx.HTTPError as exc:
        raise ServiceError(f"cannot reach {base_url}: {exc}") from exc
    if response.status_code != 200:
        try:
            code = str(response.json()["error"]["code"])
        except (ValueError, KeyError, TypeError):
            code = "-"
        raise KeyRefused(
            f"the key was refused: GET /v1/me/budget answered {response.status_code} {code}; "
            "give --key of a service account (accounts create --type service --cap 1000)"
        )
    budget = response.json()
    say(
        f"key: account {budget.get('account_id')}, remaining epsilon "
        f"{float(budget.get('remaining_epsilon', 0.0)):g} of its cap "
        f"{float(budget.get('cap_epsilon', 0.0)):g} (every fresh query charges it)"
    )
