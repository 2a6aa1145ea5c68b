"""Fault run: the ledger's promise while workers are SIGKILLed and PostgreSQL restarts.

Starts ``python -m service serve --workers N`` on PostgreSQL with a generated graph big enough
that fresh queries take hundreds of milliseconds, sends ``--requests`` fresh charged queries,
each with its own Idempotency-Key and retried with that same key until answered (as a backend
with retries would), while a worker is SIGKILLed every ``--kill-every`` seconds and, with
``--own-postgres --restart-postgres-every S``, a PostgreSQL instance started by this script is
stopped (for ``--postgres-down-seconds``, default 3) and restarted. Then it stops the server
and runs ``ledger reconcile`` and ``ledger verify`` and prints what happened to every charge.

    .venv/bin/python benchmarks/fault_run.py --generate 100000,1000000 --kill-every 10
    .venv/bin/python benchmarks/fault_run.py --own-postgres --restart-postgres-every 15
    .venv/bin/python benchmarks/fault_run.py --driver client --kill-every 3

With ``--own-redis --restart-redis-every S`` the server also uses a Redis started by this
script (its replay, degree and prefix caches), stopped for ``--redis-down-seconds`` (default
3) and restarted every S seconds; the shared Redis is never touched.

``--driver client`` sends the queries with ``service.client.AsyncPprClient`` (its own retries,
the same key on each) instead of the hand-written retry loop, and counts every HTTP attempt
at its transport.

Sends traffic only to 127.0.0.1. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from service.loadtest.soak import worker_pids

PG_BIN = (
    Path("/usr/lib/postgresql")
    / (
        sorted(os.listdir("/usr/lib/postgresql"))[-1]
        if Path("/usr/lib/postgresql").exists()
        else "15"
    )
    / "bin"
)


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kwargs)


class OwnPostgres:
    """A throw-away PostgreSQL cluster (own data dir and port) this script may stop at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="ppr-fault-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.log = self.dir / "pg.log"

    def _as_postgres(self, *args: str) -> None:
        run(["runuser", "-u", "postgres", "--", *args])

    def init(self) -> None:
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                          "--auth", "trust")  # fmt: skip
        self.start()

    def start(self) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
                          "-w", "start")  # fmt: skip

    def stop(self) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                          "stop")  # fmt: skip

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"


class OwnRedis:
    """A throw-away Redis (own port, no persistence) this script may stop at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def fresh_database(base_url: str, name: str) -> str:
    from sqlalchemy import create_engine, make_url

    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def cli(*args: str, env: dict[str, str]) -> str:
    return run([sys.executable, "-m", "service", *args], env=env).stdout


async def drive(
    base_url: str, key: str, nodes: list[str], args: argparse.Namespace, stop_at: float
) -> dict[str, Any]:
    outcomes: dict[str, Any] = {}
    attempts: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    sem = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency)

    async def one(i: int, http: httpx.AsyncClient) -> None:
        idem = f"fault-{args.run_id}-{i}"
        node = random.choice(nodes)
        while time.monotonic() < stop_at:
            async with sem:
                attempts[idem] += 1
                try:
                    r = await http.get(
                        f"/v1/ppr/{node}",
                        params={"mode": "edge", "epsilon": args.epsilon, "k": 10},
                        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem},
                    )
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    await asyncio.sleep(0.5)
                    continue
            statuses[str(r.status_code)] += 1
            if r.status_code == 200:
                body = r.json()
                previous = outcomes.get(idem)
                if previous is not None and previous["results"] != body["results"]:
                    outcomes[idem + "#conflict"] = body
                outcomes[idem] = {"results": body["results"], "replayed": body["replayed"]}
                if not args.reask or attempts[idem] > 1:
                    return
                continue  # ask once more: the same key must give the same answer
            wait = float(r.headers.get("Retry-After", "0.5"))
            await asyncio.sleep(min(wait, 2.0))
        outcomes.setdefault(idem, None)

    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:
        await asyncio.gather(*(one(i, http) for i in range(args.requests)))
    return {"outcomes": outcomes, "attempts": attempts, "statuses": statuses}


class CountingTransport(httpx.AsyncBaseTransport):
    """The client's transport, counting every HTTP attempt by key and by status."""

    def __init__(self, concurrency: int) -> None:
        limits = httpx.Limits(max_connections=concurrency)
        self.inner = httpx.AsyncHTTPTransport(limits=limits)
        self.attempts: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts[request.headers.get("idempotency-key", "")] += 1
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError as exc:
            self.statuses[type(exc).__name__] += 1
            raise
        self.statuses[str(response.status_code)] += 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def drive_client(
    base_url: str, key: str, nodes: list[str], args: argparse.Namespace, stop_at: float
) -> dict[str, Any]:
    """As :func:`drive`, with the typed client's retries; a call that exhausts them is called
    again with the same key until the deadline (as a backend would)."""
    from service.client import AsyncPprClient, PprClientError, RetryPolicy

    outcomes: dict[str, Any] = {}
    transport = CountingTransport(args.concurrency)
    sem = asyncio.Semaphore(args.concurrency)
    policy = RetryPolicy(attempts=8, backoff=0.25, max_backoff=2.0)
    async with AsyncPprClient(base_url, key, retry=policy, transport=transport) as ppr:

        async def one(i: int) -> None:
            idem = f"fault-{args.run_id}-{i}"
            node = random.choice(nodes)
            asks = 2 if args.reask else 1
            while time.monotonic() < stop_at and asks > 0:
                try:
                    async with sem:
                        answer = await ppr.ppr(
                            node, mode="edge", epsilon=args.epsilon, k=10, idempotency_key=idem
                        )
                except PprClientError:
                    await asyncio.sleep(0.5)
                    continue
                results = [r.model_dump() for r in answer.results]
                previous = outcomes.get(idem)
                if previous is not None and previous["results"] != results:
                    outcomes[idem + "#conflict"] = results
                outcomes[idem] = {"results": results, "replayed": answer.replayed}
                asks -= 1
            outcomes.setdefault(idem, None)

        await asyncio.gather(*(one(i) for i in range(args.requests)))
    return {"outcomes": outcomes, "attempts": transport.attempts, "statuses": transport.statuses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                        help="PostgreSQL server to create the run's database on")  # fmt: skip
    parser.add_argument("--own-postgres", action="store_true", help="start a private cluster")
    parser.add_argument("--pg-port", type=int, default=55432)
    parser.add_argument("--restart-postgres-every", type=float, default=0.0)
    parser.add_argument("--postgres-down-seconds", type=float, default=3.0,
                        help="how long each PostgreSQL stop lasts")  # fmt: skip
    parser.add_argument("--own-redis", action="store_true",
                        help="the server uses a private Redis (never the shared one)")  # fmt: skip
    parser.add_argument("--redis-port", type=int, default=56379)
    parser.add_argument("--restart-redis-every", type=float, default=0.0)
    parser.add_argument("--redis-down-seconds", type=float, default=3.0,
                        help="how long each Redis stop lasts")  # fmt: skip
    parser.add_argument("--generate", default="100000,1000000", help="NODES,EDGES")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--kill-every", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=8051)
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for the run")
    parser.add_argument("--reconcile-after", type=float, default=15.0)
    parser.add_argument("--reask", action="store_true", help="ask every key twice")
    parser.add_argument("--driver", choices=("raw", "client"), default="raw",
                        help="raw: a retry loop here; client: service.client")  # fmt: skip
    parser.add_argument("--run-id", default=str(int(time.time())))
    args = parser.parse_args()

    pg = OwnPostgres(args.pg_port) if args.own_postgres else None
    redis = OwnRedis(args.redis_port) if args.own_redis else None
    workdir = Path(tempfile.mkdtemp(prefix="ppr-fault-"))
    try:
        if pg is not None:
            pg.init()
        if redis is not None:
            redis.start()
        url = fresh_database(pg.url if pg else args.base_url, f"ppr_fault_{args.run_id}")
        n, m = (int(x) for x in args.generate.split(","))
        graph = workdir / "graph.txt"
        from service.graph.generate import write_generated_edge_list

        t0 = time.perf_counter()
        write_generated_edge_list(graph, n, m, seed=11)
        print(f"graph: {n} nodes, {m} edges generated in {time.perf_counter() - t0:.1f} s")
        env = {**os.environ, "PPR_DATABASE_URL": url, "PPR_GRAPH_PATH": str(graph),
               "PPR_RECONCILE_AFTER_SECONDS": str(args.reconcile_after),
               "PPR_RECONCILE_INTERVAL_SECONDS": str(max(1.0, args.reconcile_after / 3)),
               "PPR_LOG_LEVEL": "warning"}  # fmt: skip
        if redis is not None:
            env["PPR_REDIS_URL"] = redis.url
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        cli("db", "upgrade", env=env)
        created = json.loads(
            cli("accounts", "create", "--type", "service", "--cap", "1000", "--json", env=env)
        )
        key = created["api_key"]
        log = open(workdir / "server.log", "wb")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(args.port),
             "--workers", str(args.workers)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        base = f"http://127.0.0.1:{args.port}"
        ready_by = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > ready_by:
                print((workdir / "server.log").read_text()[-3000:])
                return 2
            time.sleep(0.5)
        time.sleep(3)  # let every worker finish loading
        print(f"server ready: {args.workers} workers on {base}")

        kills: list[int] = []
        restarts = [0]
        redis_restarts = [0]
        stop = threading.Event()

        def killer() -> None:
            while not stop.wait(args.kill_every):
                pids = worker_pids(server.pid)
                if pids:
                    victim = random.choice(pids)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills.append(victim)
                    except ProcessLookupError:
                        pass

        def pg_restarter() -> None:
            assert pg is not None
            while not stop.wait(args.restart_postgres_every):
                pg.stop()
                stop.wait(args.postgres_down_seconds)
                pg.start()
                restarts[0] += 1

        def redis_restarter() -> None:
            assert redis is not None
            while not stop.wait(args.restart_redis_every):
                redis.stop()
                stop.wait(args.redis_down_seconds)
                redis.start()
                redis_restarts[0] += 1

        threads = []
        if redis is not None and args.restart_redis_every > 0:
            threads.append(threading.Thread(target=redis_restarter, daemon=True))
        if args.kill_every > 0:
            threads.append(threading.Thread(target=killer, daemon=True))
        if pg is not None and args.restart_postgres_every > 0:
            threads.append(threading.Thread(target=pg_restarter, daemon=True))
        for t in threads:
            t.start()
        nodes = [str(i) for i in range(n)]
        t0 = time.perf_counter()
        driver = drive_client if args.driver == "client" else drive
        result = asyncio.run(driver(base, key, nodes, args, time.monotonic() + args.deadline))
        elapsed = time.perf_counter() - t0
        server_exit = server.poll()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

        reconciled = json.loads(cli("ledger", "reconcile", "--older-than", "0", "--json", env=env))
        verify = subprocess.run(
            [sys.executable, "-m", "service", "ledger", "verify", "--json"],
            env=env, text=True, capture_output=True,
        )  # fmt: skip
        report = json.loads(verify.stdout)
        from service.ledger import Ledger

        ledger = Ledger.from_url(url)
        charges = ledger.reports.list_charges(None, limit=100000)
        ledger.dispose()
        outcomes = result["outcomes"]
        answered = [k for k, v in outcomes.items() if v is not None and "#" not in k]
        conflicts = [k for k in outcomes if k.endswith("#conflict")]
        print(f"\n{args.requests} keys in {elapsed:.1f} s; workers SIGKILLed: {len(kills)}; "
              f"PostgreSQL restarts: {restarts[0]}; "
              f"Redis restarts: {redis_restarts[0]}")  # fmt: skip
        unanswered = args.requests - len(answered)
        print(f"answered keys: {len(answered)} / {args.requests}; unanswered: {unanswered}; "
              f"keys answered differently: {len(conflicts)}")  # fmt: skip
        print(f"HTTP attempts: {sum(result['attempts'].values())}; by status: "
              f"{dict(sorted(result['statuses'].items()))}")  # fmt: skip
        states = Counter(c.state for c in charges)
        print(f"charges: {len(charges)}, by state: {dict(states)}; refunded by the final "
              f"reconcile: {reconciled['refunded']}")  # fmt: skip
        released_keys = Counter(c.idempotency_key for c in charges if c.state == "released")
        print(f"keys with more than one released charge: "
              f"{sum(1 for v in released_keys.values() if v > 1)}")  # fmt: skip
        print(f"ledger verify: exit {verify.returncode}, mismatches {len(report['mismatches'])}, "
              f"accounts checked {report['accounts_checked']}, admitted without release "
              f"{report['admitted_without_release']['count']}")  # fmt: skip
        ok = (
            verify.returncode == 0
            and len(answered) == args.requests
            and not conflicts
            and all(v <= 1 for v in released_keys.values())
            and states.get("admitted", 0) == 0
            and server_exit is None
        )
        if server_exit is not None:
            print(f"the server's supervisor exited during the run with code {server_exit}")
        if not ok:
            print("--- last lines of the server's log ---")
            print((workdir / "server.log").read_text(errors="replace")[-6000:])
        print("RESULT:", "OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if redis is not None:
            redis.stop()
        if pg is not None:
            pg.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
