"""``GET /v1/embeddings/{node}`` (DP-IE) and ``GET /v1/embeddings/free/{node}`` on SQLite and
on PostgreSQL + Redis: charged to the right account and the exposure, admitted, stored before
the answer, replayed free, idempotent, counted in a service account's read figure, listed in the
charges; the free embedding charges nothing, names its release and is refused as a replay
would be; bad input is a 4xx with a stable code and nothing charged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from service.cache.replay_cache import ReplayCache
from service.embeddings.dp import EMBEDDING_ROUNDS, plan_dp_instant_embedding
from service.embeddings.hashing import embedding_hashes
from service.embeddings.release import free_embedding_of
from service.graph.loader import load_edge_list
from service.graph.public_bounds import DEFAULT_MAX_DEGREE_BOUND
from service.mechanisms.postprocess import score_grid
from service.privacy.sampler import vector_release_delta
from tests import test_api
from tests.api_support import GRAPH_NODES, Backend, bearer, ledger_of
from tests.test_api import Accounts, charge_count, query

backend = test_api.backend
client = test_api.client
accounts = test_api.accounts


def embed(client: TestClient, key: str, node: str, **params: Any) -> Any:
    headers = bearer(key)
    if "idempotency_key" in params:
        headers["Idempotency-Key"] = params.pop("idempotency_key")
    return client.get(f"/v1/embeddings/{node}", params=params, headers=headers)


def free(client: TestClient, key: str, node: str, **params: Any) -> Any:
    return client.get(f"/v1/embeddings/free/{node}", params=params, headers=bearer(key))


def test_dp_ie_is_charged_stored_replayed_and_listed(
    client: TestClient, accounts: Accounts
) -> None:
    account_id, key = accounts.user("5")
    first = embed(client, key, "5", k=16, epsilon=0.1)
    assert first.status_code == 200, first.text
    body = first.json()
    m = body["mechanism"]
    plan = plan_dp_instant_embedding(
        0.1, 1e-3, GRAPH_NODES, rounds=EMBEDDING_ROUNDS, degree_bound=DEFAULT_MAX_DEGREE_BOUND
    )
    assert m["name"] == "dp_instant_embedding" and m["mode"] == "personalized"
    assert m["epsilon"] == plan.epsilon and m["sigma"] == 1e-3 and m["dimension"] == 16
    assert m["noise_scale"] == plan.scale and m["sensitivity"] == plan.sensitivity
    # sigma n, the snapping slack and the float64 margins (2.7e-6 of sigma n at D 10,000)
    assert 0.4 < m["sensitivity"] <= 0.4 * (1 + 2.0**-10 + 1e-5)
    assert m["delta"] == vector_release_delta(plan.epsilon, 16) == 0.0
    assert m["score_grid"] == score_grid(plan.scale)
    assert len(m["hash_salt"]) == 32
    values = np.asarray(body["embedding"])
    assert values.shape == (16,)
    assert np.all(values / m["score_grid"] == np.round(values / m["score_grid"]))
    assert body["epsilon_charged"] == plan.epsilon and body["replayed"] is False
    assert body["graph_version"] and body["budget"]["account_id"] == account_id
    charges = ledger_of(client).reports.list_charges(account_id)
    assert [(c.mechanism, c.mode, c.state) for c in charges] == [
        ("dp_instant_embedding", "personalized", "released")
    ]
    assert charges[0].params["dimension"] == 16
    # the identical request replays the stored release, free
    again = embed(client, key, "5", k=16, epsilon=0.1)
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert again.json()["embedding"] == body["embedding"]
    assert again.json()["epsilon_charged"] == 0.0
    # another k or sigma is another release; fresh draws anew
    assert embed(client, key, "5", k=8, epsilon=0.1).json()["replayed"] is False
    assert embed(client, key, "5", k=16, epsilon=0.1, sigma=2e-3).json()["replayed"] is False
    fresh = embed(client, key, "5", k=16, epsilon=0.1, fresh="true").json()
    assert fresh["replayed"] is False and fresh["embedding"] != body["embedding"]
    assert charge_count(client) == 4
    # the dashboard's account page lists them by mechanism name
    listed = client.get(
        f"/v1/admin/accounts/{account_id}/charges", headers=bearer(accounts.admin_key)
    )
    assert listed.status_code == 200, listed.text
    assert {c["mechanism"] for c in listed.json()["items"]} == {"dp_instant_embedding"}
    # a second embedding of the same version hashes alike (one recorded salt)
    assert fresh["mechanism"]["hash_salt"] == m["hash_salt"]
    assert ledger_of(client).reports.verify().mismatches == []


def test_idempotency_key_binds_and_refuses_another_query(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("7")
    first = embed(client, key, "7", k=8, epsilon=0.2, idempotency_key="e-1")
    assert first.status_code == 200
    newer = embed(client, key, "7", k=8, epsilon=0.2, fresh="true")
    assert newer.json()["embedding"] != first.json()["embedding"]
    retry = embed(client, key, "7", k=8, epsilon=0.2, idempotency_key="e-1")
    assert retry.json()["replayed"] is True
    assert retry.json()["embedding"] == first.json()["embedding"]  # not the newer release
    other = embed(client, key, "7", k=4, epsilon=0.2, idempotency_key="e-1")
    assert other.status_code == 422 and other.json()["error"]["code"] == "invalid_parameter"
    assert charge_count(client) == 2


def test_refused_past_the_cap_before_any_draw(client: TestClient, accounts: Accounts) -> None:
    account_id, key = accounts.user("9", cap_epsilon=0.3)
    assert embed(client, key, "9", epsilon=0.25).status_code == 200
    refused = embed(client, key, "9", epsilon=0.25, k=32)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "budget_exhausted"
    assert len(ledger_of(client).reports.list_charges(account_id)) == 1


def test_edge_mode_charges_the_service_account_the_exposure_and_its_read_figure(
    client: TestClient, accounts: Accounts
) -> None:
    service_id, key = accounts.service(modes=["edge"])
    before = ledger_of(client).reports.exposure(delta=1e-6)
    answer = embed(client, key, "11", mode="edge", epsilon=0.5, k=8)
    assert answer.status_code == 200, answer.text
    assert answer.json()["mechanism"]["mode"] == "edge"
    charges = ledger_of(client).reports.list_charges(service_id)
    assert [(c.mechanism, c.mode) for c in charges] == [("dp_instant_embedding", "edge")]
    after = ledger_of(client).reports.exposure(delta=1e-6)
    assert after.epsilon > before.epsilon and after.charges == before.charges + 1
    assert after.by_mode["edge"]["charges"] == 1
    reads = client.get("/v1/me/reads", headers=bearer(key)).json()
    assert reads["releases"] == 1
    # a replay is counted once (the same release)
    assert embed(client, key, "11", mode="edge", epsilon=0.5, k=8).json()["replayed"] is True
    assert client.get("/v1/me/reads", headers=bearer(key)).json()["releases"] == 1
    # personalized is not in its scope
    refused = embed(client, key, "11", mode="personalized", epsilon=0.5)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "mode_not_allowed"


def test_a_personalized_embedding_by_a_service_account_is_charged_to_the_seed(
    client: TestClient, accounts: Accounts
) -> None:
    seed_id, _ = accounts.user("13")
    service_id, key = accounts.service(modes=["edge", "personalized"])
    answer = embed(client, key, "13", mode="personalized", epsilon=0.2, k=8)
    assert answer.status_code == 200, answer.text
    assert [c.principal_account_id for c in ledger_of(client).reports.list_charges(seed_id)] == [
        service_id
    ]


def test_bad_input_is_refused_and_nothing_charged(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.user("5")
    _, service_key = accounts.service(modes=["edge"])
    cases = [
        (embed(client, key, "6"), 403, "forbidden"),  # another user's node
        (embed(client, service_key, "nope", mode="edge"), 404, "unknown_node"),
        (embed(client, key, "5", k=0), 422, "invalid_parameter"),
        (embed(client, key, "5", k=1001), 422, "invalid_parameter"),
        (embed(client, key, "5", sigma=1e-6), 422, "invalid_parameter"),
        (embed(client, key, "5", sigma=2.0), 422, "invalid_parameter"),
        (embed(client, key, "5", sigma="nan"), 422, "invalid_parameter"),
        (embed(client, key, "5", epsilon=5.0), 422, "invalid_parameter"),
        (embed(client, key, "5", mode="joint"), 422, "invalid_parameter"),
        (embed(client, service_key, "5", mode="personalized"), 403, "mode_not_allowed"),
        (free(client, key, "6"), 403, "forbidden"),
        (free(client, key, "5", mechanism="popular"), 422, "invalid_parameter"),
        (free(client, key, "5", k=0), 422, "invalid_parameter"),
        (free(client, key, "5"), 404, "no_release"),
        (free(client, service_key, "5", mode="personalized"), 403, "mode_not_allowed"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code, response.text
    parameters = {
        r.json()["error"].get("details", {}).get("parameter")
        for r, status, _ in cases
        if status == 422
    }
    assert {"k", "sigma", "epsilon", "mode", "mechanism"} <= parameters
    assert charge_count(client) == 0


def test_the_free_embedding_of_a_replayable_release(
    client: TestClient, accounts: Accounts, backend: Backend
) -> None:
    account_id, key = accounts.user("21")
    ranked = query(client, key, "21", k=10, epsilon=0.2, mechanism="noisy_diffusion")
    assert ranked.status_code == 200
    charges = charge_count(client)
    answer = free(client, key, "21", epsilon=0.2, mechanism="noisy_diffusion", k=8)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["epsilon_charged"] == 0.0 and charge_count(client) == charges
    assert body["mechanism"]["name"] == "instant_embedding_of_release"
    assert body["mechanism"]["store_top"] == 1000 and body["mechanism"]["normalized"] is False
    assert body["source"]["release_request_id"] == ranked.json()["request_id"]
    assert body["source"]["mechanism"]["name"] == "noisy_diffusion"
    # it is exactly the InstantEmbedding of the stored release under the recorded salt
    ledger = ledger_of(client)
    graph = load_edge_list(backend.graph_path)
    stored = ledger.stored_releases.find_release(
        next(
            r.key
            for r in [
                ledger.stored_releases.release_for_charge(c.charge_id)
                for c in ledger.reports.list_charges(account_id)
            ]
            if r is not None
        )
    )
    assert stored is not None
    salt = bytes.fromhex(body["mechanism"]["hash_salt"])
    hashes = embedding_hashes(graph.external_ids(np.arange(graph.n)), salt, 8)
    expected = free_embedding_of(graph, list(stored.results), graph.index_of("21"), hashes, False)
    np.testing.assert_array_equal(np.asarray(body["embedding"]), expected)
    # another user cannot embed it; a service account with personalized scope may, counted
    _, other_key = accounts.user("22")
    assert free(client, other_key, "21", epsilon=0.2).status_code == 403
    _, service_key = accounts.service(modes=["edge", "personalized"])
    by_service = free(client, service_key, "21", epsilon=0.2, mechanism="noisy_diffusion", k=8)
    assert by_service.status_code == 200, by_service.text
    assert by_service.json()["embedding"] == body["embedding"]
    assert client.get("/v1/me/reads", headers=bearer(service_key)).json()["releases"] == 1
    assert charge_count(client) == charges


def test_a_node_named_like_the_free_path_is_not_embedded_by_accident(
    client: TestClient, accounts: Accounts
) -> None:
    """``/v1/embeddings/free/5`` is the free embedding of node 5, never DP-IE of a node
    ``free/5``."""
    _, key = accounts.user("5")
    response = client.get("/v1/embeddings/free/5", headers=bearer(key))
    assert response.status_code == 404 and response.json()["error"]["code"] == "no_release"
    assert charge_count(client) == 0


def test_identical_requests_at_once_are_charged_once(
    client: TestClient, accounts: Accounts
) -> None:
    """Identical DP-IE requests that arrive together: one is admitted and drawn, the others
    join it in the ledger and return its release."""
    from concurrent.futures import ThreadPoolExecutor

    account_id, key = accounts.user("31")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: embed(client, key, "31", k=8, epsilon=0.1), range(8)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert len({tuple(a.json()["embedding"]) for a in answers}) == 1
    assert sum(not a.json()["replayed"] for a in answers) == 1
    assert len(ledger_of(client).reports.list_charges(account_id)) == 1


def test_a_release_gone_from_the_cache_is_replayed_through_admission_and_cached_again(
    client: TestClient, accounts: Accounts, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before admission a DP-IE request looks for its release in the replay cache only when
    every worker shares it (Redis): a release evicted from it (or expired) is found by the
    admission, under the account's lock, and replayed there, charged nothing, and cached again.
    On PostgreSQL + Redis a first ask reads the ledger's releases once (in admission), not
    twice; without a shared cache the ledger is read before admission as well."""
    account_id, key = accounts.user("41")
    ledger = ledger_of(client)
    seen: list[str] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def _statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    first = embed(client, key, "41", k=8, epsilon=0.1)
    assert first.status_code == 200, first.text
    release_reads = sum("FROM releases" in s for s in seen)
    assert release_reads == (1 if backend.redis_url else 2), seen
    (charge,) = ledger.reports.list_charges(account_id)
    stored = ledger.stored_releases.release_for_charge(charge.charge_id)
    assert stored is not None
    cache = client.app.state.runtime.embeddings.dp.replaying.replays  # type: ignore[attr-defined]
    assert cache.shared is (backend.redis_url is not None)
    monkeypatch.setattr(cache, "recent", None)  # no decoded copy in this process either
    cache.store.delete(ReplayCache.key(stored.key))  # evicted
    again = embed(client, key, "41", k=8, epsilon=0.1)
    assert again.status_code == 200, again.text
    assert again.json()["replayed"] is True and again.json()["epsilon_charged"] == 0.0
    assert again.json()["embedding"] == first.json()["embedding"]
    assert len(ledger.reports.list_charges(account_id)) == 1  # nothing charged
    assert cache.store.get(ReplayCache.key(stored.key)) is not None  # cached again
    seen.clear()
    third = embed(client, key, "41", k=8, epsilon=0.1)
    assert third.json()["replayed"] is True
    assert not any("FROM releases" in s for s in seen)  # from the cache
    assert ledger.reports.verify().ok
