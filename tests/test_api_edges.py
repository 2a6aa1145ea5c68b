"""What a hostile caller tries at the edges of the HTTP API: out-of-range ids and offsets,
control characters, budgets that are typos, malformed JSON, integer "booleans", node ids with
a ``/``, probing for nodes, wrong methods. Each gets a 4xx with a stable code (never a 500),
on the embedded default and on PostgreSQL + Redis alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.params import ID_MAX
from service.graph.generate import write_generated_edge_list
from tests.api_support import Backend, bearer, running_app
from tests.test_api import (  # fixtures by name
    Accounts,
    accounts,
    backend,
    charge_count,
    client,
    query,
)


def refused(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_ids_beyond_the_columns_are_422_not_500(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    for big in (ID_MAX + 1, 2**63, 10**30):
        calls = [
            client.get(f"/v1/admin/accounts/{big}", headers=admin),
            client.put(f"/v1/admin/accounts/{big}/budget", json={"cap_epsilon": 1}, headers=admin),
            client.put(f"/v1/admin/accounts/{big}/scopes", json={"modes": ["edge"]}, headers=admin),
            client.get(f"/v1/admin/accounts/{big}/keys", headers=admin),
            client.post(f"/v1/admin/accounts/{big}/keys", headers=admin),
            client.post(f"/v1/admin/keys/{big}/revoke", headers=admin),
            client.get("/v1/admin/charges", params={"account_id": big}, headers=admin),
            client.get("/v1/admin/accounts", params={"offset": big}, headers=admin),
            client.get("/v1/admin/charges", params={"offset": big}, headers=admin),
        ]
        for response in calls:
            refused(response, 422, "invalid_parameter")
    # the largest id the schema allows is simply not found
    refused(client.get(f"/v1/admin/accounts/{ID_MAX}", headers=admin), 404, "unknown_account")
    last_page = client.get("/v1/admin/accounts", params={"offset": ID_MAX}, headers=admin)
    assert last_page.status_code == 200 and last_page.json() == []


def test_labels_and_node_ids_refuse_control_characters(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    for body in (
        {"type": "service", "label": "a\x00b"},
        {"type": "service", "label": "line\nbreak"},
        {"type": "user", "node_id": "a\x00"},
    ):
        refused(client.post("/v1/admin/accounts", json=body, headers=admin), 422,
                "invalid_parameter")  # fmt: skip
    ok = client.post(
        "/v1/admin/accounts", json={"type": "service", "label": "backend ü"}, headers=admin
    )
    assert ok.status_code == 201 and ok.json()["label"] == "backend ü"


BAD_BUDGETS: list[dict[str, Any]] = [
    {"cap_epsilon": 5e-324},
    {"cap_epsilon": 0},
    {"cap_epsilon": 1e4},
    {"delta": 0.999},
    {"delta": 1e-3},
    {"delta": 1e-300},
    {"cap_epsilon": "1"},
]


def test_budgets_outside_the_sane_range_are_422(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    account_id, _ = accounts.service()
    for budget in BAD_BUDGETS:
        created = client.post(
            "/v1/admin/accounts", json={"type": "service", **budget}, headers=admin
        )
        refused(created, 422, "invalid_parameter")
        assert created.json()["error"]["details"]["parameter"] == next(iter(budget))
        changed = client.put(f"/v1/admin/accounts/{account_id}/budget", json=budget, headers=admin)
        refused(changed, 422, "invalid_parameter")
    sane = client.put(
        f"/v1/admin/accounts/{account_id}/budget",
        json={"cap_epsilon": 1e-6, "delta": 9.9e-4},
        headers=admin,
    )
    assert sane.status_code == 200


def test_malformed_json_is_400_and_integer_booleans_are_refused(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    not_json = client.post(
        "/v1/admin/accounts",
        content=b'{"type": ',
        headers={**admin, "Content-Type": "application/json"},
    )
    refused(not_json, 400, "malformed_json")
    integer_flag = client.post(
        "/v1/admin/accounts",
        json={"type": "service", "may_create_seed_accounts": 1},
        headers=admin,
    )
    refused(integer_flag, 422, "invalid_parameter")
    _, key = accounts.user("7")
    for value in ("1", "0", "yes", "on"):
        refused(query(client, key, "7", fresh=value), 422, "invalid_parameter")
    assert query(client, key, "7", fresh="true", k=3).status_code == 200
    assert charge_count(client) == 1


def test_a_user_cannot_tell_other_nodes_from_missing_ones(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("12")
    other = query(client, key, "13")
    missing = query(client, key, "no-such-node")
    refused(other, 403, "forbidden")
    refused(missing, 403, "forbidden")
    assert other.json() == missing.json()
    _, service_key = accounts.service()
    refused(query(client, service_key, "no-such-node"), 404, "unknown_node")
    assert charge_count(client) == 0


def test_node_ids_with_a_slash_can_be_queried(backend: Backend) -> None:
    with open(backend.graph_path, "a") as edges:
        edges.write("team/1 0\nteam/1 1\nteam/1 2\n")
    with running_app(backend) as client:
        accounts = Accounts(client)
        _, key = accounts.user("team/1")
        answer = client.get("/v1/ppr/team%2F1", params={"k": 2}, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        assert answer.json()["node"] == "team/1"
        refused(client.get("/v1/ppr/team%2F2", headers=bearer(key)), 403, "forbidden")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # routing, not storage
def test_405_lists_every_method_of_the_path(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    wrong = client.delete("/v1/admin/accounts", headers=admin)
    refused(wrong, 405, "method_not_allowed")
    assert wrong.headers["Allow"] == "GET, POST"
    assert client.patch("/v1/admin/accounts/1/keys", headers=admin).headers["Allow"] == "GET, POST"
    assert client.post("/v1/me/budget", headers=admin).headers["Allow"] == "GET"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_schema_states_bounds_and_errors(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ppr = schema["paths"]["/v1/ppr/{node_id}"]["get"]
    params = {p["name"]: p for p in ppr["parameters"]}
    (k,) = [b for b in params["k"]["schema"]["anyOf"] if b.get("type") == "integer"]
    assert (k["minimum"], k["maximum"]) == (1, 1000)
    (eps,) = [b for b in params["epsilon"]["schema"]["anyOf"] if b.get("type") == "number"]
    assert (eps["minimum"], eps["maximum"]) == (0.01, 2.0)
    assert params["node_id"]["schema"]["maxLength"] == 1024
    assert {"401", "403", "404", "422", "500", "503"} <= set(ppr["responses"])
    # no body, so no malformed JSON: its only 400 is two Authorization headers
    assert "malformed_json" not in ppr["responses"]["400"]["description"]
    assert "duplicate_header" in ppr["responses"]["400"]["description"]
    account = schema["paths"]["/v1/admin/accounts/{account_id}"]["get"]
    (account_id,) = account["parameters"]
    assert account_id["schema"]["minimum"] == 1 and account_id["schema"]["maximum"] == ID_MAX
    create = schema["paths"]["/v1/admin/accounts"]["post"]
    assert {"400", "413", "415", "500", "503"} <= set(create["responses"])
    health = schema["paths"]["/healthz"]["get"]
    assert set(health["responses"]) == {"200"}


def test_graph_reload_loads_only_files_inside_the_graph_directory(
    backend: Backend, tmp_path: Path
) -> None:
    graphs = tmp_path / "graphs"
    (graphs / "2026-11").mkdir(parents=True)
    write_generated_edge_list(graphs / "2026-11" / "edges.txt", 300, 1500, seed=3)
    (graphs / "out").symlink_to(backend.graph_path)  # a link pointing out of the directory
    reload = "/v1/admin/graph/reload"

    with running_app(backend) as client:  # no PPR_GRAPH_DIR: only the configured file
        admin = bearer(Accounts(client).admin_key)
        refused(client.post(reload, json={"path": "x.txt"}, headers=admin), 422,
                "invalid_parameter")  # fmt: skip
        assert client.post(reload, headers=admin).status_code == 200  # no body: as before

    with running_app(backend, graph_dir=graphs) as client:
        admin = bearer(Accounts(client).admin_key)
        before = client.get("/v1/admin/graph", headers=admin).json()
        for bad in ("../graph.txt", str(backend.graph_path), "out", "missing.txt", ".", "a\x00"):
            answer = client.post(reload, json={"path": bad}, headers=admin)
            refused(answer, 422, "invalid_parameter")
            assert answer.json()["error"]["details"]["parameter"] == "path", answer.text
        for bad_body in ({"file": "2026-11/edges.txt"}, ["2026-11/edges.txt"], {"path": 3}):
            refused(client.post(reload, json=bad_body, headers=admin), 422, "invalid_parameter")
        assert client.get("/v1/admin/graph", headers=admin).json()["version"] == before["version"]

        loaded = client.post(reload, json={"path": "2026-11/edges.txt"}, headers=admin)
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["nodes"] == 300 and loaded.json()["version"] != before["version"]
        assert loaded.json()["source"] == str((graphs / "2026-11" / "edges.txt").resolve())
        again = client.post(reload, json={}, headers=admin)  # the chosen file stays current
        assert again.status_code == 200 and again.json()["source"] == loaded.json()["source"]
        audit = client.get("/v1/admin/audit", headers=admin).json()
        assert any(e["action"] == "graph.reload" for e in audit)
