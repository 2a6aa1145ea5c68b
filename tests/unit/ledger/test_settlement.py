"""Storing a release and settling its charge (``service/ledger/settlement.py``), on SQLite and
on PostgreSQL: stored once, a second store a no-op, a refunded charge's answer refused; on
PostgreSQL in ONE statement committed on its own (no BEGIN, one round trip), and a store
racing a refund of the same charge: exactly one of them wins, every time."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event, func, select

from service.ledger import ChargeSettled, Ledger, ReleaseKey, StoredRelease
from service.ledger.database import upgrade
from service.ledger.settlement import Settlement
from service.ledger.tables import Charge, Release
from service.mechanisms.postprocess import RankedNode
from tests.ledger_support import charge_edge_query

DELTA = 1e-6


def _release(account: int, charge_id: int) -> StoredRelease:
    key = ReleaseKey(account, f"n{charge_id}", "g1", "edge", 0.1)
    return StoredRelease(key, charge_id, [RankedNode("v0", 0.5)], {"name": "x"}, f"q{charge_id}")


def _state(ledger: Ledger, charge_id: int) -> str:
    with ledger.engine.connect() as conn:
        return str(conn.execute(select(Charge.state).where(Charge.id == charge_id)).scalar_one())


def _releases(ledger: Ledger, charge_id: int) -> int:
    with ledger.engine.connect() as conn:
        counted = select(func.count()).select_from(Release).where(Release.charge_id == charge_id)
        return int(conn.execute(counted).scalar_one())


def test_a_release_is_stored_once_and_a_refunded_charges_answer_never(ledger: Ledger) -> None:
    account = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    stored = _release(account, charge_edge_query(ledger, account, 1))
    ledger.settlement.store_release(stored, idempotency_key=None, principal_account_id=account)
    ledger.settlement.store_release(stored, idempotency_key=None, principal_account_id=account)
    assert _state(ledger, stored.charge_id) == "released"
    assert _releases(ledger, stored.charge_id) == 1
    assert ledger.stored_releases.find_release(stored.key) == stored

    refunded = charge_edge_query(ledger, account, 2)
    ledger.settlement.refund(refunded, reason="test")
    with pytest.raises(ChargeSettled):
        ledger.settlement.store_release(
            _release(account, refunded), idempotency_key=None, principal_account_id=account
        )
    assert _state(ledger, refunded) == "refunded" and _releases(ledger, refunded) == 0
    with pytest.raises(ChargeSettled):  # a charge that does not exist stores nothing either
        ledger.settlement.store_release(
            _release(account, 10_000), idempotency_key=None, principal_account_id=account
        )
    assert ledger.reports.verify().ok


@pytest.mark.postgres
def test_on_postgresql_a_store_is_one_statement_and_a_read_no_transaction(
    postgres_url: str,
) -> None:
    upgrade(postgres_url)
    ledger = Ledger.from_url(postgres_url)
    try:
        account = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA)
        stored = _release(account.account_id, charge_edge_query(ledger, account.account_id, 1))
        seen: list[tuple[str, bool]] = []

        @event.listens_for(ledger.engine, "before_cursor_execute")
        def _statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            autocommit = bool(conn.connection.driver_connection.autocommit)
            seen.append((" ".join(statement.split()[:2]), autocommit))

        ledger.settlement.store_release(
            stored, idempotency_key=None, principal_account_id=account.account_id
        )
        assert seen == [("WITH settled", True)]  # one statement, committed on its own
        seen.clear()
        assert ledger.stored_releases.find_release(stored.key) == stored
        assert seen and all(autocommit for _, autocommit in seen)  # no BEGIN, no COMMIT
        assert _state(ledger, stored.charge_id) == "released"
    finally:
        ledger.dispose()


@pytest.mark.postgres
def test_on_postgresql_a_store_racing_a_refund_one_of_them_wins(postgres_url: str) -> None:
    upgrade(postgres_url)
    ledger = Ledger.from_url(postgres_url)
    try:
        account = ledger.accounts.create_account("service", cap_epsilon=100.0, delta=DELTA)
        for i in range(40):
            charge_id = charge_edge_query(ledger, account.account_id, i)
            result = _race(ledger, account.account_id, charge_id)
            state, rows = _state(ledger, charge_id), _releases(ledger, charge_id)
            if state == "released":
                assert result == {"store": "stored", "refund": "refused"} and rows == 1
            else:
                assert state == "refunded" and rows == 0
                assert result == {"store": "refused", "refund": "refunded"}
        assert ledger.reports.verify().ok
    finally:
        ledger.dispose()


def _race(ledger: Ledger, account: int, charge_id: int) -> dict[str, str]:
    """Store a release of ``charge_id`` and refund it at the same moment, from two threads:
    what each of them made of it."""
    barrier = threading.Barrier(2)
    result: dict[str, str] = {}
    settlement: Settlement = ledger.settlement

    def store() -> None:
        barrier.wait()
        try:
            settlement.store_release(
                _release(account, charge_id), idempotency_key=None, principal_account_id=account
            )
            result["store"] = "stored"
        except ChargeSettled:
            result["store"] = "refused"

    def refund() -> None:
        barrier.wait()
        try:
            settlement.refund(charge_id, reason="race")
            result["refund"] = "refunded"
        except ChargeSettled:
            result["refund"] = "refused"

    threads = [threading.Thread(target=store), threading.Thread(target=refund)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return result
