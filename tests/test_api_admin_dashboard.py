"""The admin dashboard's API and pages against real components, on the embedded default
(SQLite file, in-process cache) and on PostgreSQL + Redis: authorization, bad input, the
accounts table (server-side sort, filter, paging with totals), usage, refusals, curves,
budgets, keys, service usage, audit log, health, and the pages' headers and offline assets."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.routes.dashboard import degree_histogram
from tests.api_support import bearer, ledger_of
from tests.test_api import Accounts, accounts, backend, client, query

DASHBOARD_GETS = (
    "/v1/admin/me",
    "/v1/admin/account-table",
    "/v1/admin/usage",
    "/v1/admin/refusals",
    "/v1/admin/spenders",
    "/v1/admin/graph/degrees",
    "/v1/admin/health",
    "/v1/admin/audit-log",
    "/v1/admin/exposure",
)


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def refused(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


def test_every_dashboard_endpoint_is_for_admins_only(
    client: TestClient, accounts: Accounts
) -> None:
    user_id, user_key = accounts.user("5")
    service_id, service_key = accounts.service(modes=["edge", "personalized"])
    per_account = [
        f"/v1/admin/accounts/{user_id}/curve",
        f"/v1/admin/accounts/{user_id}/charges",
        f"/v1/admin/accounts/{service_id}/service-usage",
    ]
    for path in (*DASHBOARD_GETS, *per_account):
        assert client.get(path).status_code == 401, path
        for key in (user_key, service_key):
            error = refused(client.get(path, headers=bearer(key)), 403, "forbidden")
            assert "admin" in error["message"]
        ok(client.get(path, headers=bearer(accounts.admin_key)))
    preview = f"/v1/admin/accounts/{user_id}/budget/preview"
    refused(client.post(preview, json={"cap_epsilon": 2.0}, headers=bearer(user_key)), 403,
            "forbidden")  # fmt: skip
    me = ok(client.get("/v1/admin/me", headers=bearer(accounts.admin_key)))
    assert me["type"] == "admin" and me["label"] == "ops"


def test_unknown_accounts_are_404(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    for path in ("curve", "charges", "service-usage"):
        refused(client.get(f"/v1/admin/accounts/99999/{path}", headers=admin), 404,
                "unknown_account")  # fmt: skip
    for method, path in (("post", "budget/preview"), ("put", "budget")):
        response = client.request(
            method, f"/v1/admin/accounts/99999/{path}", json={"cap_epsilon": 2.0}, headers=admin
        )
        refused(response, 404, "unknown_account")
    user_id, _ = accounts.user("6")
    refused(client.get(f"/v1/admin/accounts/{user_id}/service-usage", headers=admin), 422,
            "invalid_parameter")  # fmt: skip


def test_bad_parameters_are_422(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    for path, params in [
        ("/v1/admin/account-table", {"sort": "password"}),
        ("/v1/admin/account-table", {"order": "sideways"}),
        ("/v1/admin/account-table", {"limit": 0}),
        ("/v1/admin/account-table", {"limit": 1001}),
        ("/v1/admin/account-table", {"offset": -1}),
        ("/v1/admin/account-table", {"status": "rich"}),
        ("/v1/admin/account-table", {"near_cap_fraction": 0}),
        ("/v1/admin/account-table", {"q": "a\nb"}),
        ("/v1/admin/account-table", {"type": "robot"}),
        ("/v1/admin/usage", {"hours": 0}),
        ("/v1/admin/usage", {"hours": "many"}),
        ("/v1/admin/refusals", {"hours": 100000}),
        ("/v1/admin/spenders", {"limit": 1001}),
        ("/v1/admin/audit-log", {"action": "DROP TABLE"}),
        ("/v1/admin/audit-log", {"account_id": 0}),
        ("/v1/admin/accounts/1/charges", {"state": "lost"}),
        ("/v1/admin/accounts/1/charges", {"role": "victim"}),
    ]:
        refused(client.get(path, params=params, headers=admin), 422, "invalid_parameter")


def test_cap_must_be_positive_and_finite(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    user_id, _ = accounts.user("7")
    url = f"/v1/admin/accounts/{user_id}"
    for body in ('{"cap_epsilon": -1}', '{"cap_epsilon": 0}', '{"cap_epsilon": Infinity}',
                 '{"cap_epsilon": NaN}', '{"cap_epsilon": 1e400}', '{"cap_epsilon": "2"}',
                 '{"delta": 1}', '{"delta": -1e-6}', '{"cap_epsilon": 1, "extra": 1}'):  # fmt: skip
        headers = {**admin, "Content-Type": "application/json"}
        for method, path in (("put", "budget"), ("post", "budget/preview")):
            response = client.request(method, f"{url}/{path}", content=body, headers=headers)
            assert response.status_code in (400, 422), (body, response.text)
            assert response.json()["error"]["code"] in ("invalid_parameter", "malformed_json")
    budget = ok(client.get(url, headers=admin))["budget"]
    assert budget["cap_epsilon"] == 1.0  # nothing changed


def test_cap_below_spent_is_allowed_flagged_and_audited(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    user_id, key = accounts.user("8")
    ok(query(client, key, "8", epsilon=0.3))
    spent = ok(client.get(f"/v1/admin/accounts/{user_id}", headers=admin))["budget"]
    assert spent["spent_epsilon"] > 0.1

    url = f"/v1/admin/accounts/{user_id}/budget"
    preview = ok(client.post(f"{url}/preview", json={"cap_epsilon": 0.1}, headers=admin))
    assert preview["cap_below_spent"] is True and preview["remaining_epsilon"] == 0.0
    assert preview["spent_epsilon"] == pytest.approx(spent["spent_epsilon"])
    wider = ok(client.post(f"{url}/preview", json={"delta": 1e-4}, headers=admin))
    assert wider["spent_epsilon"] < spent["spent_epsilon"]  # a larger delta converts lower
    audit = ok(client.get("/v1/admin/audit-log", params={"action": "budget.set"}, headers=admin))
    assert audit["total"] == 0  # previews change nothing

    lowered = ok(client.put(url, json={"cap_epsilon": 0.1}, headers=admin))
    assert lowered["cap_below_spent"] is True and lowered["remaining_epsilon"] == 0.0
    refused(query(client, key, "8", epsilon=0.1, fresh="true"), 403, "budget_exhausted")
    raised = ok(client.put(url, json={"cap_epsilon": 5.0}, headers=admin))
    assert raised["cap_below_spent"] is False
    assert raised["remaining_epsilon"] == pytest.approx(5.0 - raised["spent_epsilon"])

    audit = ok(
        client.get(
            "/v1/admin/audit-log", params={"action": "budget.", "account_id": user_id},
            headers=admin,
        )
    )  # fmt: skip
    assert audit["total"] == 2
    assert [e["details"]["cap_epsilon"]["new"] for e in audit["items"]] == [5.0, 0.1]
    assert all(e["target_account_id"] == user_id for e in audit["items"])
    assert "budget.set" in audit["actions"] and "api_key.create" in audit["actions"]
    table = ok(client.get("/v1/admin/account-table", params={"status": "over_cap"}, headers=admin))
    assert table["total"] == 0


def test_account_table_sorts_filters_and_pages_on_the_server(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    users: dict[str, tuple[int, str]] = {}
    for node, cap in (("10", 1.0), ("11", 2.0), ("12", 1.0), ("13", 0.5), ("14", 3.0)):
        users[node] = accounts.user(node, cap_epsilon=cap, label=f"cohort-{node}")
    accounts.service(label="backend")
    for node, epsilons in (("10", [0.3]), ("11", [0.2, 0.2]), ("13", [0.4])):
        for eps in epsilons:
            ok(query(client, users[node][1], node, epsilon=eps, fresh="true"))

    def table(**params: Any) -> dict[str, Any]:
        body: dict[str, Any] = ok(
            client.get("/v1/admin/account-table", params=params, headers=admin)
        )
        return body

    everything = table(limit=500)
    assert everything["total"] == 7  # 5 users, the service and the admin
    spent = [r["spent_epsilon"] for r in everything["items"]]
    assert spent == sorted(spent, reverse=True)
    # stable ordering: ties (no spend) by account id, in the sort's direction
    idle = [r["account_id"] for r in everything["items"] if r["charges"] == 0]
    assert idle == sorted(idle, reverse=True)
    paged: list[int] = []
    for offset in range(0, 7, 2):
        page = table(limit=2, offset=offset)
        assert page["total"] == 7 and len(page["items"]) <= 2
        paged += [r["account_id"] for r in page["items"]]
    assert paged == [r["account_id"] for r in everything["items"]]

    by_id = {r["account_id"]: r for r in everything["items"]}
    row = by_id[users["11"][0]]
    budget = ok(client.get(f"/v1/admin/accounts/{users['11'][0]}", headers=admin))["budget"]
    assert row["spent_epsilon"] == pytest.approx(budget["spent_epsilon"])
    assert row["remaining_epsilon"] == pytest.approx(budget["remaining_epsilon"])
    assert row["charges"] == 2 and row["last_charge_at"] and row["node_id"] == "11"
    assert row["used_fraction"] == pytest.approx(row["spent_epsilon"] / 2.0)

    assert [r["node_id"] for r in table(q="13")["items"]] == ["13"]
    assert table(q="cohort-1")["total"] == 5
    found = [r["account_id"] for r in table(q=str(users["12"][0]))["items"]]
    assert users["12"][0] in found  # by id (labels containing the digits match too)
    assert table(q="no-such-thing")["total"] == 0
    assert table(q="100%_")["total"] == 0  # LIKE wildcards are literal
    assert table(type="service")["items"][0]["label"] == "backend"
    assert table(status="active")["total"] == 3
    assert table(status="idle")["total"] == 4
    near = table(status="near_cap", near_cap_fraction=0.5)
    assert {r["node_id"] for r in near["items"]} == {"13"}
    assert table(min_spent_epsilon=0.35)["total"] >= 1

    remaining = table(sort="remaining", order="asc", type="user")["items"]
    values = [r["remaining_epsilon"] for r in remaining]
    assert values == sorted(values)
    caps = [r["cap_epsilon"] for r in table(sort="cap", order="asc")["items"]]
    assert caps == sorted(caps)
    ids = [r["account_id"] for r in table(sort="account_id", order="asc")["items"]]
    assert ids == sorted(ids)
    used = [r["used_fraction"] for r in table(sort="used")["items"]]
    assert used == sorted(used, reverse=True)
    last = table(sort="last_charge")["items"][0]
    assert last["node_id"] == "13"  # the most recent query


def test_curve_is_composed_in_order_beside_the_naive_sum(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    user_id, key = accounts.user("20", cap_epsilon=5.0)
    for eps in (0.1, 0.2, 0.1, 0.3):
        ok(query(client, key, "20", epsilon=eps, fresh="true"))
    curve = ok(client.get(f"/v1/admin/accounts/{user_id}/curve", headers=admin))
    budget = ok(client.get(f"/v1/admin/accounts/{user_id}", headers=admin))["budget"]
    points = curve["points"]
    assert curve["charges"] == len(points) == 4
    assert [p["epsilon"] for p in points] == pytest.approx([0.1, 0.2, 0.1, 0.3], rel=1e-5)
    assert [p["naive_epsilon"] for p in points] == pytest.approx([0.1, 0.3, 0.4, 0.7], rel=1e-5)
    composed = [p["composed_epsilon"] for p in points]
    assert composed == sorted(composed)  # spend only grows
    assert composed[0] == pytest.approx(points[0]["epsilon"], rel=1e-9)
    assert curve["composed_epsilon"] == pytest.approx(budget["spent_epsilon"], rel=1e-9)
    assert curve["composed_epsilon"] < curve["naive_epsilon"]  # what RDP composition saves
    assert curve["cap_epsilon"] == 5.0 and curve["delta"] == budget["delta"]
    times = [p["at"] for p in points]
    assert times == sorted(times)
    ids = [p["charge_id"] for p in points]
    charges = ok(client.get(f"/v1/admin/accounts/{user_id}/charges", headers=admin))
    assert charges["total"] == 4
    assert [c["charge_id"] for c in charges["items"]] == sorted(ids, reverse=True)
    first = charges["items"][-1]
    assert first["state"] == "released" and first["params"]["noise_scale"] > 0
    assert first["mode"] == "personalized" and first["principal_account_id"] == user_id
    released = client.get(
        f"/v1/admin/accounts/{user_id}/charges", params={"state": "refunded"}, headers=admin
    )
    assert ok(released)["total"] == 0
    page = ok(
        client.get(
            f"/v1/admin/accounts/{user_id}/charges", params={"limit": 3, "offset": 3},
            headers=admin,
        )
    )  # fmt: skip
    assert page["total"] == 4 and [c["charge_id"] for c in page["items"]] == [min(ids)]


def test_usage_refusals_and_spenders(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    user_id, key = accounts.user("25", cap_epsilon=0.5)
    for _ in range(3):
        ok(query(client, key, "25", epsilon=0.1, fresh="true"))
    refused(query(client, key, "25", epsilon=0.4, fresh="true"), 403, "budget_exhausted")
    _, service_key = accounts.service()  # edge mode only
    accounts.user("26")
    refused(query(client, service_key, "26"), 403, "mode_not_allowed")

    usage = ok(client.get("/v1/admin/usage", params={"hours": 6}, headers=admin))
    assert usage["hours"] == 6 and len(usage["series"]) == 6
    assert usage["queries"] == 3 and usage["epsilon"] == pytest.approx(0.3, rel=1e-5)
    assert usage["refusals"] == 2
    now = usage["series"][-1]
    assert now["queries"] == 3 and now["refusals"] == 2 and now["refunded"] == 0
    hours = [h["at"] for h in usage["series"]]
    assert hours == sorted(hours) and all(re.search(r"T\d\d:00:00", h) for h in hours)

    refusals = ok(client.get("/v1/admin/refusals", headers=admin))
    assert refusals["by_reason"] == {"budget_exhausted": 1, "mode_not_allowed": 1}
    assert refusals["total"] == 2 and refusals["hours"] is None
    assert ok(client.get("/v1/admin/refusals", params={"hours": 1}, headers=admin))["total"] == 2

    spenders = ok(
        client.get("/v1/admin/spenders", params={"near_cap_fraction": 0.5}, headers=admin)
    )
    assert spenders["top"][0]["account_id"] == user_id
    assert [r["account_id"] for r in spenders["near_cap"]] == [user_id]
    assert spenders["near_cap_total"] == 1 and spenders["over_cap_total"] == 0


def test_service_usage_shows_what_it_charged_to_others(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    service_id, key = accounts.service(modes=["edge", "personalized"], quota_epsilon=50.0)
    seeds = {node: accounts.user(node)[0] for node in ("30", "31")}
    ok(query(client, key, "30", epsilon=0.1))
    ok(query(client, key, "31", epsilon=0.2))
    ok(query(client, key, "31", epsilon=0.1))
    ok(query(client, key, "32", epsilon=0.1, mode="edge"))  # charged to itself
    usage = ok(client.get(f"/v1/admin/accounts/{service_id}/service-usage", headers=admin))
    assert usage["modes"] == ["edge", "personalized"]
    assert usage["quota_epsilon"] == 50.0 and usage["quota_is_default"] is False
    assert usage["charges_to_others"] == 3 and usage["accounts_charged"] == 2
    assert usage["epsilon_to_others"] == pytest.approx(0.4, rel=1e-5)
    assert usage["used_24h_epsilon"] == pytest.approx(0.4, rel=1e-5)
    assert usage["top_charged"][0] == {
        "account_id": seeds["31"], "charges": 2, "epsilon": pytest.approx(0.3, rel=1e-5)
    }  # fmt: skip
    made = ok(
        client.get(
            f"/v1/admin/accounts/{service_id}/charges", params={"role": "principal"},
            headers=admin,
        )
    )  # fmt: skip
    assert made["total"] == 4
    own = ok(client.get(f"/v1/admin/accounts/{service_id}/charges", headers=admin))
    assert own["total"] == 1 and own["items"][0]["mode"] == "edge"


def test_keys_are_issued_once_and_revoked_with_audit(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    user_id, old_key = accounts.user("35")
    issued = ok(client.post(f"/v1/admin/accounts/{user_id}/keys", headers=admin), 201)
    new_key = issued["api_key"]
    assert new_key.startswith(issued["prefix"])
    listed = ok(client.get(f"/v1/admin/accounts/{user_id}/keys", headers=admin))
    assert all("api_key" not in k for k in listed) and len(listed) == 2
    ok(query(client, new_key, "35"))
    ok(client.post(f"/v1/admin/keys/{issued['key_id']}/revoke", headers=admin))
    assert query(client, new_key, "35").status_code == 401
    ok(query(client, old_key, "35"))
    audit = ok(client.get("/v1/admin/audit-log", params={"action": "api_key."}, headers=admin))
    actions = [e["action"] for e in audit["items"] if e["target_account_id"] == user_id]
    assert actions == ["api_key.revoke", "api_key.create", "api_key.create"]
    refused(client.post("/v1/admin/keys/999999/revoke", headers=admin), 404, "unknown_api_key")


def test_audit_log_filters_and_pages(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    ids = [accounts.user(str(node))[0] for node in range(40, 46)]
    everything = ok(client.get("/v1/admin/audit-log", params={"limit": 1000}, headers=admin))
    assert everything["total"] == len(everything["items"]) >= 12  # create + key per account
    entry_ids = [e["id"] for e in everything["items"]]
    assert entry_ids == sorted(entry_ids, reverse=True)
    paged = []
    for offset in range(0, everything["total"], 5):
        page = ok(
            client.get("/v1/admin/audit-log", params={"limit": 5, "offset": offset}, headers=admin)
        )
        paged += [e["id"] for e in page["items"]]
    assert paged == entry_ids
    target = ok(
        client.get("/v1/admin/audit-log", params={"target_account_id": ids[2]}, headers=admin)
    )
    assert target["total"] >= 2 and all(e["target_account_id"] == ids[2] for e in target["items"])
    admin_id = ledger_of(client).api_keys.authenticate(accounts.admin_key).account_id  # type: ignore[union-attr]
    actor = ok(
        client.get("/v1/admin/audit-log", params={"actor_account_id": admin_id}, headers=admin)
    )
    by_admin = [e["id"] for e in everything["items"] if e["actor_account_id"] == admin_id]
    assert actor["total"] == len(by_admin) == len(everything["items"]) - 2  # 2: made in the ledger
    assert [e["id"] for e in actor["items"]] == by_admin[:50]
    none = ok(client.get("/v1/admin/audit-log", params={"action": "nothing"}, headers=admin))
    assert none == {"total": 0, "limit": 50, "offset": 0, "items": [], "actions": none["actions"]}


def test_graph_degrees_and_health(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    graph = ok(client.get("/v1/admin/graph/degrees", headers=admin))
    assert graph["degree_source"] == "cache"  # written at load
    assert sum(b["nodes"] for b in graph["histogram"]) == graph["nodes"]
    assert graph["histogram"][-1]["high"] == graph["degree_max"]
    lows = [b["low"] for b in graph["histogram"]]
    assert lows == sorted(lows)
    _, key = accounts.user("50")
    ok(query(client, key, "50"))
    ok(query(client, key, "50"))  # a replay
    health = ok(client.get("/v1/admin/health", headers=admin))
    assert health["database"]["status"] == "ok" and health["database"]["latency_ms"] >= 0
    assert health["database"]["in_flight_charges"] == 0
    assert health["workers"]["configured"] == 1 and health["workers"]["live_pids"]
    rates = {r["cache"]: r for r in health["cache"]["rates"]}
    assert set(rates) == {"degrees", "calibration", "replay", "prefixes"}
    assert rates["degrees"]["hits"] >= 1
    assert health["cache"]["backend"] in ("memory", "redis")
    assert health["graph_version"] == graph["version"]


def test_degree_histogram_buckets() -> None:
    import numpy as np

    buckets = degree_histogram(np.array([0, 1, 1, 2, 3, 4, 7, 8, 20]))
    assert [(b.low, b.high, b.nodes) for b in buckets] == [
        (0, 0, 1), (1, 1, 2), (2, 3, 2), (4, 7, 2), (8, 15, 1), (16, 20, 1)
    ]  # fmt: skip
    assert degree_histogram(np.array([], dtype=np.int64)) == []
    assert [(b.low, b.high, b.nodes) for b in degree_histogram(np.array([0, 0]))] == [(0, 0, 2)]


# -- pages ------------------------------------------------------------------------------------


def test_admin_page_and_assets_carry_security_headers(client: TestClient) -> None:
    page = client.get("/admin")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "default-src 'none'" in csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Cache-Control"] == "no-store"
    html = page.text
    assert "<script>" not in html and "style=" not in html  # no inline script or style
    assets = re.findall(r'(?:src|href)="(/admin/assets/[^"]+)"', html)
    assert len(assets) == 3
    for path in assets:
        asset = client.get(path)
        assert asset.status_code == 200 and asset.headers["X-Content-Type-Options"] == "nosniff"
        text = asset.text.replace("http://www.w3.org/2000/svg", "")  # a namespace, not a URL
        assert "http://" not in text and "https://" not in text
        assert "innerHTML" not in asset.text  # values are inserted as text
    assert (
        client.get("/admin/assets/dashboard.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    refused(client.get("/admin/assets/missing.js"), 404, "not_found")
    assert client.get("/admin/assets/..%2F__init__.py").status_code == 404
    assert client.get("/admin/", follow_redirects=False).status_code == 308


def test_docs_are_served_from_the_package(client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200
        assert "http://" not in page.text and "https://" not in page.text.replace(
            "https://fastapi.tiangolo.com", ""
        )
        assert "cdn" not in page.text.lower()
        csp = page.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and page.headers["X-Content-Type-Options"]
        for asset in re.findall(r'(?:src|href)="(/docs/assets/[^"]+)"', page.text):
            assert client.get(asset).status_code == 200, asset
    swagger = client.get("/docs").text
    assert "/docs/assets/swagger-ui-bundle.js" in swagger and '"validatorUrl": null' in swagger
    assert "sha256-" in client.get("/docs").headers["Content-Security-Policy"]


def test_openapi_lists_the_dashboard_endpoints(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path in (
        *DASHBOARD_GETS,
        "/v1/admin/accounts/{account_id}/curve",
        "/v1/admin/accounts/{account_id}/charges",
        "/v1/admin/accounts/{account_id}/service-usage",
        "/v1/admin/accounts/{account_id}/budget/preview",
    ):
        assert path in paths, path
        for operation in paths[path].values():
            assert {"401", "403"} <= set(operation["responses"]), path
    assert "/admin" not in paths and "/docs" not in paths
    budget = paths["/v1/admin/accounts/{account_id}/budget"]["put"]["responses"]["200"]
    ref = budget["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/BudgetChange")
    assert "cap_below_spent" in schema["components"]["schemas"]["BudgetChange"]["properties"]
