"""The refresh policy over HTTP: a backend asks as often as it likes and is charged only when
the policy allows a new draw (``refresh=on_new_version|max_age:<n><unit>|always``), on SQLite
and on PostgreSQL + Redis (where replays come from the shared cache)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from service.graph.generate import write_generated_edge_list
from tests.api_support import GRAPH_EDGES, GRAPH_NODES, Backend, bearer
from tests.test_api import Accounts, accounts, backend, charge_count, client, query

# it mostly waits (15.2 s, 1.9 CPU-s in a run of the suite): scheduled apart, conftest.py
pytestmark = pytest.mark.waits


def test_a_hundred_asks_in_one_graph_version_charge_once_and_a_reload_once_more(
    backend: Backend, client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("9")
    admin = bearer(accounts.admin_key)

    def ask(_: int) -> dict[str, object]:
        response = query(client, key, "9", k=10, epsilon=0.1, refresh="on_new_version")
        assert response.status_code == 200, response.text
        body: dict[str, object] = response.json()
        return body

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(100)))
    assert charge_count(client) == 1
    assert sum(not a["replayed"] for a in answers) == 1
    assert len({str(a["results"]) for a in answers}) == 1  # one release, replayed 99 times
    replay = next(a for a in answers if a["replayed"])
    assert replay["epsilon_charged"] == 0 and isinstance(replay["age_seconds"], float)
    released = datetime.fromisoformat(str(replay["released_at"]))
    assert abs((datetime.now(UTC) - released).total_seconds()) < 120

    write_generated_edge_list(backend.graph_path, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
    assert client.post("/v1/admin/graph/reload", headers=admin).status_code == 200
    with ThreadPoolExecutor(8) as pool:
        after = list(pool.map(ask, range(100)))
    assert charge_count(client) == 2
    assert sum(not a["replayed"] for a in after) == 1


def test_max_age_replays_a_young_release_and_draws_once_it_is_due(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("12")
    first = query(client, key, "12", k=10, epsilon=0.1, refresh="max_age:3s").json()
    assert first["replayed"] is False and "age_seconds" not in first
    young = query(client, key, "12", k=10, epsilon=0.1, refresh="max_age:3s").json()
    assert young["replayed"] is True and 0 <= young["age_seconds"] < 3
    assert young["results"] == first["results"] and charge_count(client) == 1
    time.sleep(3.05)

    def ask(_: int) -> dict[str, object]:
        response = query(client, key, "12", k=10, epsilon=0.1, refresh="max_age:3s")
        assert response.status_code == 200, response.text
        body: dict[str, object] = response.json()
        return body

    with ThreadPoolExecutor(8) as pool:  # identical due queries arriving together: one draw
        answers = list(pool.map(ask, range(24)))
    assert charge_count(client) == 2
    fresh = [a for a in answers if not a["replayed"]]
    assert len(fresh) == 1 and fresh[0]["epsilon_charged"] > 0
    due = fresh[0]
    assert due["results"] != first["results"]
    assert all(a["results"] == due["results"] for a in answers)
    # the default policy replays the newest release, whatever its age
    again = query(client, key, "12", k=10, epsilon=0.1).json()
    assert again["replayed"] is True and again["results"] == due["results"]
    # always is fresh=true
    drawn = query(client, key, "12", k=10, epsilon=0.1, refresh="always").json()
    assert drawn["replayed"] is False and charge_count(client) == 3
    # fresh=true wins over any policy: it asks for new noise
    fresher = query(client, key, "12", k=10, epsilon=0.1, fresh="true", refresh="max_age:7d")
    assert fresher.json()["replayed"] is False and charge_count(client) == 4


def test_a_batch_refreshes_only_the_seeds_whose_answers_are_due(
    client: TestClient, accounts: Accounts
) -> None:
    _, service_key = accounts.service(modes=["edge"])
    body = {"nodes": ["3", "4"], "mode": "edge", "epsilon": 0.1, "k": 5, "refresh": "max_age:3s"}
    headers = bearer(service_key)
    first = client.post("/v1/ppr/batch", json={**body, "nodes": ["3"]}, headers=headers)
    assert first.status_code == 200, first.text
    time.sleep(3.05)
    client.post("/v1/ppr/batch", json={**body, "nodes": ["4"]}, headers=headers)  # young
    both = client.post("/v1/ppr/batch", json=body, headers=headers).json()
    assert [item["replayed"] for item in both["items"]] == [False, True]  # 3 was due
    assert charge_count(client) == 3


def test_bad_policies_are_refused_with_nothing_charged(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("5")
    for params in (
        {"refresh": "weekly"},
        {"refresh": "max_age:0d"},
        {"refresh": "max_age:1234567890s"},
    ):
        response = query(client, key, "5", k=10, **params)
        assert response.status_code == 422, (params, response.text)
        assert response.json()["error"]["code"] in {"invalid_parameter", "validation_error"}
    assert charge_count(client) == 0
