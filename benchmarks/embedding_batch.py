"""``POST /v1/embeddings/batch`` on PostgreSQL: wall time, SQL statements and ledger
transactions per batch.

Makes a fresh database next to ``--base-url`` (migrated by this checkout's ``db upgrade``),
builds the app in process (``create_app`` with the PPR_* settings of the environment) and
sends it, through Starlette's test client, batches of ``--items`` seeds (distinct random nodes)
in three kinds:

* ``edge, charged``: a service account (edge mode) pays every item (new seeds each batch);
* ``personalized, charged``: the same service account asks for the same seeds' users, who
  each have an account and pay;
* ``edge, keyed retry``: an ``edge, charged`` batch sent again with its Idempotency-Key (every
  item a replay, nothing charged).

Each kind runs ``--batches`` times after one warm-up batch. Every SQL statement is counted
through SQLAlchemy's ``before_cursor_execute`` event and every transaction through the
``begin`` event (an explicit or an implicit BEGIN, on every engine); the replay cache (Redis
when PPR_REDIS_URL is set) is used as configured. Prints per kind the median and the spread of
the wall time per batch, and the statements and transactions per batch.

Meant to be run by any checkout's own interpreter, so two commits compare on the same graph:

    PPR_GRAPH_PATH=../shared/data/facebook_combined.txt PPR_PREFIX_TABLE_BYTES=0 \\
        .venv/bin/python benchmarks/embedding_batch.py --items 32 --batches 15

Not part of the tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

import numpy as np
from request_statements import drop_database, fresh_database  # this folder's, beside it
from sqlalchemy import event
from sqlalchemy.engine import Engine


class Counts:
    def __init__(self) -> None:
        self.statements = 0
        self.transactions = 0
        self.first_words: Counter[str] = Counter()

    def clear(self) -> None:
        self.statements = 0
        self.transactions = 0
        self.first_words.clear()


COUNTS = Counts()


def hook_sql() -> None:
    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        COUNTS.statements += 1
        COUNTS.first_words[" ".join(statement.split()[:3])[:40]] += 1

    @event.listens_for(Engine, "begin")
    def _begin(conn: Any) -> None:
        COUNTS.transactions += 1


def accounts(url: str, seeds: list[str]) -> str:
    """A service account (edge and personalized modes, a cap no run reaches) and its key; a
    user account with the same cap for every seed."""
    from service.ledger.ledger import Ledger

    ledger = Ledger.from_url(url)
    try:
        service = ledger.accounts.create_account(
            "service", cap_epsilon=1e6, delta=1e-6, label="bench", modes=("edge", "personalized"),
            quota_epsilon=1e6,
        )  # fmt: skip
        key, _ = ledger.api_keys.create_api_key(service.account_id)
        for seed in seeds:
            ledger.accounts.create_account("user", node_id=seed, cap_epsilon=1e6, delta=1e-6)
    finally:
        ledger.dispose()
    return key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--epsilon", type=float, default=0.5)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument(
        "--statements", action="store_true", help="also list the statements by first words"
    )
    args = parser.parse_args()
    name = f"ppr_embedding_batch_{os.getpid()}"
    url = fresh_database(args.base_url, name)
    os.environ["PPR_DATABASE_URL"] = url
    try:
        from fastapi.testclient import TestClient

        from service.api.app import create_app
        from service.config import Settings

        hook_sql()
        app = create_app(Settings(), configure_logs=False)
        with TestClient(app) as client:
            graph = app.state.runtime.graphs.current
            rng = np.random.default_rng(0)
            picks = rng.choice(graph.n, args.items * (args.batches + 1), replace=False)
            seeds = [str(s) for s in graph.external_ids(picks)]
            key = accounts(url, seeds)
            print(
                f"graph {graph.n} nodes, {graph.m} edges; {args.items} items per batch, "
                f"k {args.k}, epsilon {args.epsilon}; {args.batches} batches per kind after "
                "a warm-up"
            )
            print(
                f"{'kind':<22} {'ms per batch, median':>20} {'min..max':>17} {'SQL':>6} {'txns':>5}"
            )

            def send(nodes: list[str], mode: str, idem: str | None) -> float:
                headers = {"Authorization": f"Bearer {key}"}
                if idem is not None:
                    headers["Idempotency-Key"] = idem
                body = {"nodes": nodes, "mode": mode, "k": args.k, "epsilon": args.epsilon}
                start = time.perf_counter()
                response = client.post("/v1/embeddings/batch", json=body, headers=headers)
                wall = time.perf_counter() - start
                items = response.json()["items"] if response.status_code == 200 else []
                errors = [i["error"]["code"] for i in items if "error" in i]
                if response.status_code != 200 or errors:
                    raise SystemExit(f"batch failed: {response.status_code} {errors[:3]}")
                return wall

            def run(kind: str, mode: str, batches: list[tuple[list[str], str | None]]) -> None:
                nodes, idem = batches[0]
                send(nodes, mode, idem)  # warm-up: caches, the version's hash functions
                COUNTS.clear()
                walls = [send(nodes, mode, idem) for nodes, idem in batches[1:]]
                n = len(walls)
                print(
                    f"{kind:<22} {statistics.median(walls) * 1000:>20.1f} "
                    f"{min(walls) * 1000:>8.1f}..{max(walls) * 1000:<7.1f} "
                    f"{COUNTS.statements / n:>6.1f} {COUNTS.transactions / n:>5.1f}"
                )
                if args.statements:
                    for words, count in COUNTS.first_words.most_common():
                        print(f"    {count / n:7.2f}  {words}")

            chunks = [seeds[i * args.items : (i + 1) * args.items] for i in range(args.batches + 1)]
            keys = [uuid.uuid4().hex for _ in chunks]
            run("edge, charged", "edge", list(zip(chunks, keys, strict=True)))
            run("personalized, charged", "personalized", [(c, None) for c in chunks])
            run("edge, keyed retry", "edge", list(zip(chunks, keys, strict=True)))
    finally:
        drop_database(args.base_url, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
