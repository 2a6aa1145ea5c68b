"""SQL statements and Redis commands per HTTP request, by kind of request, on PostgreSQL + Redis.

Makes a fresh database next to ``--base-url`` (migrated by this checkout's ``db upgrade``),
builds the app in process (``create_app`` with the PPR_* settings of the environment) and
sends it, through Starlette's test client, the requests a ``loadtest`` run sends: ``/healthz``,
fresh queries (``fresh=true``, random seeds, a service account's key) and replays of stored
releases. Every SQL statement is counted through SQLAlchemy's ``before_cursor_execute`` event
(on every engine) and every Redis command through ``redis.Redis.execute_command`` and pipeline
execution. Prints, per kind, the statements and Redis commands per request and the statements
that ran, by their first words, most frequent first.

Meant to be run by any checkout's own interpreter, so two commits compare on the same graph:

    PPR_GRAPH_PATH=graph.txt PPR_REDIS_URL=redis://127.0.0.1:6379/0 PPR_PREFIX_TABLE_BYTES=0 \\
        .venv/bin/python benchmarks/request_statements.py --queries 40

Not part of the tests.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import create_engine, event, make_url
from sqlalchemy.engine import Engine

ROOT = Path.cwd()


class Counts:
    def __init__(self) -> None:
        self.sql: Counter[str] = Counter()
        self.redis: Counter[str] = Counter()

    def clear(self) -> None:
        self.sql.clear()
        self.redis.clear()


COUNTS = Counts()


def _shape(statement: str) -> str:
    text = re.sub(r"\s+", " ", statement).strip()
    text = re.sub(r"\([^()]*\)", "(..)", text)
    return text[:110]


def hook_sql() -> None:
    @event.listens_for(Engine, "before_cursor_execute")
    def _count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        COUNTS.sql[_shape(statement)] += 1


def hook_redis() -> None:
    import redis
    import redis.client

    original = redis.Redis.execute_command

    def execute_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS.redis[str(args[0]) if args else "?"] += 1
        return original(self, *args, **kwargs)

    redis.Redis.execute_command = execute_command  # type: ignore[method-assign]
    original_pipe = redis.client.Pipeline.execute

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS.redis[f"pipeline[{len(self.command_stack)}]"] += 1
        return original_pipe(self, *args, **kwargs)

    redis.client.Pipeline.execute = execute  # type: ignore[method-assign]


def fresh_database(base_url: str, name: str) -> str:
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    url = make_url(base_url).set(database=name).render_as_string(hide_password=False)
    subprocess.run(
        [sys.executable, "-m", "service", "db", "upgrade"], cwd=ROOT,
        env={**os.environ, "PPR_DATABASE_URL": url}, check=True, capture_output=True,
    )  # fmt: skip
    return url


def drop_database(base_url: str, name: str) -> None:
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def report(kind: str, n: int, wall: float, statuses: Counter[int]) -> None:
    sql, red = sum(COUNTS.sql.values()), sum(COUNTS.redis.values())
    print(
        f"\n{kind}: {n} requests, statuses {dict(statuses)}, {wall / n * 1000:.2f} ms each; "
        f"SQL {sql / n:.2f} per request, Redis {red / n:.2f} per request"
    )
    for text, count in COUNTS.sql.most_common():
        print(f"  sql   {count / n:6.2f}  {text}")
    for text, count in COUNTS.redis.most_common():
        print(f"  redis {count / n:6.2f}  {text}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument(
        "--route", choices=["ppr", "embeddings"], default="ppr",
        help="ppr: GET /v1/ppr/{node}; embeddings: GET /v1/embeddings/{node} (DP-IE, k 256, "
        "sigma 1e-3 unless --k is given)",
    )  # fmt: skip
    args = parser.parse_args()
    name = f"ppr_statements_{os.getpid()}"
    url = fresh_database(args.base_url, name)
    os.environ["PPR_DATABASE_URL"] = url
    try:
        from fastapi.testclient import TestClient

        from service.api.app import create_app
        from service.config import Settings
        from service.loadtest.server import service_account_key

        key = service_account_key(url, delta=1e-6)
        hook_sql()
        hook_redis()
        app = create_app(Settings(), configure_logs=False)
        with TestClient(app) as client:
            graph = app.state.runtime.graphs.current
            rng = np.random.default_rng(0)
            picks = rng.choice(graph.n, size=2 * args.queries, replace=False)
            seeds = [str(s) for s in graph.external_ids(picks)]
            headers = {"Authorization": f"Bearer {key}"}
            query = f"mode=edge&epsilon={args.epsilon}&k={args.k}"
            if args.route == "embeddings":
                query += "&sigma=0.001"

            def run(kind: str, paths: list[str], hdrs: dict[str, str]) -> None:
                client.get(paths[0], headers=hdrs)  # warm: the first request builds caches
                COUNTS.clear()
                statuses: Counter[int] = Counter()
                start = time.perf_counter()
                for path in paths[1:]:
                    statuses[client.get(path, headers=hdrs).status_code] += 1
                report(kind, len(paths) - 1, time.perf_counter() - start, statuses)

            run("healthz", ["/healthz"] * (args.queries + 1), {})
            route = f"/v1/{args.route}"
            fresh = [f"{route}/{s}?{query}&fresh=true" for s in seeds[: args.queries + 1]]
            run("fresh", fresh, headers)
            replay = [f"{route}/{s}?{query}" for s in seeds[: args.queries + 1]]
            run("replay", replay, headers)
            first = [f"{route}/{s}?{query}" for s in seeds[args.queries + 1 :]]
            run("first ask, default", first, headers)
    finally:
        drop_database(args.base_url, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
