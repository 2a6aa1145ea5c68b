"""What a batch costs when every item is refused: server time, SQL statements, transactions.

Runs the app in-process (its lifespan: ledger pool, caches, graph) on a fresh PostgreSQL
database (``--database-url``'s server; the database is created and dropped) or a SQLite file,
and sends ``POST /v1/ppr/batch`` with ``--items`` distinct nodes of a generated graph, in each
of three ways that refuse every item:

* ``budget_exhausted``: a service account in ``edge`` mode whose cap is below one item;
* ``service_quota_exhausted``: a service account in ``personalized`` mode, granted it, with a
  24-hour quota below one item, over ``--items`` seed users that have accounts;
* ``mode_not_allowed``: a service account that was not granted ``personalized`` mode.

For each it prints the call's time, the ledger's SQL statements and committed write
transactions during the call (SQLAlchemy engine events), and the refusal rows written. Compare
two checkouts with ``--checkout`` (its ``service`` package is imported instead of this one's):

    .venv/bin/python benchmarks/refused_batch.py
    .venv/bin/python benchmarks/refused_batch.py --checkout /tmp/before

Sends nothing over the network but to the database. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, help="import `service` from this tree")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument(
        "--database-url",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server (a database of its own is created on it), or sqlite",
    )
    parser.add_argument("--repeat", type=int, default=3, help="calls per way (best is shown)")
    args = parser.parse_args()
    if args.checkout is not None:
        sys.path.insert(0, str(args.checkout.resolve()))
    with tempfile.TemporaryDirectory(prefix="ppr-refused-") as tmp:
        url, drop = _database(args.database_url, Path(tmp))
        try:
            rows = _measure(url, Path(tmp), args.items, args.repeat)
        finally:
            drop()
    import service

    where = Path(service.__file__).resolve().parent.parent
    print(f"service from {where}; {args.items} items per batch, best of {args.repeat} calls; "
          f"{_backend(url)}")  # fmt: skip
    print(
        "| way | items refused | seconds | SQL statements | transactions (commits) | refusal rows |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| {way} | {refused} | {seconds:.3f} | {statements} | {transactions} | {rows} |"
              .format(**row))  # fmt: skip
    return 0


def _backend(url: str) -> str:
    return "PostgreSQL" if url.startswith("postgresql") else "SQLite"


def _database(url: str, tmp: Path) -> tuple[str, Any]:
    if url.startswith("sqlite"):
        return f"sqlite:///{tmp / 'ledger.db'}", lambda: None
    from sqlalchemy import create_engine, make_url, text

    name = f"ppr_refused_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(url).set(database=name).render_as_string(hide_password=False), drop


class Counted:
    """SQL statements and commits on the ledger's engines while open."""

    def __init__(self, engines: list[Any]) -> None:
        self.engines = list({id(e): e for e in engines}.values())
        self.statements = 0
        self.commits = 0

    def _statement(self, *args: Any) -> None:
        self.statements += 1

    def _commit(self, *args: Any) -> None:
        self.commits += 1

    def __enter__(self) -> Counted:
        from sqlalchemy import event

        for engine in self.engines:
            event.listen(engine, "before_cursor_execute", self._statement)
            event.listen(engine, "commit", self._commit)
        return self

    def __exit__(self, *exc: object) -> None:
        from sqlalchemy import event

        for engine in self.engines:
            event.remove(engine, "before_cursor_execute", self._statement)
            event.remove(engine, "commit", self._commit)


def _measure(url: str, tmp: Path, items: int, repeat: int) -> list[dict[str, Any]]:
    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    from service.api.app import create_app
    from service.config import Settings
    from service.graph.generate import write_generated_edge_list
    from service.ledger import upgrade
    from service.ledger.tables import Refusal

    graph = tmp / "graph.txt"
    write_generated_edge_list(graph, max(2 * items, 400), max(10 * items, 2400), seed=7)
    upgrade(url)
    settings = Settings(
        graph_path=graph, database_url=url, rate_limit_per_second=0, prefix_table_bytes=0,
        batch_max_items=max(items, 1000), graph_snapshot_dir=tmp / "snapshots",
    )  # fmt: skip
    app = create_app(settings, configure_logs=False)
    out = []
    with TestClient(app) as client:
        ledger = app.state.runtime.ledger
        nodes = [str(n) for n in range(items)]
        for node in nodes:  # the seed users of the personalized ways
            ledger.accounts.create_account("user", node_id=node, cap_epsilon=10.0, delta=1e-6)
        ways = {
            "budget_exhausted": (
                {"cap_epsilon": 0.01, "modes": ["edge"]}, "edge",
            ),
            "service_quota_exhausted": (
                {"cap_epsilon": 10.0, "modes": ["edge", "personalized"], "quota_epsilon": 0.01},
                "personalized",
            ),
            "mode_not_allowed": ({"cap_epsilon": 10.0, "modes": ["edge"]}, "personalized"),
        }  # fmt: skip
        engines = [ledger.engine]  # the write engine is an option view: its events are these
        for way, (fields, mode) in ways.items():
            account = ledger.accounts.create_account("service", delta=1e-6, **fields)
            key, _ = ledger.api_keys.create_api_key(account.account_id)
            best: dict[str, Any] | None = None
            for _ in range(repeat):
                with ledger.engine.connect() as conn:
                    before = conn.scalar(select(func.count()).select_from(Refusal))
                with Counted(engines) as counted:
                    started = time.perf_counter()
                    response = client.post(
                        "/v1/ppr/batch",
                        json={"nodes": nodes, "mode": mode, "epsilon": 0.1, "fresh": True},
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    seconds = time.perf_counter() - started
                assert response.status_code == 200, response.text[:500]
                codes = [i["error"]["code"] for i in response.json()["items"] if i.get("error")]
                with ledger.engine.connect() as conn:
                    after = conn.scalar(select(func.count()).select_from(Refusal))
                row = {"way": way, "refused": f"{codes.count(way)} of {items}",
                       "seconds": seconds, "statements": counted.statements,
                       "transactions": counted.commits, "rows": after - before}  # fmt: skip
                if best is None or seconds < best["seconds"]:
                    best = row
            assert best is not None
            out.append(best)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
