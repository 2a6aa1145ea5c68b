"""The HTTP API against real components: the same tests on the embedded default (SQLite file,
in-process cache) and on PostgreSQL + Redis."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from service.mechanisms.postprocess import score_grid
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    bearer,
    ledger_of,
    open_ledger,
    running_app,
)
from tests.conftest import postgres_database

#: Redis for the PostgreSQL + Redis variant (PPR_TEST_REDIS_URL picks another server or db).
REDIS_URL = os.environ.get("PPR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_answers(url: str = REDIS_URL) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with backend_on(request.param, tmp_path) as made:
        yield made


@contextmanager
def backend_on(name: str, folder: Path) -> Iterator[Backend]:
    """The generated test graph and a migrated ledger for the backend ``name``: "sqlite" (a
    file in ``folder``) or "postgres+redis" (a fresh PostgreSQL database, given back on exit,
    and the shared Redis, skipped if it does not answer; this ledger's keys are removed from
    it on exit)."""
    graph_path = folder / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    with ExitStack() as stack:
        if name == "sqlite":
            url, redis_url = f"sqlite:///{folder / 'ledger.db'}", None
        else:
            if not redis_answers():
                pytest.skip(f"Redis does not answer at {REDIS_URL}")
            url, redis_url = stack.enter_context(postgres_database()), REDIS_URL
        upgrade(url)
        yield Backend(name, url, redis_url, graph_path)
        if redis_url is not None:
            forget_cached_keys(url, redis_url)


def forget_cached_keys(database_url: str, redis_url: str) -> None:
    """Remove what this test's ledger left in the shared Redis (keys under its ledger id)."""
    import redis

    with open_ledger(database_url) as ledger:
        pattern = f"ppr:{ledger.ledger_id}:*"
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def client(backend: Backend) -> Iterator[TestClient]:
    with running_app(backend) as client:
        yield client


class Accounts:
    """Accounts created through the admin API, as a real operator would."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        ledger = ledger_of(client)
        admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6, label="ops")
        self.admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)

    def create(self, type: str, **fields: Any) -> dict[str, Any]:
        response = self.client.post(
            "/v1/admin/accounts", json={"type": type, **fields}, headers=bearer(self.admin_key)
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def user(self, node: str, **fields: Any) -> tuple[int, str]:
        body = self.create("user", node_id=node, **fields)
        return body["account_id"], body["key"]["api_key"]

    def service(self, **fields: Any) -> tuple[int, str]:
        body = self.create("service", **fields)
        return body["account_id"], body["key"]["api_key"]


@pytest.fixture
def accounts(client: TestClient) -> Accounts:
    return Accounts(client)


def charge_count(client: TestClient) -> int:
    return len(ledger_of(client).reports.list_charges(None, limit=1000))


def query(client: TestClient, key: str, node: str, **params: Any) -> Any:
    headers = bearer(key)
    if "idempotency_key" in params:
        headers["Idempotency-Key"] = params.pop("idempotency_key")
    return client.get(f"/v1/ppr/{node}", params=params, headers=headers)


# -- answers, replays, fresh draws --------------------------------------------------------


def test_a_user_queries_its_own_seed(client: TestClient, accounts: Accounts) -> None:
    account_id, key = accounts.user("5")
    response = query(client, key, "5", k=10, epsilon=0.2)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["node"] == "5" and len(body["results"]) == 10
    assert all(r["node"] != "5" for r in body["results"])
    scores = [r["score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and min(scores) >= 0
    assert body["replayed"] is False and body["request_id"]
    assert response.headers["X-Request-ID"] == body["request_id"]

    mech = body["mechanism"]
    budget = body["budget"]
    plan = plan_diffusion(0.2, budget["delta"], 30, 0.8, 1e-7, Mode.PERSONALIZED)
    assert mech == {
        "name": "noisy_diffusion", "mode": "personalized", "epsilon": plan.epsilon,
        "delta": budget["delta"], "beta": 0.8, "steps": 30,
        "noisy_steps": plan.config.noisy_steps, "eta": 1e-7,
        "noise_scale": plan.config.noise_scale,
        "score_grid": score_grid(plan.config.noise_scale),
    }  # fmt: skip
    grid = mech["score_grid"]
    assert grid == 2.0 ** math.floor(math.log2(plan.config.noise_scale / 256))
    assert all((r["score"] / grid).is_integer() for r in body["results"])
    assert budget["account_id"] == account_id and budget["charges"] == 1
    assert budget["spent_epsilon"] == pytest.approx(plan.curve.epsilon(budget["delta"]))
    assert budget["remaining_epsilon"] == pytest.approx(1.0 - budget["spent_epsilon"])
    assert body["epsilon_charged"] == plan.epsilon
    assert client.get("/v1/me/budget", headers=bearer(key)).json() == budget


def test_replay_is_free_and_fresh_is_charged_by_composition(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("9")
    first = query(client, key, "9", k=50, epsilon=0.1).json()
    replay = query(client, key, "9", k=20, epsilon=0.1).json()
    assert replay["replayed"] is True and replay["epsilon_charged"] == 0
    assert replay["results"] == first["results"][:20]
    assert replay["budget"] == first["budget"]
    assert charge_count(client) == 1

    fresh = query(client, key, "9", k=50, epsilon=0.1, fresh="true").json()
    assert fresh["replayed"] is False and fresh["results"] != first["results"]
    delta = fresh["budget"]["delta"]
    one = plan_diffusion(0.1, delta, 30, 0.8, 1e-7, Mode.PERSONALIZED).curve
    assert fresh["budget"]["spent_epsilon"] == pytest.approx((one * 2).epsilon(delta))
    assert fresh["budget"]["spent_epsilon"] < 2 * first["budget"]["spent_epsilon"]
    # the newest release is what a replay returns now
    again = query(client, key, "9", k=50, epsilon=0.1).json()
    assert again["replayed"] is True and again["results"] == fresh["results"]
    # another epsilon is another release
    other = query(client, key, "9", k=5, epsilon=0.3).json()
    assert other["replayed"] is False and charge_count(client) == 3


def test_idempotency_key_charges_once(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.user("12")
    first = query(client, key, "12", k=10, fresh="true", idempotency_key="order-42")
    retry = query(client, key, "12", k=10, fresh="true", idempotency_key="order-42")
    assert first.status_code == retry.status_code == 200
    assert retry.json()["replayed"] is True
    assert retry.json()["results"] == first.json()["results"]
    assert charge_count(client) == 1
    clash = query(client, key, "12", k=10, epsilon=0.5, idempotency_key="order-42")
    assert clash.status_code == 422
    assert clash.json()["error"]["details"]["parameter"] == "Idempotency-Key"
    assert charge_count(client) == 1


def test_refused_when_the_cap_would_be_passed(client: TestClient, accounts: Accounts) -> None:
    account_id, key = accounts.user("20", cap_epsilon=0.3)
    delta = ledger_of(client).budgets.account_delta(account_id)
    one = plan_diffusion(0.1, delta, 30, 0.8, 1e-7, Mode.PERSONALIZED).curve
    expected = max(q for q in range(1, 100) if (one * q).epsilon(delta) <= 0.3)

    admitted = 0
    while True:
        response = query(client, key, "20", epsilon=0.1, fresh="true")
        if response.status_code != 200:
            break
        admitted += 1
    assert admitted == expected
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "budget_exhausted"
    remaining = error["details"]["budget"]["remaining_epsilon"]
    assert remaining == pytest.approx(0.3 - (one * admitted).epsilon(delta))
    assert charge_count(client) == admitted
    # a replay of what was released still works and costs nothing
    replay = query(client, key, "20", epsilon=0.1)
    assert replay.status_code == 200 and replay.json()["replayed"] is True


# -- who may ask what ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "malformed"),
        ({"Authorization": "Bearer"}, "malformed"),
        ({"Authorization": "Bearer short"}, "malformed"),
        ({"Authorization": "Bearer ppr_" + "x" * 43}, "invalid"),
    ],
)
def test_bad_credentials_are_401(client: TestClient, headers: dict[str, str], reason: str) -> None:
    for path in ("/v1/ppr/5", "/v1/me/budget", "/v1/admin/accounts"):
        response = client.get(path, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
        assert response.json()["error"]["details"]["reason"] == reason
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert charge_count(client) == 0


def test_revoked_key_is_401(client: TestClient, accounts: Accounts) -> None:
    body = accounts.create("user", node_id="30")
    key, key_id = body["key"]["api_key"], body["key"]["key_id"]
    assert query(client, key, "30").status_code == 200
    revoked = client.post(f"/v1/admin/keys/{key_id}/revoke", headers=bearer(accounts.admin_key))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    response = query(client, key, "30")
    assert (
        response.status_code == 401 and response.json()["error"]["details"]["reason"] == "invalid"
    )


def test_user_only_its_own_seed_admin_never(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.user("40")
    other = query(client, key, "41")
    assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden"
    edge = query(client, key, "40", mode="edge")
    assert edge.status_code == 200 and edge.json()["mechanism"]["mode"] == "edge"
    admin = query(client, accounts.admin_key, "40")
    assert admin.status_code == 403 and admin.json()["error"]["code"] == "forbidden"
    for path in ("/v1/admin/accounts", "/v1/admin/charges", "/v1/admin/graph"):
        assert client.get(path, headers=bearer(key)).status_code == 403
    assert charge_count(client) == 1


def test_service_account_charges_the_seed_user(backend: Backend) -> None:
    with running_app(backend, create_seed_accounts=True) as client:
        accounts = Accounts(client)
        service_id, service_key = accounts.service(
            may_create_seed_accounts=True, modes=["edge", "personalized"]
        )
        user_id, user_key = accounts.user("50")
        on_behalf = query(client, service_key, "50", k=5)
        assert on_behalf.status_code == 200
        assert on_behalf.json()["budget"]["account_id"] == user_id
        assert client.get("/v1/me/budget", headers=bearer(user_key)).json()["charges"] == 1
        # a seed without an account gets one on first charge, with the default cap
        created = query(client, service_key, "51", k=5)
        assert created.status_code == 200
        new_account = ledger_of(client).accounts.account_for_node("51")
        assert new_account is not None and new_account.type == "user"
        assert created.json()["budget"]["account_id"] == new_account.account_id
        assert created.json()["budget"]["cap_epsilon"] == 1.0
        # edge mode: a shared answer, charged to the service itself
        edge = query(client, service_key, "52", k=5, mode="edge")
        assert edge.status_code == 200 and edge.json()["budget"]["account_id"] == service_id
        assert ledger_of(client).accounts.account_for_node("52") is None


def test_service_scopes_default_to_edge_only(client: TestClient, accounts: Accounts) -> None:
    """A service account charges users' budgets only if personalized mode was granted, and
    creates seed accounts only if both its flag and PPR_CREATE_SEED_ACCOUNTS (off) allow it."""
    service_id, key = accounts.service()
    accounts.user("60")
    refused = query(client, key, "60")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "mode_not_allowed"
    assert query(client, key, "60", mode="edge").status_code == 200
    admin = bearer(accounts.admin_key)
    granted = client.put(
        f"/v1/admin/accounts/{service_id}/scopes",
        json={"modes": ["edge", "personalized"], "may_create_seed_accounts": True},
        headers=admin,
    )
    assert granted.status_code == 200, granted.text
    assert granted.json()["modes"] == ["edge", "personalized"]
    assert query(client, key, "60").status_code == 200
    no_account = query(client, key, "61")  # the deployment does not allow creating accounts
    assert no_account.status_code == 404
    assert no_account.json()["error"]["code"] == "unknown_account"
    assert charge_count(client) == 2
    actions = [row["action"] for row in ledger_of(client).reports.list_audit()]
    assert "scopes.set" in actions


def test_service_quota_refuses_with_retry_after(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.service(modes=["personalized"], quota_epsilon=0.25)
    for node in ("70", "71", "72"):
        accounts.user(node)
    assert query(client, key, "70", epsilon=0.1).status_code == 200
    assert query(client, key, "71", epsilon=0.1).status_code == 200
    refused = query(client, key, "72", epsilon=0.1)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "service_quota_exhausted"
    retry_after = int(refused.headers["Retry-After"])
    assert 86000 < retry_after <= 86400  # the first charge leaves the 24-hour window
    assert charge_count(client) == 2
    # replays are free and not limited by the quota
    assert query(client, key, "70", epsilon=0.1).json()["replayed"] is True


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"k": 0}, "k"),
        ({"k": 1001}, "k"),
        ({"k": "ten"}, "k"),
        ({"k": 2.5}, "k"),
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": -1}, "epsilon"),
        ({"epsilon": 2.5}, "epsilon"),
        ({"epsilon": "nan"}, "epsilon"),
        ({"epsilon": "inf"}, "epsilon"),
        ({"epsilon": "lots"}, "epsilon"),
        ({"epsilon": 0.001}, "epsilon"),
        ({"mode": "global"}, "mode"),
        ({"fresh": "maybe"}, "fresh"),
        ({"exclude_neighbors": "perhaps"}, "exclude_neighbors"),
        ({"mode": "edge", "exclude_neighbors": "true"}, "exclude_neighbors"),
    ],
)
def test_bad_parameters_are_named(
    client: TestClient, accounts: Accounts, params: dict[str, Any], parameter: str
) -> None:
    _, key = accounts.user("70")
    response = query(client, key, "70", **params)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_parameter"
    assert error["details"]["parameter"] == parameter
    assert parameter in error["message"]
    assert charge_count(client) == 0


def test_unknown_node_and_bad_idempotency_key(client: TestClient, accounts: Accounts) -> None:
    _, service_key = accounts.service(modes=["personalized"])
    response = query(client, service_key, "no-such-node")
    assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_node"
    too_long = query(client, service_key, "5", idempotency_key="x" * 201)
    assert too_long.status_code == 422
    assert too_long.json()["error"]["details"]["parameter"] == "Idempotency-Key"
    assert charge_count(client) == 0
    unknown_route = client.get("/v1/nothing-here")
    assert unknown_route.status_code == 404 and unknown_route.json()["error"]["code"] == "not_found"
    wrong_method = client.post("/v1/ppr/5", headers=bearer(service_key))
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_admin_input_is_validated(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"type": "user", "node_id": "no-such-node"}, 404, "unknown_node"),
        ({"type": "user"}, 422, "invalid_parameter"),
        ({"type": "service", "node_id": "5"}, 422, "invalid_parameter"),
        ({"type": "wizard"}, 422, "invalid_parameter"),
        ({"type": "service", "cap_epsilon": -1}, 422, "invalid_parameter"),
        ({"type": "service", "delta": 1.5}, 422, "invalid_parameter"),
        ({"type": "service", "surprise": 1}, 422, "invalid_parameter"),
    ]
    for body, status, code in cases:
        response = client.post("/v1/admin/accounts", json=body, headers=admin)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["code"] == code
    accounts.user("80")
    duplicate = client.post(
        "/v1/admin/accounts", json={"type": "user", "node_id": "80"}, headers=admin
    )
    assert duplicate.status_code == 409
    missing = client.put("/v1/admin/accounts/99999/budget", json={"cap_epsilon": 2}, headers=admin)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_account"
    not_json = client.post(
        "/v1/admin/accounts",
        content=b"{not json",
        headers={**admin, "Content-Type": "application/json"},
    )
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "malformed_json"


# -- admin views --------------------------------------------------------------------------


def test_admin_sets_budgets_and_sees_charges(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    account_id, key = accounts.user("90", cap_epsilon=0.15)
    assert query(client, key, "90", epsilon=0.1).status_code == 200
    assert query(client, key, "90", epsilon=0.1, fresh="true").status_code == 403
    raised = client.put(
        f"/v1/admin/accounts/{account_id}/budget", json={"cap_epsilon": 2.0}, headers=admin
    )
    assert raised.status_code == 200 and raised.json()["cap_epsilon"] == 2.0
    assert query(client, key, "90", epsilon=0.1, fresh="true").status_code == 200

    charges = client.get("/v1/admin/charges", params={"account_id": account_id}, headers=admin)
    assert [c["charged_account_id"] for c in charges.json()] == [account_id, account_id]
    listed = client.get("/v1/admin/accounts", params={"type": "user"}, headers=admin).json()
    mine = next(a for a in listed if a["account_id"] == account_id)
    assert mine["budget"]["charges"] == 2 and mine["node_id"] == "90"
    audit = client.get("/v1/admin/audit", headers=admin).json()
    assert any(entry["action"] == "budget.set" for entry in audit)
    graph = client.get("/v1/admin/graph", headers=admin).json()
    assert graph["nodes"] == GRAPH_NODES and graph["edges"] == GRAPH_EDGES


def test_graph_reload_swaps_and_a_broken_file_keeps_the_old_graph(
    backend: Backend, client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    _, key = accounts.user("3")
    before = client.get("/v1/admin/graph", headers=admin).json()["version"]

    write_generated_edge_list(backend.graph_path, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
    reloaded = client.post("/v1/admin/graph/reload", headers=admin)
    assert reloaded.status_code == 200 and reloaded.json()["version"] != before
    assert query(client, key, "3").json()["graph_version"] == reloaded.json()["version"]

    backend.graph_path.write_text("1 2\nlonely\n")
    broken = client.post("/v1/admin/graph/reload", headers=admin)
    assert broken.status_code == 422
    assert broken.json()["error"]["code"] == "graph_load_error"
    assert f"{backend.graph_path}:2" in broken.json()["error"]["message"]
    still = query(client, key, "3")
    assert still.status_code == 200 and still.json()["graph_version"] == reloaded.json()["version"]
    actions = [e["action"] for e in client.get("/v1/admin/audit", headers=admin).json()]
    assert "graph.reload" in actions and "graph.reload_failed" in actions


# -- operations ---------------------------------------------------------------------------


def test_health_readiness_and_metrics(client: TestClient, accounts: Accounts) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok"}  # no key: the status only
    ready = client.get("/readyz", headers=bearer(accounts.admin_key))
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert checks["graph"]["status"] == "ok" and checks["database"]["status"] == "ok"
    assert ready.json()["status"] == "ok"
    _, key = accounts.user("100", cap_epsilon=0.05)
    query(client, key, "100", epsilon=0.1)  # refused: above the cap
    query(client, key, "100", epsilon=0.04)
    text = client.get("/metrics").text
    assert 'ppr_http_requests_total{method="GET",route="/v1/ppr/{node_id}",status="200"}' in text
    assert 'ppr_refusals_total{reason="budget_exhausted"}' in text
    assert "ppr_charges_total" in text and "ppr_epsilon_charged_total" in text
    assert client.get("/docs").status_code == 200
    assert "/v1/ppr/{node_id}" in client.get("/openapi.json").json()["paths"]


def test_one_log_line_per_request_without_secrets(
    client: TestClient, accounts: Accounts, caplog: pytest.LogCaptureFixture
) -> None:
    _, key = accounts.user("110")
    with caplog.at_level(logging.INFO):
        body = query(client, key, "110", k=5).json()
    lines = [r for r in caplog.records if r.name == "service.access"]
    assert len(lines) == 1
    line = lines[0].__dict__
    assert line["request_id"] == body["request_id"] and line["outcome"] == "charged"
    assert line["account"] is not None and line["epsilon_charged"] == body["epsilon_charged"]
    text = "\n".join(str(r.__dict__) for r in caplog.records)
    assert key not in text
    assert all(str(r["score"]) not in text for r in body["results"])


def test_spend_survives_a_restart(backend: Backend) -> None:
    with running_app(backend) as client:
        accounts = Accounts(client)
        account_id, key = accounts.user("120")
        spent = query(client, key, "120", epsilon=0.2).json()["budget"]
    with running_app(backend) as client:
        after = client.get("/v1/me/budget", headers=bearer(key)).json()
        assert after == spent
        replay = query(client, key, "120", epsilon=0.2).json()
        assert replay["replayed"] is True  # the release is durable too
    with open_ledger(backend.database_url) as ledger:
        assert ledger.budgets.budget(account_id).spent_epsilon == spent["spent_epsilon"]


def test_composition_matches_an_independent_accountant(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("130", cap_epsilon=5.0)
    curves = []
    for epsilon in (0.05, 0.1, 0.2, 0.4):
        body = query(client, key, "130", epsilon=epsilon, mode="edge").json()
        plan = plan_diffusion(epsilon, body["budget"]["delta"], 30, 0.8, 1e-7, Mode.EDGE)
        curves.append(plan.curve)
    total = RdpCurve.zero()
    for curve in curves:
        total = total + curve
    delta = body["budget"]["delta"]
    assert body["budget"]["spent_epsilon"] == pytest.approx(total.epsilon(delta), rel=1e-12)
    assert body["budget"]["spent_epsilon"] < sum(c.epsilon(delta) for c in curves)
    assert math.isfinite(body["budget"]["remaining_epsilon"])


def test_a_failure_before_any_noise_is_refunded(
    client: TestClient, accounts: Accounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the noise-free prefix cannot be computed (e.g. out of memory). No
    noise was drawn, so the charge is compensated by a refund row and the budget restored."""
    account_id, key = accounts.user("140")
    runtime = client.app.state.runtime  # type: ignore[attr-defined]

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("simulated")

    monkeypatch.setattr(runtime.queries.prefixes, "lookup", out_of_memory)
    failed = query(client, key, "140", fresh="true")
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "internal_error"
    assert failed.json()["error"]["message"].endswith(
        failed.headers["X-Request-ID"] + " to the operator"
    )
    charges = ledger_of(client).reports.list_charges(account_id)
    assert len(charges) == 1 and charges[0].refunded
    budget = ledger_of(client).budgets.budget(account_id)
    assert budget.spent_epsilon == 0.0 and budget.charges == 0

    monkeypatch.undo()
    answered = query(client, key, "140")
    assert answered.status_code == 200 and answered.json()["budget"]["charges"] == 1
    assert client.get("/healthz").status_code == 200  # the process keeps serving
