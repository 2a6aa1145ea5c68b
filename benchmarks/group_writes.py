"""Thread CPU of a group admission's row writes: one statement per row (pipelined) or per table.

Makes a database next to ``--base-url`` (migrated, dropped at the end) with ``--rows`` user
accounts, then writes, in rounds that alternate the two forms, ``--transactions`` transactions
of ``--rows`` charges and ``--rows`` spend rows each, as a group of personalized queries
writes them:

* per row: ``insert(charges)`` and an ``UPDATE spend ... WHERE account_id = :id`` executed
  with a list of rows (psycopg sends one prepared statement per row in a pipeline);
* per table: :func:`service.ledger.array_writes.insert_rows` and ``update_rows`` (one statement
  of one array per column).

Prints the thread CPU per transaction of each round, in ms:

    .venv/bin/python benchmarks/group_writes.py --rows 15 --transactions 100 --rounds 6

Not part of the tests.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from request_statements import drop_database, fresh_database  # this folder's, beside it
from sqlalchemy import bindparam, insert, update
from sqlalchemy.orm import Session

from service.ledger import Ledger
from service.ledger.array_writes import insert_rows, update_rows
from service.ledger.json_text import EncodedJson, encode_json
from service.ledger.locked_rows import CHARGES, SPEND

SPEND_COLUMNS = (
    "rdp", "pure_epsilon", "grid_version", "charges", "epsilon", "last_charge_at", "updated_at",
)  # fmt: skip
PER_ROW_SPEND = (
    update(SPEND)
    .where(SPEND.c.account_id == bindparam("w_account_id"))
    .values({c: bindparam(f"w_{c}", type_=SPEND.c[c].type) for c in SPEND_COLUMNS})
)


def charge_rows(accounts: list[int], first_id: int, now: datetime) -> list[dict[str, Any]]:
    params = EncodedJson(encode_json({"k": 20, "mechanism": "blended"}))
    curve = EncodedJson(encode_json({"grid_version": 1, "rdp": [0.01] * 100, "pure": 0.1}))
    return [
        {
            "id": first_id + i,
            "created_at": now,
            "charged_account_id": account,
            "principal_account_id": account,
            "seed": f"n{i}",
            "mechanism": "blended",
            "mode": "personalized",
            "params": params,
            "epsilon": 0.1,
            "rdp": curve,
            "pure_epsilon": 0.1,
            "grid_version": 1,
            "graph_version": "g" * 16,
            "request_id": f"r{first_id + i}",
            "idempotency_key": None,
            "state": "admitted",
            "release_key": None,
            "exposure_shard": 0,
            "period_start": now,
        }
        for i, account in enumerate(accounts)
    ]


def spend_rows(accounts: list[int], now: datetime) -> list[dict[str, Any]]:
    curve = {"grid_version": 1, "rdp": [0.3] * 100, "pure": 0.3}
    return [
        {
            "account_id": account,
            "rdp": curve,
            "pure_epsilon": 0.3,
            "grid_version": 1,
            "charges": 3,
            "epsilon": 0.5,
            "last_charge_at": now,
            "updated_at": now,
        }
        for account in accounts
    ]


def per_row(session: Session, accounts: list[int], first_id: int, now: datetime) -> None:
    session.execute(insert(CHARGES), charge_rows(accounts, first_id, now))
    session.execute(
        PER_ROW_SPEND,
        [{f"w_{k}": v for k, v in row.items()} for row in spend_rows(accounts, now)],
    )


def per_table(session: Session, accounts: list[int], first_id: int, now: datetime) -> None:
    insert_rows(session, CHARGES, charge_rows(accounts, first_id, now))
    update_rows(session, SPEND, "account_id", spend_rows(accounts, now))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--transactions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    name = f"ppr_group_writes_{uuid.uuid4().hex[:8]}"
    url = fresh_database(args.base_url, name)
    try:
        ledger = Ledger.from_url(url)
        accounts = [
            ledger.accounts.create_account(
                "user", node_id=f"n{i}", cap_epsilon=10.0, delta=1e-6
            ).account_id
            for i in range(args.rows)
        ]
        forms: dict[str, Callable[[Session, list[int], int, datetime], None]] = {
            "per row": per_row,
            "per table": per_table,
        }
        figures: dict[str, list[float]] = {form: [] for form in forms}
        next_id = 1_000_000
        for _ in range(args.rounds):
            for form, write in forms.items():
                started = time.thread_time()
                for _ in range(args.transactions):
                    with Session(ledger.engine) as session, session.begin():
                        write(session, accounts, next_id, datetime.now(UTC))
                    next_id += args.rows
                figures[form].append((time.thread_time() - started) / args.transactions)
        ledger.dispose()
    finally:
        drop_database(args.base_url, name)
    print(f"{args.rows} charges and {args.rows} spend rows a transaction, thread CPU (ms):")
    print("| form | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " |")
    print("| --- |" + " --- |" * args.rounds)
    for form, seconds in figures.items():
        print(f"| {form} | " + " | ".join(f"{s * 1000:.3f}" for s in seconds) + " |")


if __name__ == "__main__":
    main()
