"""A group's releases stored in one statement on PostgreSQL (``service/ledger/release_rows.py``):
the statement fills every column of ``releases``; the rows it writes are the rows the
transaction it replaced wrote (``release_values``), read back equal; it is one statement
committed on its own; a charge listed twice is stored once; a refunded charge's answer is
refused and nothing is stored for it; a charge stored before is a no-op. On SQLite the group
is stored by the transaction, with the same outcomes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest
from sqlalchemy import Table, event, select, text

from service.ledger import ChargeSettled, Ledger, ReleaseKey, StoredRelease
from service.ledger.database import upgrade
from service.ledger.json_text import encode_json
from service.ledger.ledger_rows import release_values
from service.ledger.release_format import StoredResults
from service.ledger.release_rows import ARRAY_COLUMNS, release_columns
from service.ledger.tables import Release
from tests.ledger_support import charge_edge_query

DELTA = 1e-6
RELEASES = cast(Table, Release.__table__)


MECHANISM: dict[str, Any] = {"name": "noisy_diffusion", "alpha": 0.15, "steps": [1, 2]}


def _release(account: int, charge_id: int, n: int = 30) -> StoredRelease:
    key = ReleaseKey(account, f"n{charge_id} é", "g1", "edge", 0.1)
    results = StoredResults.of_lists([f"v{i}" for i in range(n)], [1.0 / (i + 3) for i in range(n)])
    return StoredRelease(key, charge_id, results, MECHANISM, f"q{charge_id}")


def _rows(ledger: Ledger, ids: list[int]) -> dict[int, dict[str, Any]]:
    with ledger.engine.connect() as conn:
        found = conn.execute(
            select(*(RELEASES.c[c.name] for c in RELEASES.c)).where(RELEASES.c.charge_id.in_(ids))
        )
        return {int(row.charge_id): dict(row._mapping) for row in found}


def test_the_statement_fills_every_column_of_releases() -> None:
    filled = [name for name, _ in ARRAY_COLUMNS] + ["created_at"]
    assert sorted(filled) == sorted(c.name for c in RELEASES.c)


def test_the_columns_are_each_rows_values() -> None:
    now = datetime.now(UTC)
    releases = [(_release(7, 1), "key-1", 9), (_release(7, 2), None, 9)]
    columns = release_columns(releases, now)
    assert columns["now"] is now
    for i, (release, key, principal) in enumerate(releases):
        row = release_values(release, key, principal, now)
        row["mechanism"] = encode_json(row["mechanism"])  # the TEXT its column stores
        for name, _ in ARRAY_COLUMNS:
            assert columns[name][i] == row[name], name
        assert row["created_at"] is now


def test_a_group_is_stored_once_and_a_refunded_charges_answer_never(ledger: Ledger) -> None:
    account = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    ids = [charge_edge_query(ledger, account, i) for i in range(4)]
    ledger.settlement.refund(ids[1], reason="test")
    releases = [_release(account, charge_id) for charge_id in ids]
    again = _release(account, ids[0], n=5)  # listed twice: the first one is stored
    outcomes = ledger.settlement.store_releases(
        [(releases[0], "k0", account), (releases[1], None, account), (again, None, account),
         (releases[2], None, account), (releases[3], "k3", account)]
    )  # fmt: skip
    assert [type(o).__name__ for o in outcomes] == [
        "NoneType", "ChargeSettled", "NoneType", "NoneType", "NoneType",
    ]  # fmt: skip
    assert isinstance(outcomes[1], ChargeSettled)
    assert ledger.stored_releases.find_release(releases[0].key) == releases[0]
    assert ledger.stored_releases.find_release(releases[1].key) is None
    assert ledger.stored_releases.find_release(releases[3].key) == releases[3]
    rows = _rows(ledger, ids)
    assert sorted(rows) == [ids[0], ids[2], ids[3]]
    assert rows[ids[0]]["idempotency_key"] == "k0" and rows[ids[2]]["idempotency_key"] is None
    assert rows[ids[0]]["mechanism"] == MECHANISM and rows[ids[3]]["request_id"] == f"q{ids[3]}"
    # stored before: a no-op; refunded: refused again
    outcomes = ledger.settlement.store_releases(
        [(releases[2], None, account), (releases[1], None, account)]
    )
    assert outcomes[0] is None and isinstance(outcomes[1], ChargeSettled)
    assert ledger.reports.verify().ok


@pytest.mark.postgres
def test_on_postgresql_a_group_is_one_statement_writing_the_rows_of_the_transaction(
    postgres_url: str,
) -> None:
    """The rows one statement writes are, column for column, the rows the transaction it
    replaced writes (a multi-row INSERT of ``release_values``), created_at aside."""
    upgrade(postgres_url)
    ledger = Ledger.from_url(postgres_url)
    try:
        account = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA)
        acct = account.account_id
        ids = [charge_edge_query(ledger, acct, i) for i in range(6)]
        releases = [(_release(acct, c), f"key{c}" if c % 2 else None, acct) for c in ids]
        seen: list[tuple[str, bool]] = []

        @event.listens_for(ledger.engine, "before_cursor_execute")
        def _statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            autocommit = bool(conn.connection.driver_connection.autocommit)
            seen.append((" ".join(statement.split()[:2]), autocommit))

        assert ledger.settlement.store_releases(releases[:3]) == [None] * 3
        assert seen == [("WITH settled", True)]  # one statement, committed on its own
        event.remove(ledger.engine, "before_cursor_execute", _statement)

        now = datetime.now(UTC)
        with ledger.engine.begin() as conn:  # the transaction's rows, for the other three
            conn.execute(text("UPDATE charges SET state = 'released' WHERE id = ANY(:ids)"),
                         {"ids": ids[3:]})  # fmt: skip
            conn.execute(
                RELEASES.insert(), [release_values(r, k, p, now) for r, k, p in releases[3:]]
            )
        rows = _rows(ledger, ids)
        for one, other in zip(ids[:3], ids[3:], strict=True):
            a, b = dict(rows[one]), dict(rows[other])
            for row in (a, b):
                row.pop("charge_id"), row.pop("created_at"), row.pop("node")
                row.pop("request_id"), row.pop("idempotency_key")
            assert a == b
            assert rows[one]["node"] == f"n{one} é" and rows[one]["request_id"] == f"q{one}"
        assert ledger.reports.verify().ok
    finally:
        ledger.dispose()
