"""Refusals cost less than answers (issue 31, item 7): a batch whose every item is refused is
refused in one transaction whatever its size - the refusal rows in one multi-row INSERT, inside
the admission's own transaction when admission refused them - and the admin's refusal
statistics count every item, as before. On SQLite and on PostgreSQL + Redis.

``benchmarks/refused_batch.py`` prints the time, statements and transactions of 1,000-item
batches refused each way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from tests import test_api
from tests.api_support import Backend, bearer, ledger_of, running_app
from tests.test_api import Accounts

backend = test_api.backend


@pytest.fixture
def client(backend: Backend) -> Iterator[TestClient]:
    """The app, with a key's account read once per test: at the default auth cache of one
    second a loaded machine may read it again between two batches, a read per request (not
    per item) that the transaction counts below would take for the batch's own."""
    with running_app(backend, auth_cache_seconds=3600.0) as client:
        yield client


#: The app's own background threads (the reconciler's look for stale charges, the heartbeats of
#: live charges and of a graph-wide release, the prefix tables' check, the runtime's start),
#: which may commit in the middle of a request on a loaded machine: not the request's
#: transactions.
BACKGROUND = {
    "ledger-reconciler",
    "charge-heartbeat",
    "heartbeat",
    "ppr-prefix-tables",
    "runtime-starter",
}


@dataclass
class Counted:
    """The request's statements, and its transactions that wrote (read-only ones are left out:
    a worker re-reads values it caches for a few seconds, such as a key's account or the
    graph-wide exposure's delta, whenever they are older than that, in whichever request
    comes next; on a loaded machine that may fall into any of the batches)."""

    statements: list[str] = field(default_factory=list)
    writes: int = 0
    writing: set[int] = field(default_factory=set)  # connections whose transaction wrote

    def clear(self) -> None:
        self.statements.clear()
        self.writes = 0


WRITES = ("INSERT", "UPDATE", "DELETE")


@pytest.fixture
def counted(client: TestClient) -> Iterator[Counted]:
    # the write engine (SQLite: BEGIN IMMEDIATE) is an option view of this one: its events
    # are this engine's
    engines = [ledger_of(client).engine]
    seen = Counted()

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        if threading.current_thread().name not in BACKGROUND:
            seen.statements.append(text)
            if text.lstrip().upper().startswith(WRITES):
                seen.writing.add(id(conn))

    def commit(conn: Any) -> None:
        if threading.current_thread().name not in BACKGROUND and id(conn) in seen.writing:
            seen.writing.discard(id(conn))
            seen.writes += 1

    def rollback(conn: Any) -> None:
        seen.writing.discard(id(conn))

    for engine in engines:
        event.listen(engine, "before_cursor_execute", statement)
        event.listen(engine, "commit", commit)
        event.listen(engine, "rollback", rollback)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", statement)
            event.remove(engine, "commit", commit)
            event.remove(engine, "rollback", rollback)


def _refused_batch(client: TestClient, key: str, nodes: list[str], mode: str) -> list[str]:
    body = {"nodes": nodes, "mode": mode, "epsilon": 0.1, "fresh": True}
    response = client.post("/v1/ppr/batch", json=body, headers=bearer(key))
    assert response.status_code == 200, response.text
    return [item["error"]["code"] for item in response.json()["items"]]


def _refusals(client: TestClient, admin_key: str) -> dict[str, int]:
    answer = client.get("/v1/admin/refusals", headers=bearer(admin_key))
    assert answer.status_code == 200, answer.text
    by_reason: dict[str, int] = answer.json()["by_reason"]
    return by_reason


@pytest.mark.parametrize(
    ("way", "fields", "mode"),
    [
        ("budget_exhausted", {"cap_epsilon": 0.01, "modes": ["edge"]}, "edge"),
        ("mode_not_allowed", {"modes": ["edge"]}, "personalized"),
        ("service_quota_exhausted",
         {"modes": ["edge", "personalized"], "quota_epsilon": 0.01}, "personalized"),
    ],
)  # fmt: skip
def test_an_all_refused_batch_costs_the_same_few_transactions_at_any_size(
    client: TestClient, counted: Counted, way: str, fields: dict[str, Any], mode: str
) -> None:
    accounts = Accounts(client)
    ledger = ledger_of(client)
    for node in range(60):  # the seed users a personalized batch charges
        ledger.accounts.create_account("user", node_id=str(node), cap_epsilon=10.0, delta=1e-6)
    _, key = accounts.service(**fields)
    costs: dict[int, tuple[int, int]] = {}  # size: (transactions that wrote, statements)
    for size in (5, 10, 60):  # the first also reads what is cached afterwards (the key, ...)
        counted.clear()
        codes = _refused_batch(client, key, [str(n) for n in range(size)], mode)
        assert codes == [way] * size
        inserts = [s for s in counted.statements if s.lstrip().upper().startswith("INSERT")]
        assert len(inserts) == 1 and "refusals" in inserts[0], inserts
        costs[size] = (counted.writes, len(counted.statements))
    # before: one transaction per refused item; and no statement per item either (a cached
    # value re-read on its expiry adds one or two to whichever batch it falls in)
    assert costs[60][0] == costs[10][0] <= 2, costs
    assert costs[60][1] <= costs[10][1] + 4, costs
    assert _refusals(client, accounts.admin_key) == {way: 75}
    assert not ledger.reports.list_charges(None, limit=10)


def test_seed_accounts_are_read_together_only_for_nodes_of_the_graph(client: TestClient) -> None:
    """A personalized batch's seed accounts are read in one query, but only for nodes of the
    graph: an id PostgreSQL cannot hold (a NUL) is refused as an unknown node, never a 500."""
    accounts = Accounts(client)
    ledger = ledger_of(client)
    for node in ("1", "2"):
        ledger.accounts.create_account("user", node_id=node, cap_epsilon=10.0, delta=1e-6)
    _, key = accounts.service(modes=["edge", "personalized"])
    body = {"nodes": ["1", "a\x00b", "2", "no-such-node"], "mode": "personalized"}
    response = client.post("/v1/ppr/batch", json=body, headers=bearer(key))
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item.get("error", {}).get("code") for item in items] == [
        None, "unknown_node", None, "unknown_node",
    ]  # fmt: skip


def test_a_group_counts_its_own_charges_against_the_service_quota(client: TestClient) -> None:
    """The quota window is read once per group and the group adds what it charges: a quota of
    0.45 with 0.2 already charged admits exactly two more items of 0.1 in the next batch and
    refuses the rest, as one transaction per item would."""
    accounts = Accounts(client)
    ledger = ledger_of(client)
    for node in range(8):
        ledger.accounts.create_account("user", node_id=str(node), cap_epsilon=10.0, delta=1e-6)
    _, key = accounts.service(modes=["edge", "personalized"], quota_epsilon=0.45)
    body: dict[str, Any] = {"mode": "personalized", "epsilon": 0.1, "fresh": True,
                            "mechanism": "noisy_diffusion"}  # fmt: skip
    first = client.post("/v1/ppr/batch", json={**body, "nodes": ["0", "1"]}, headers=bearer(key))
    assert [i.get("error") for i in first.json()["items"]] == [None, None], first.text
    second = client.post(
        "/v1/ppr/batch", json={**body, "nodes": ["2", "3", "4", "5", "6"]}, headers=bearer(key)
    )
    codes = [i.get("error", {}).get("code") for i in second.json()["items"]]
    assert codes == [None, None] + ["service_quota_exhausted"] * 3, second.text
    assert len(ledger.reports.list_charges(None, limit=100)) == 4
