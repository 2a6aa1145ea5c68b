"""``POST /v1/embeddings/batch`` on SQLite and on PostgreSQL + Redis: every item is charged as
the single ``GET /v1/embeddings/{node}`` would be (charged once, stored, replayed free,
idempotent under the batch's key, listed), a refused item charges nothing, and bad input is one
4xx with nothing charged. The batch is admitted in one ledger transaction and stored in one: a
budget that runs out mid-batch refuses exactly the items it cannot pay for, two workers at
once never charge past it, releases that cannot be stored are never sent, and a batch whose
worker died between charge and release is reconciled and retried."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text

from service.cli import main as cli_main
from service.embeddings.dp import EMBEDDING_ROUNDS, plan_dp_instant_embedding
from service.graph.generate import write_generated_edge_list
from service.graph.public_bounds import DEFAULT_MAX_DEGREE_BOUND
from service.ledger import upgrade
from service.privacy.modes import Mode
from service.serving.batch import item_idempotency_key
from service.serving.embedding_batch import EmbeddingBatchRequest
from service.serving.schemas import Principal
from tests import test_api
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    bearer,
    database_goes_away_then,
    ledger_of,
    open_ledger,
    running_app,
)
from tests.conftest import POSTGRES_BASE_URL
from tests.test_api import Accounts, charge_count
from tests.test_embedding_api import embed

backend = test_api.backend
client = test_api.client
accounts = test_api.accounts


def embed_batch(
    client: TestClient, key: str, nodes: list[str], idempotency_key: str | None = None, **body: Any
) -> Any:
    headers = bearer(key)
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return client.post("/v1/embeddings/batch", json={"nodes": nodes, **body}, headers=headers)


def test_each_item_is_charged_once_and_a_retry_with_the_key_replays_it(
    client: TestClient, accounts: Accounts
) -> None:
    service_id, key = accounts.service(modes=["edge"])
    nodes = ["3", "4", "nope", "5"]
    first = embed_batch(client, key, nodes, "nightly-1", mode="edge", k=8, epsilon=0.25)
    assert first.status_code == 200, first.text
    body = first.json()
    plan = plan_dp_instant_embedding(
        0.25, 1e-3, GRAPH_NODES, rounds=EMBEDDING_ROUNDS, degree_bound=DEFAULT_MAX_DEGREE_BOUND
    )
    assert [item["node"] for item in body["items"]] == nodes
    answered = [item for item in body["items"] if "error" not in item]
    assert len(answered) == 3, [i["error"] for i in body["items"] if "error" in i]
    assert body["items"][2]["error"]["code"] == "unknown_node"
    for item in answered:
        assert len(item["embedding"]) == 8 and item["replayed"] is False
        m = item["mechanism"]
        assert m["name"] == "dp_instant_embedding" and m["mode"] == "edge"
        assert m["noise_scale"] == plan.scale and m["dimension"] == 8
        assert item["epsilon_charged"] == plan.epsilon
        assert item["graph_version"]
    assert body["epsilon_charged"] == pytest.approx(3 * plan.epsilon)
    charges = ledger_of(client).reports.list_charges(service_id)
    assert sorted(c.seed for c in charges) == ["3", "4", "5"]
    assert {(c.mechanism, c.mode, c.state) for c in charges} == {
        ("dp_instant_embedding", "edge", "released")
    }
    # each item carries the key derived from the batch's, as a ranking batch's items do
    assert {c.idempotency_key for c in charges} == {
        item_idempotency_key("nightly-1", i, node) for i, node in enumerate(nodes) if node != "nope"
    }
    # the retried batch (same key) charges nothing and answers every item with its release
    again = embed_batch(client, key, nodes, "nightly-1", mode="edge", k=8, epsilon=0.25)
    assert again.status_code == 200, again.text
    assert again.json()["epsilon_charged"] == 0.0
    for before, after in zip(body["items"], again.json()["items"], strict=True):
        if "error" in before:
            assert after["error"]["code"] == before["error"]["code"]
            continue
        assert after["replayed"] is True and after["epsilon_charged"] == 0.0
        assert after["embedding"] == before["embedding"]
    # the identical single query replays the batch's release too: one path, one store
    single = embed(client, key, "4", mode="edge", k=8, epsilon=0.25)
    assert single.json()["replayed"] is True
    assert single.json()["embedding"] == body["items"][1]["embedding"]
    assert charge_count(client) == 3
    assert ledger_of(client).reports.verify().mismatches == []


def test_fresh_draws_anew_and_a_refused_item_charges_nothing(
    client: TestClient, accounts: Accounts
) -> None:
    account_id, key = accounts.user("9", cap_epsilon=0.3)
    _, other = accounts.user("10")
    first = embed_batch(client, key, ["9"], epsilon=0.25, k=8)
    assert first.status_code == 200, first.text
    assert first.json()["items"][0]["replayed"] is False
    # a user may embed only its own node; past its cap an item is refused before any draw
    mixed = embed_batch(client, key, ["9", "10"], epsilon=0.25, k=8, fresh=True)
    assert mixed.status_code == 200, mixed.text
    codes = [item["error"]["code"] for item in mixed.json()["items"]]
    assert codes == ["budget_exhausted", "forbidden"]
    assert mixed.json()["epsilon_charged"] == 0.0
    assert len(ledger_of(client).reports.list_charges(account_id)) == 1
    # without fresh the stored release is replayed, free, even with the budget spent
    replay = embed_batch(client, key, ["9"], epsilon=0.25, k=8).json()["items"][0]
    assert replay["replayed"] is True
    assert replay["embedding"] == first.json()["items"][0]["embedding"]
    assert other and charge_count(client) == 1


def test_personalized_items_are_charged_to_each_seed_user(
    client: TestClient, accounts: Accounts
) -> None:
    seed_a, _ = accounts.user("13")
    seed_b, _ = accounts.user("14")
    service_id, key = accounts.service(modes=["edge", "personalized"])
    answer = embed_batch(client, key, ["13", "14", "15"], mode="personalized", k=4)
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    assert [("error" in item) for item in items] == [False, False, True]
    assert items[2]["error"]["code"] == "unknown_account"  # node 15 has no account
    ledger = ledger_of(client)
    for seed in (seed_a, seed_b):
        charges = ledger.reports.list_charges(seed)
        assert [(c.principal_account_id, c.mechanism) for c in charges] == [
            (service_id, "dp_instant_embedding")
        ]
    assert ledger.reports.list_charges(service_id) == []


def test_bad_input_is_one_error_and_nothing_charged(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.user("5")
    _, service_key = accounts.service(modes=["edge"])
    admin = accounts.admin_key
    cases = [
        (embed_batch(client, key, ["5"], k=0), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"], k=5000), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"], sigma=1e-7), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"], sigma=3.0), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"], epsilon=50.0), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"], mode="joint"), 422, "invalid_parameter"),
        (embed_batch(client, key, [5]), 422, "invalid_parameter"),
        (embed_batch(client, key, []), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"], extra=1), 422, "invalid_parameter"),
        (embed_batch(client, key, ["5"] * 1001), 422, "invalid_parameter"),
        (embed_batch(client, admin, ["5"]), 403, "forbidden"),
        (client.get("/v1/embeddings/batch", headers=bearer(key)), 405, "method_not_allowed"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code, response.text
    # a mode the service account lacks, or an unknown node: per item, nothing charged
    refused = embed_batch(client, service_key, ["5", "nope"], mode="personalized").json()
    assert [item["error"]["code"] for item in refused["items"]] == [
        "mode_not_allowed",
        "unknown_node",
    ]
    assert charge_count(client) == 0


# -- one admission for the batch, and what the budget allows ---------------------------------


def _single_answers_until_refused(client: TestClient, key: str, node: str, **params: Any) -> int:
    """How many fresh single DP-IE requests the account of ``key`` is answered before the
    first refusal: what its budget allows, as the single path decides it."""
    for answered in range(20):
        response = embed(client, key, node, fresh="true", **params)
        if response.status_code != 200:
            assert response.json()["error"]["code"] == "budget_exhausted", response.text
            return answered
    raise AssertionError("the budget never ran out")


def test_a_budget_that_runs_out_mid_batch_refuses_exactly_the_items_it_cannot_pay(
    client: TestClient, accounts: Accounts
) -> None:
    """Items are admitted in order against what the earlier items left, as single requests
    would be: a user's items past its budget are refused, the other users' are answered."""
    _, reference_key = accounts.user("20", cap_epsilon=0.6)
    allowed = _single_answers_until_refused(client, reference_key, "20", k=4, epsilon=0.2)
    assert 1 <= allowed < 5
    poor, _ = accounts.user("21", cap_epsilon=0.6)
    rich, _ = accounts.user("22", cap_epsilon=100.0)
    service_id, key = accounts.service(modes=["personalized"])
    nodes = ["21", "22"] * 5
    answer = embed_batch(client, key, nodes, mode="personalized", k=4, epsilon=0.2, fresh=True)
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    poor_codes = [item.get("error", {}).get("code") for item in items[0::2]]
    assert poor_codes == [None] * allowed + ["budget_exhausted"] * (5 - allowed)
    assert all("error" not in item for item in items[1::2])
    ledger = ledger_of(client)
    assert len(ledger.reports.list_charges(poor)) == allowed
    assert len(ledger.reports.list_charges(rich)) == 5
    assert ledger.budgets.budget(poor).remaining_epsilon >= 0.0
    charged = sum(item.get("epsilon_charged", 0.0) for item in items)
    assert answer.json()["epsilon_charged"] == pytest.approx(charged)
    assert ledger.reports.list_charges(service_id) == []
    assert ledger.reports.verify().mismatches == []


def test_a_repeated_seed_is_charged_once_within_the_batch(
    client: TestClient, accounts: Accounts
) -> None:
    """Two identical items of one batch: the second joins the first's charge in the batch's
    own admission and is answered with its release once stored."""
    service_id, key = accounts.service(modes=["edge"])
    answer = embed_batch(client, key, ["6", "7", "6"], "twins-1", mode="edge", k=4, epsilon=0.2)
    assert answer.status_code == 200, answer.text
    first, _, again = answer.json()["items"]
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert again["embedding"] == first["embedding"] and again["epsilon_charged"] == 0.0
    charges = ledger_of(client).reports.list_charges(service_id)
    assert sorted(c.seed for c in charges) == ["6", "7"]
    assert {c.state for c in charges} == {"released"}


class _Transactions:
    """The ledger's committed transactions that inserted charges, releases, and reads (a
    service account's read figure); a statement that stores releases committed on its own
    counts as one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.charging = 0
        self.storing = 0
        self.reading = 0
        event.listen(engine, "begin", self._begin)
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def close(self) -> None:
        event.remove(self.engine, "begin", self._begin)
        event.remove(self.engine, "before_cursor_execute", self._statement)
        event.remove(self.engine, "commit", self._commit)

    def _begin(self, conn: Connection) -> None:
        conn.info["inserted"] = set()

    def _statement(self, conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        words = " ".join(statement.split()[:3]).lower()
        if words == "with settled as" and "INSERT INTO releases" in statement:
            self.storing += 1  # PostgreSQL: one statement committed on its own stores them
        elif words in ("insert into charges", "insert into releases", "insert into service_reads"):
            conn.info.setdefault("inserted", set()).add(words.rsplit(" ", 1)[1])

    def _commit(self, conn: Connection) -> None:
        inserted = conn.info.pop("inserted", set())
        self.charging += "charges" in inserted
        self.storing += "releases" in inserted
        self.reading += "service_reads" in inserted


def test_the_batch_is_admitted_in_one_transaction_and_stored_in_one(
    client: TestClient, accounts: Accounts
) -> None:
    """Six items charged (one replay left out), each as a single request: the charges are
    written by one ledger transaction, the service account's reads of them by one and the
    releases by one, whatever the item count."""
    service_id, key = accounts.service(modes=["edge"])
    assert embed_batch(client, key, ["3"], mode="edge", k=4).status_code == 200
    ledger = ledger_of(client)
    counted = _Transactions(ledger.engine)
    try:
        nodes = ["3", "4", "5", "6", "7", "8", "9"]
        answer = embed_batch(client, key, nodes, "one-transaction", mode="edge", k=4)
    finally:
        counted.close()
    assert answer.status_code == 200, answer.text
    assert [item["replayed"] for item in answer.json()["items"]] == [True] + [False] * 6
    assert len(ledger.reports.list_charges(service_id)) == 7
    assert (counted.charging, counted.reading, counted.storing) == (1, 1, 1)


# -- two clients at once -----------------------------------------------------------------------


@pytest.mark.parametrize("same_key", [True, False], ids=["same-key", "own-keys"])
def test_two_clients_at_once_never_charge_past_the_budget(
    backend: Backend, client: TestClient, accounts: Accounts, same_key: bool
) -> None:
    """Two apps on the same ledger (two workers) send a user's batches at the same moment,
    with more items than the budget pays for: the ledger admits exactly what the budget
    allows, never more, and an item key is charged at most once."""
    _, reference_key = accounts.user("40", cap_epsilon=0.6)
    allowed = _single_answers_until_refused(client, reference_key, "40", k=4, epsilon=0.2)
    account_id, key = accounts.user("41", cap_epsilon=0.6)
    nodes = ["41"] * 6
    barrier = threading.Barrier(2)

    def send(app: TestClient, idem: str) -> Any:
        barrier.wait()
        return embed_batch(app, key, nodes, idem, k=4, epsilon=0.2, fresh=True)

    with running_app(backend) as other, ThreadPoolExecutor(2) as pool:
        keys = ("night", "night") if same_key else ("night-a", "night-b")
        answers = list(pool.map(send, (client, other), keys))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    ledger = ledger_of(client)
    live = [c for c in ledger.reports.list_charges(account_id) if c.state != "refunded"]
    assert len(live) == allowed
    assert {c.state for c in live} == {"released"}
    assert ledger.budgets.budget(account_id).remaining_epsilon >= 0.0
    per_key = Counter(c.idempotency_key for c in live)
    assert set(per_key.values()) == {1}
    charged = [item for a in answers for item in a.json()["items"] if "error" not in item]
    assert sum(not item["replayed"] for item in charged) == allowed
    codes = {
        item["error"]["code"] for a in answers for item in a.json()["items"] if "error" in item
    }
    assert codes <= {"budget_exhausted", "request_in_progress"}
    if same_key:  # one charge per item key: both answers carry its one release
        one, two = ([item.get("embedding") for item in a.json()["items"]] for a in answers)
        assert all(x == y for x, y in zip(one, two, strict=True) if x and y)
    assert ledger.reports.verify().mismatches == []


# -- a worker that died between the batch's charge and its releases ----------------------------


def test_a_dead_workers_batch_is_reconciled_and_retried(backend: Backend) -> None:
    """A batch admitted by a worker that died before storing its releases: a retry under the
    same key waits for them (409 per item, nothing charged), reconciliation refunds the
    charges (nothing left the process), and the next retry charges each item once."""
    with running_app(backend, twin_wait_seconds=0.3, reconcile_interval_seconds=0) as client:
        accounts = Accounts(client)
        service_id, key = accounts.service(modes=["edge"])
        principal = Principal(account_id=service_id, type="service", modes=("edge",))
        nodes = ["11", "12", "13"]
        request = EmbeddingBatchRequest(
            principal=principal, nodes=nodes, k=4, epsilon=0.2, mode=Mode.EDGE,
            idempotency_key="night-1", request_id="killed-worker",
        )  # fmt: skip
        dp = client.app.state.runtime.embeddings.dp  # type: ignore[attr-defined]
        items = [request.item(i) for i in range(len(nodes))]
        pending = dp.prepare_group(items, _no_settle).to_admit
        receipts = ledger_of(client).admission.admit_and_charge_many(
            [dp.admission(p) for _, p in pending]
        )
        assert len(receipts) == 3 and all(not isinstance(r, Exception) for r in receipts)
        busy = embed_batch(client, key, nodes, "night-1", mode="edge", k=4, epsilon=0.2).json()
        assert [item["error"]["code"] for item in busy["items"]] == ["request_in_progress"] * 3
        assert busy["epsilon_charged"] == 0.0
        code = cli_main(
            ["ledger", "reconcile", "--older-than", "0", "--database-url", backend.database_url]
        )
        assert code == 0
        assert ledger_of(client).budgets.budget(service_id).charges == 0
        retried = embed_batch(client, key, nodes, "night-1", mode="edge", k=4, epsilon=0.2)
        assert [item["replayed"] for item in retried.json()["items"]] == [False] * 3
        again = embed_batch(client, key, nodes, "night-1", mode="edge", k=4, epsilon=0.2)
        assert [item["replayed"] for item in again.json()["items"]] == [True] * 3
        assert [i["embedding"] for i in again.json()["items"]] == [
            i["embedding"] for i in retried.json()["items"]
        ]
        states = Counter(c.state for c in ledger_of(client).reports.list_charges(service_id))
        assert states == {"refunded": 3, "released": 3}
        assert ledger_of(client).reports.verify().mismatches == []


def _no_settle(index: int, outcome: Any) -> None:
    raise AssertionError(f"item {index} was not prepared for admission: {outcome!r}")


@pytest.mark.postgres
def test_releases_that_cannot_be_stored_are_never_sent(postgres_url: str, tmp_path: Path) -> None:
    """PostgreSQL refuses connections between the batch's charge and its releases: every item
    is `ledger_unavailable` without its embedding, the charges stay admitted and are
    reconciled later."""
    upgrade(postgres_url)
    graph = tmp_path / "graph.txt"
    write_generated_edge_list(graph, GRAPH_NODES, GRAPH_EDGES, seed=7)
    name = make_url(postgres_url).database
    admin = create_engine(POSTGRES_BASE_URL, isolation_level="AUTOCOMMIT")
    try:
        pg = Backend("postgres", postgres_url, None, graph)
        with running_app(pg, reconcile_interval_seconds=0) as client:
            service_id, key = Accounts(client).service(modes=["edge"])
            ledger = ledger_of(client)
            # the batch's releases are stored together: that one transaction is lost
            ledger.settlement.store_releases = database_goes_away_then(
                admin, name, ledger.settlement.store_releases
            )
            answer = embed_batch(client, key, ["3", "4", "5"], mode="edge", k=4, epsilon=0.2)
            assert answer.status_code == 200, answer.text
            items = answer.json()["items"]
            assert [item["error"]["code"] for item in items] == ["ledger_unavailable"] * 3
            assert "embedding" not in answer.text
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        with open_ledger(postgres_url) as ledger:
            charges = ledger.reports.list_charges(service_id)
            assert sorted(c.state for c in charges) == ["admitted"] * 3
            assert sorted(ledger.settlement.reconcile(older_than_seconds=0)) == sorted(
                c.charge_id for c in charges
            )
            assert ledger.budgets.budget(service_id).charges == 0
            assert ledger.reports.verify().mismatches == []
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()
