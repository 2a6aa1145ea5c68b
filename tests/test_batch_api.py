"""``POST /v1/ppr/batch`` against real components (SQLite + in-process cache, and PostgreSQL +
Redis): per-item answers and errors in order, each item charged like a single query, and one
Idempotency-Key making a retried batch charge no item twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from service.serving.batch import item_idempotency_key
from tests import test_api
from tests.api_support import Backend, bearer, ledger_of, running_app
from tests.test_api import Accounts, charge_count, query

# The API tests' fixtures: the same backends (SQLite, PostgreSQL + Redis) and accounts.
backend = test_api.backend
accounts = test_api.accounts


@pytest.fixture
def client(backend: Backend) -> Iterator[TestClient]:
    with running_app(backend, batch_max_items=5, create_seed_accounts=True) as client:
        yield client


def batch(
    client: TestClient, key: str, nodes: list[Any], *, idem: str | None = None, **body: Any
) -> Any:
    headers = bearer(key)
    if idem is not None:
        headers["Idempotency-Key"] = idem
    return client.post("/v1/ppr/batch", json={"nodes": nodes, **body}, headers=headers)


def test_edge_mode_items_in_order_with_their_own_errors(
    client: TestClient, accounts: Accounts
) -> None:
    service_id, key = accounts.service()
    response = batch(client, key, ["3", "no-such-node", "7", "3"], epsilon=0.1, k=4, mode="edge")
    assert response.status_code == 200, response.text
    body = response.json()
    items = body["items"]
    assert [item["node"] for item in items] == ["3", "no-such-node", "7", "3"]
    assert items[1] == {
        "node": "no-such-node",
        "error": {
            "code": "unknown_node",
            "message": "node 'no-such-node' is not in the loaded graph",
            "details": {"node": "no-such-node"},
        },
    }
    for item in (items[0], items[2], items[3]):
        assert len(item["results"]) == 4
        assert item["node"] not in {r["node"] for r in item["results"]}
    assert items[2]["replayed"] is False and items[2]["epsilon_charged"] == pytest.approx(0.1)
    # the repeated seed is the same query: charged once, the twin answered with its release
    assert sorted([items[0]["replayed"], items[3]["replayed"]]) == [False, True]
    assert items[3]["results"] == items[0]["results"]
    assert body["epsilon_charged"] == pytest.approx(0.2)
    charges = ledger_of(client).reports.list_charges(service_id)
    assert len(charges) == 2 and {c.seed for c in charges} == {"3", "7"}
    assert {c.request_id for c in charges} <= {f"{body['request_id']}.{i}" for i in range(4)}
    # the same path as a single query: GET finds the stored release
    single = query(client, key, "7", k=4, epsilon=0.1, mode="edge")
    assert single.json()["replayed"] is True
    assert single.json()["results"] == items[2]["results"]


def test_one_idempotency_key_charges_each_item_at_most_once(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.service()
    nodes = ["10", "11", "12"]
    first = batch(client, key, nodes, idem="nightly-1", mode="edge", fresh=True, k=3)
    assert first.status_code == 200
    assert charge_count(client) == 3
    retry = batch(client, key, nodes, idem="nightly-1", mode="edge", fresh=True, k=3)
    assert [i["results"] for i in retry.json()["items"]] == [
        i["results"] for i in first.json()["items"]
    ]
    assert all(i["replayed"] for i in retry.json()["items"])
    assert retry.json()["epsilon_charged"] == 0.0
    assert charge_count(client) == 3
    # a longer retry: the items already charged are replayed, the new one charged
    longer = batch(client, key, [*nodes, "13"], idem="nightly-1", mode="edge", fresh=True, k=3)
    assert [i["replayed"] for i in longer.json()["items"]] == [True, True, True, False]
    assert charge_count(client) == 4
    # another key draws fresh noise for every item
    batch(client, key, nodes, idem="nightly-2", mode="edge", fresh=True, k=3)
    assert charge_count(client) == 7
    # a key reused for another query is that item's error, nothing charged
    clash = batch(client, key, nodes, idem="nightly-1", mode="edge", fresh=True, epsilon=0.5)
    codes = {i["error"]["code"] for i in clash.json()["items"]}
    assert codes == {"invalid_parameter"}
    assert charge_count(client) == 7


def test_item_keys_are_deterministic_and_distinct() -> None:
    key = item_idempotency_key("k", 0, "5")
    assert key == item_idempotency_key("k", 0, "5")
    assert len({key, item_idempotency_key("k", 1, "5"), item_idempotency_key("k", 0, "6"),
                item_idempotency_key("k2", 0, "5")}) == 4  # fmt: skip
    assert len(item_idempotency_key("x" * 200, 999, "y" * 200)) <= 200


def test_budget_exhausted_items_are_refused_alone(client: TestClient, accounts: Accounts) -> None:
    service_id, key = accounts.service(cap_epsilon=0.25)
    response = batch(client, key, ["1", "2", "4", "5"], mode="edge", epsilon=0.1, k=2)
    items = response.json()["items"]
    delta = ledger_of(client).budgets.account_delta(service_id)
    one = plan_diffusion(0.1, delta, 30, 0.8, 1e-7, Mode.EDGE).curve
    fits = max(q for q in range(1, 10) if (one * q).epsilon(delta) <= 0.25)
    assert 1 <= fits < 4  # the cap, not the batch, decides
    answered = [i for i in items if "results" in i]
    refused = [i for i in items if "error" in i]
    assert len(answered) == fits
    assert {i["error"]["code"] for i in refused} == {"budget_exhausted"}
    budget = ledger_of(client).budgets.budget(service_id)
    assert budget.charges == fits and budget.spent_epsilon <= budget.cap_epsilon


def test_personalized_items_charge_each_seed_user(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.service(may_create_seed_accounts=True, modes=["edge", "personalized"])
    user_id, _ = accounts.user("30")
    response = batch(client, key, ["30", "31"], k=3)
    assert [("results" in i) for i in response.json()["items"]] == [True, True]
    ledger = ledger_of(client)
    assert ledger.budgets.budget(user_id).charges == 1
    created = ledger.accounts.account_for_node("31")
    assert created is not None and ledger.budgets.budget(created.account_id).charges == 1
    # without the right to create seed accounts, the seed without one is that item's error
    _, narrow = accounts.service(modes=["personalized"])
    items = batch(client, narrow, ["30", "32"], k=3).json()["items"]
    assert "results" in items[0]
    assert items[1]["error"]["code"] == "unknown_account"


def test_whole_call_errors(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.service()
    too_many = batch(client, key, ["1", "2", "3", "4", "5", "6"], mode="edge")
    assert too_many.status_code == 422
    assert too_many.json()["error"]["details"]["parameter"] == "nodes"
    assert "PPR_BATCH_MAX_ITEMS" in too_many.json()["error"]["message"]
    for body, parameter in [
        ({"nodes": []}, "nodes"),
        ({"nodes": ["1"], "k": 0}, "k"),
        ({"nodes": ["1"], "epsilon": 9}, "epsilon"),
        ({"nodes": ["1"], "mode": "global"}, "mode"),
        ({"nodes": ["1"], "seed": 3}, "seed"),
        ({"nodes": ["1"], "mode": "edge", "exclude_neighbors": True}, "exclude_neighbors"),
    ]:
        response = client.post("/v1/ppr/batch", json=body, headers=bearer(key))
        assert response.status_code == 422, body
        assert response.json()["error"]["code"] == "invalid_parameter"
        assert response.json()["error"]["details"]["parameter"] == parameter, body
    bad_key = batch(client, key, ["1"], idem="bad\x01key")
    assert bad_key.status_code == 422
    assert client.post("/v1/ppr/batch", json={"nodes": ["1"]}).status_code == 401
    admin = batch(client, accounts.admin_key, ["1"], mode="edge")
    assert admin.status_code == 403
    assert charge_count(client) == 0


def test_openapi_documents_the_batch_with_examples(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/ppr/batch"]["post"]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schemas = spec["components"]["schemas"]
    query_schema = schemas[ref.rsplit("/", 1)[-1]]
    assert query_schema["examples"][0]["mode"] == "edge"
    answer_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    answer = schemas[answer_ref.rsplit("/", 1)[-1]]
    codes = {i.get("error", {}).get("code") for i in answer["examples"][0]["items"]}
    assert "unknown_node" in codes
    assert {"401", "403", "422"} <= set(operation["responses"])
