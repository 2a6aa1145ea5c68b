"""``POST /v1/embeddings/batch`` on SQLite and on PostgreSQL + Redis: every item is the single
``GET /v1/embeddings/{node}`` (charged once, stored, replayed free, idempotent under the batch's
key, listed), a refused item charges nothing, and bad input is one 4xx with nothing charged."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.embeddings.dp import plan_dp_instant_embedding
from service.serving.batch import item_idempotency_key
from tests import test_api
from tests.api_support import GRAPH_NODES, bearer, ledger_of
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
    plan = plan_dp_instant_embedding(0.25, 1e-3, GRAPH_NODES)
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
    charges = ledger_of(client).list_charges(service_id)
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
    assert ledger_of(client).verify().mismatches == []


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
    assert len(ledger_of(client).list_charges(account_id)) == 1
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
        charges = ledger.list_charges(seed)
        assert [(c.principal_account_id, c.mechanism) for c in charges] == [
            (service_id, "dp_instant_embedding")
        ]
    assert ledger.list_charges(service_id) == []


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
