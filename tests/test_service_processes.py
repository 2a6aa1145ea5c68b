"""The service as it runs in production: uvicorn worker processes, a shared PostgreSQL ledger,
a Redis that can fail; and the start-up checks of ``python -m service serve``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from service.ledger.budget_rule import fits_under_cap
from service.loadtest.soak import worker_pids
from service.mechanisms.charges import count_release
from service.mechanisms.registry import RankingMechanism
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    Server,
    bearer,
    free_port,
    ledger_of,
    open_ledger,
    running_app,
    user_with_key,
    uvicorn_server,
    wait_for,
)
from tests.connection_support import new_connection_each
from tests.ledger_support import independent_laplace_epsilon
from tests.test_api import REDIS_URL, forget_cached_keys, redis_answers


@pytest.fixture
def graph_path(tmp_path: Path) -> Path:
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    return path


@pytest.mark.postgres
@pytest.mark.slow
def test_fifty_concurrent_queries_on_two_workers_never_pass_the_cap(
    postgres_url: str, graph_path: Path
) -> None:
    upgrade(postgres_url)
    backend = Backend("postgres", postgres_url, None, graph_path)
    account_id, key = user_with_key(postgres_url, "17")
    one = plan_diffusion(0.1, 1e-6, 30, 0.8, 1e-7, Mode.PERSONALIZED).curve
    fits = max(q for q in range(1, 200) if (one * q).epsilon(1e-6) <= 1.0)
    assert fits < 50  # the cap, not the number of requests, decides

    tmp = graph_path.parent / "tmp"
    tmp.mkdir()
    with uvicorn_server(backend, workers=2, extra_env={"TMPDIR": str(tmp)}, forked=True) as server:
        assert [p.name[:12] for p in tmp.iterdir()] == ["ppr-metrics-"]

        def ask(i: int) -> httpx.Response:  # a new connection each
            return fresh.get("/v1/ppr/17", params={"fresh": "true", "k": 5}, headers=bearer(key))

        with new_connection_each(server.base_url) as fresh, ThreadPoolExecutor(50) as pool:
            responses = list(pool.map(ask, range(50)))
        log = server.log_lines()

    statuses = [r.status_code for r in responses]
    answered = [r.json() for r in responses if r.status_code == 200]
    refused = [r.json() for r in responses if r.status_code != 200]
    assert set(statuses) <= {200, 403}
    assert all(e["error"]["code"] == "budget_exhausted" for e in refused)
    assert len(answered) == fits

    with open_ledger(postgres_url) as ledger:
        budget = ledger.budgets.budget(account_id)
        charges = ledger.reports.list_charges(account_id, limit=1000)
    assert len(charges) == budget.charges == len(answered)
    assert budget.spent_epsilon <= budget.cap_epsilon
    assert budget.spent_epsilon == pytest.approx((one * fits).epsilon(1e-6))
    assert {c.request_id for c in charges} == {a["request_id"] for a in answered}
    served_by = {line["pid"] for line in log if line.get("route") == "/v1/ppr/{node_id}"}
    assert len(served_by) >= 2, "both worker processes should have answered"
    assert list(tmp.iterdir()) == [], "the workers' metrics directory is removed on exit"


@pytest.mark.postgres
@pytest.mark.slow
def test_two_workers_never_pass_a_daily_cap(postgres_url: str, graph_path: Path) -> None:
    """A user with a daily cap of 0.1 asks 24 fresh answers at once through two workers on
    PostgreSQL + Redis: exactly as many as fit in the day are answered, the others are refused
    with the reset time and a Retry-After, the period's figure is under its cap and ledger
    verify passes. Then, while more are asked, the worker storing an admitted charge's release is
    SIGKILLed before that release commits, and the next day the user is answered again by the
    same server (below)."""
    if not redis_answers():
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    upgrade(postgres_url)
    backend = Backend("postgres+redis", postgres_url, REDIS_URL, graph_path)
    account_id, key = user_with_key(postgres_url, "18", cap_epsilon=5.0)
    with open_ledger(postgres_url) as ledger:
        ledger.budgets.set_period(account_id, period="day", period_cap_epsilon=0.1)
    one = count_release(RankingMechanism.COMMON_NEIGHBOURS, 0.03).curve
    fits = max(q for q in range(1, 50) if fits_under_cap((one * q).epsilon(1e-6), 0.1))
    assert fits == 3
    params = {"fresh": "true", "k": 5, "epsilon": 0.03, "mechanism": "common_neighbours"}
    with (
        uvicorn_server(backend, workers=2, forked=True) as server,
        new_connection_each(server.base_url) as fresh,
    ):

        def ask(i: int) -> httpx.Response:  # a new connection each
            return fresh.get("/v1/ppr/18", params=params, headers=bearer(key))

        with ThreadPoolExecutor(max_workers=24) as pool:
            responses = list(pool.map(ask, range(24)))
        log = server.log_lines()
        answered = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code != 200]
        assert len(answered) == fits and {r.status_code for r in refused} == {403}
        for response in refused:
            error = response.json()["error"]
            assert error["code"] == "budget_exhausted" and error["details"]["cap"] == "period_cap"
            assert error["details"]["resets_at"].endswith("T00:00:00+00:00")
            assert 0 < int(response.headers["Retry-After"]) <= 86_400
        with open_ledger(postgres_url) as ledger:
            budget = ledger.budgets.budget(account_id)
            report = ledger.reports.verify()
        assert budget.period is not None and budget.charges == fits
        assert budget.period.period_spent_epsilon == pytest.approx((one * fits).epsilon(1e-6))
        assert budget.period.period_spent_epsilon <= 0.1
        assert report.ok, report.mismatches
        served_by = {line["pid"] for line in log if line.get("route") == "/v1/ppr/{node_id}"}
        assert len(served_by) >= 2, "both worker processes should have answered"
        _a_worker_killed_while_asked(postgres_url, account_id, server, ask)
        _answered_again_after_the_reset(postgres_url, account_id, ask)
    forget_cached_keys(postgres_url, REDIS_URL)


def _a_worker_killed_while_asked(
    postgres_url: str, account_id: int, server: Server, ask: Callable[[int], httpx.Response]
) -> None:
    """With room for more in the day (its cap raised to 0.2) and 24 requests in flight, the
    worker storing the release of an admitted charge is SIGKILLed before that release commits,
    every time. The test holds the ``releases`` table locked (SHARE: reads go on, inserts wait)
    until a worker's ledger session waits on it: that worker has admitted a charge, drawn its
    answer and is storing its release in a statement that cannot complete. The worker is
    found by the client port of that session (every worker if it has none: a Unix socket),
    killed, its database session ended, and the lock is let go only then; its store rolls
    back, so its charge stays admitted, while the other worker stores and answers its own.
    Then the day's live charges (admitted ones included: nothing is given back on a guess) are
    under the cap, every answer has its released charge, at least one charge is left admitted,
    the reconciler refunds exactly those, ledger verify passes, and uvicorn's supervisor forks a
    worker in place of the dead one."""
    with open_ledger(postgres_url) as ledger:
        ledger.budgets.set_period(account_id, period="day", period_cap_epsilon=0.2)
        # the lock goes first on the way out: the requests it holds are then answered
        with ThreadPoolExecutor(max_workers=24) as pool, ledger.engine.connect() as lock:
            lock.execute(text("LOCK TABLE releases IN SHARE MODE"))  # until lock.rollback()
            futures = [pool.submit(_or_lost, ask, i) for i in range(24)]
            port, session = _session_storing_a_release(ledger.engine)
            workers = worker_pids(server.pid)
            victims = [p for p in workers if _has_client_port(p, port)] or workers
            for pid in victims:  # [all workers] only where the connection is not TCP
                os.kill(pid, signal.SIGKILL)
            for pid in victims:
                _wait_gone(pid)
            # The database drops the dead worker's session, as PostgreSQL does once it sees
            # the client gone (client_connection_check_interval, TCP keepalives). Left
            # running, its store (one statement on PostgreSQL) would complete when the lock
            # goes: the release stored and its charge released, replayable, nothing lost.
            with ledger.engine.connect() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": session})
            lock.rollback()
            responses = [future.result() for future in futures]
        answered = {
            r.json()["request_id"] for r in responses if r is not None and r.status_code == 200
        }
        during = ledger.budgets.budget(account_id)
        charges = ledger.reports.list_charges(account_id, limit=1000)
        left = {c.charge_id for c in charges if c.state == "admitted"}
        assert left, "the kill left no charge admitted"
        assert during.period is not None and during.period.period_spent_epsilon <= 0.2
        assert answered <= {c.request_id for c in charges if c.state == "released"}
        assert set(ledger.settlement.reconcile(older_than_seconds=0.0)) == left
        report = ledger.reports.verify()
    assert report.ok, report.mismatches
    _wait_replaced(server, victims)


def _or_lost(ask: Callable[[int], httpx.Response], i: int) -> httpx.Response | None:
    try:
        return ask(i)
    except httpx.HTTPError:
        return None  # the connection died with its worker


def _session_storing_a_release(engine: Engine) -> tuple[int, int]:
    """The client port (-1 over a Unix socket) and the server pid of the first ledger session
    of this database found waiting for the ``releases`` table's lock."""
    deadline = time.monotonic() + 30
    with engine.connect() as conn:
        while True:
            row = conn.execute(
                text(
                    "SELECT coalesce(a.client_port, -1), a.pid FROM pg_locks l "
                    "JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE a.datname = current_database() AND l.locktype = 'relation' "
                    "AND l.relation = 'releases'::regclass AND NOT l.granted LIMIT 1"
                )
            ).first()
            conn.rollback()  # a new snapshot of pg_stat_activity each time
            if row is not None:
                return int(row[0]), int(row[1])
            assert time.monotonic() < deadline, "no worker came to store a release"
            time.sleep(0.005)


def _has_client_port(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the TCP socket whose local port is ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) in inodes:
                return True
    return False


def _wait_gone(pid: int) -> None:
    """Until process ``pid`` runs no more: exited (a zombie: its sockets closed) or reaped."""

    def gone() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")

    wait_for(gone, f"process {pid} gone after SIGKILL", seconds=30, every=0.005)


def _wait_replaced(server: Server, dead: list[int]) -> None:
    """Until uvicorn's supervisor has forked a worker in place of each of ``dead`` (it looks
    for dead workers every 0.5 s)."""

    def replaced() -> bool:
        workers = worker_pids(server.pid)
        return len(workers) >= 2 and not set(workers) & set(dead)

    wait_for(replaced, f"a worker in place of {dead}", seconds=30, every=0.02)


def _answered_again_after_the_reset(
    postgres_url: str, account_id: int, ask: Callable[[int], httpx.Response]
) -> None:
    """The next day the same server answers the user again. The day passes in the ledger, the
    one clock admission reads (the database's): every charge of the account moves back one
    day, its created_at and period_start together, as if admitted yesterday. Of 24 concurrent
    asks exactly as many as fit in a fresh day (cap 0.2) are answered, the rest refused with
    the period cap; the lifetime figure keeps every live charge of both days, grows, and equals
    their independent (dp_accounting) composition; ledger verify passes."""
    with open_ledger(postgres_url) as ledger:
        with ledger.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE charges SET created_at = created_at - interval '1 day', "
                    "period_start = period_start - interval '1 day' "
                    "WHERE charged_account_id = :account"
                ),
                {"account": account_id},
            )
        yesterday = ledger.budgets.budget(account_id)
    assert yesterday.period is not None and yesterday.period.period_spent_epsilon == 0.0
    one = count_release(RankingMechanism.COMMON_NEIGHBOURS, 0.03).curve
    fits = max(q for q in range(1, 50) if fits_under_cap((one * q).epsilon(1e-6), 0.2))
    with ThreadPoolExecutor(max_workers=24) as pool:
        responses = list(pool.map(ask, range(24)))
    refused = [r for r in responses if r.status_code != 200]
    assert len(responses) - len(refused) == fits, [r.text for r in refused]
    assert {r.json()["error"]["details"]["cap"] for r in refused} == {"period_cap"}
    with open_ledger(postgres_url) as ledger:
        today = ledger.budgets.budget(account_id)
        live = [c for c in ledger.reports.list_charges(account_id, limit=1000) if not c.refunded]
        report = ledger.reports.verify()
    assert today.period is not None
    assert today.period.period_spent_epsilon == pytest.approx((one * fits).epsilon(1e-6))
    assert today.spent_epsilon > yesterday.spent_epsilon
    assert today.spent_epsilon == pytest.approx(
        independent_laplace_epsilon(0.03, len(live), today.delta), rel=1e-6
    )
    assert report.ok, report.mismatches


def test_serve_refuses_an_unmigrated_database(tmp_path: Path, graph_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--graph", str(graph_path),
         "--database-url", url, "--port", str(free_port())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "python -m service db upgrade" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_rejects_a_missing_graph_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--graph", str(tmp_path / "nope.txt")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "nope.txt" in proc.stderr and "Traceback" not in proc.stderr


def test_a_dead_redis_degrades_but_never_stops_answers(tmp_path: Path, graph_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    backend = Backend("sqlite+dead-redis", url, dead_redis, graph_path)
    with running_app(backend) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        ledger = ledger_of(client)
        user = ledger.accounts.create_account("user", node_id="8", cap_epsilon=1.0, delta=1e-6)
        key, _ = ledger.api_keys.create_api_key(user.account_id)
        first = client.get("/v1/ppr/8", headers=bearer(key))
        assert first.status_code == 200 and first.json()["replayed"] is False
        replay = client.get("/v1/ppr/8", headers=bearer(key))
        assert replay.status_code == 200 and replay.json()["replayed"] is True
        assert replay.json()["results"] == first.json()["results"]
        assert ledger.budgets.budget(user.account_id).charges == 1


@pytest.mark.postgres
@pytest.mark.slow
def test_concurrent_retries_with_one_idempotency_key_charge_once(
    postgres_url: str, graph_path: Path
) -> None:
    upgrade(postgres_url)
    backend = Backend("postgres", postgres_url, None, graph_path)
    account_id, key = user_with_key(postgres_url, "23")
    headers = {**bearer(key), "Idempotency-Key": "checkout-7"}

    tmp = graph_path.parent / "tmp"
    tmp.mkdir()
    with uvicorn_server(backend, workers=2, extra_env={"TMPDIR": str(tmp)}, forked=True) as server:
        assert [p.name[:12] for p in tmp.iterdir()] == ["ppr-metrics-"]

        def ask(i: int) -> httpx.Response:  # a new connection each
            return fresh.get("/v1/ppr/23", params={"fresh": "true", "k": 5}, headers=headers)

        with new_connection_each(server.base_url) as fresh, ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(ask, range(12)))
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            settled = http.get("/v1/ppr/23", params={"fresh": "true", "k": 5}, headers=headers)

    ok = [r.json() for r in responses if r.status_code == 200]
    busy = [r.json() for r in responses if r.status_code == 409]
    assert len(ok) + len(busy) == len(responses)
    assert all(b["error"]["code"] == "request_in_progress" for b in busy)
    assert sum(1 for a in ok if not a["replayed"]) == 1
    assert len({str(a["results"]) for a in ok}) == 1
    assert settled.status_code == 200 and settled.json()["replayed"] is True
    assert settled.json()["results"] == ok[0]["results"]
    with open_ledger(postgres_url) as ledger:
        assert ledger.budgets.budget(account_id).charges == 1
        assert len(ledger.reports.list_charges(account_id)) == 1


@pytest.mark.postgres
def test_a_lost_database_is_503_and_the_process_keeps_serving(
    postgres_url: str, graph_path: Path
) -> None:
    """The ledger's database disappears under a running service (dropped with its
    connections): queries are refused with ledger_unavailable, readiness fails, liveness holds."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    upgrade(postgres_url)
    backend = Backend("postgres", postgres_url, None, graph_path)
    with running_app(backend) as client:
        ledger = ledger_of(client)
        user = ledger.accounts.create_account("user", node_id="31", cap_epsilon=1.0, delta=1e-6)
        key, _ = ledger.api_keys.create_api_key(user.account_id)
        assert client.get("/v1/ppr/31", headers=bearer(key)).status_code == 200

        url = make_url(postgres_url)
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE "{url.database}" WITH (FORCE)')
        finally:
            admin.dispose()

        lost = client.get("/v1/ppr/31", headers=bearer(key), params={"fresh": "true"})
        assert lost.status_code == 503  # authentication already needs the ledger
        assert lost.json()["error"]["code"] == "ledger_unavailable"
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200
