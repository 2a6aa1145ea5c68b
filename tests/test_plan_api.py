"""The admin planning endpoints against real components, on the embedded default (SQLite file,
in-process cache) and on PostgreSQL + Redis: the budget planner (``POST /v1/admin/plan``) is the
CLI's plan for this deployment, admin-only, with 422s naming the parameter; the run-out dates
(``GET /v1/admin/run-out``, ``GET /v1/admin/accounts/{id}/run-out``) project the composed spend
at the last 7 days' rate and sort near-cap accounts by them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from service.ledger.tables import Charge
from service.planning.budget import Deployment, plan_budget
from service.privacy.accountant import RdpCurve
from service.privacy.horizon import projected
from tests.api_support import bearer, ledger_of
from tests.test_api import Accounts, accounts, backend, client, query

__all__ = ["accounts", "backend", "client"]  # the fixtures, used by name

YEAR = {"cap_epsilon": 1.0, "days": 365, "answers_per_day": 1, "graph_versions": 4}


def _ok(response: Any) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def _refused(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


def test_planning_is_for_admins_only(client: TestClient, accounts: Accounts) -> None:
    user_id, user_key = accounts.user("5")
    _, service_key = accounts.service(modes=["edge", "personalized"])
    calls = [
        ("post", "/v1/admin/plan", YEAR),
        ("get", "/v1/admin/run-out", None),
        ("get", f"/v1/admin/accounts/{user_id}/run-out", None),
    ]
    for method, path, body in calls:
        assert client.request(method, path, json=body).status_code == 401, path
        for key in (user_key, service_key):
            response = client.request(method, path, json=body, headers=bearer(key))
            assert "admin" in _refused(response, 403, "forbidden")["message"]
        _ok(client.request(method, path, json=body, headers=bearer(accounts.admin_key)))
    _refused(client.get("/v1/admin/accounts/99999/run-out", headers=bearer(accounts.admin_key)),
             404, "unknown_account")  # fmt: skip


def test_the_plan_is_the_planners_for_this_deployment(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    settings = client.app.state.runtime.settings  # type: ignore[attr-defined]
    for mechanism in ("blended", "noisy_diffusion", "popular"):
        body = _ok(client.post("/v1/admin/plan", json={**YEAR, "mechanism": mechanism},
                               headers=admin))  # fmt: skip
        ours = plan_budget(1.0, 365, 1, mechanism=mechanism, graph_versions=4,
                           deployment=Deployment.of(settings))  # fmt: skip
        assert body["mechanism"] == mechanism and body["answers"] == 365
        assert body["epsilon"] == ours.epsilon
        assert body["spent_epsilon"] == pytest.approx(ours.spent_epsilon, rel=1e-12)
        assert body["steps"] == settings.steps  # the deployment's diffusion, not a default
        assert body["curve"][-1]["order"] is None  # infinity
        assert sum(1 for row in body["curve"] if row["best"]) == 1
    blended = _ok(client.post("/v1/admin/plan", json={**YEAR, "mechanism": "blended"},
                              headers=admin))  # fmt: skip
    assert blended["epsilon"] == pytest.approx(0.00829366)
    assert blended["within_query_range"] is False and blended["degree_releases"] == 4
    default = _ok(client.post("/v1/admin/plan", json=YEAR, headers=admin))
    assert default["mechanism"] == settings.default_mechanism
    edge = _ok(client.post("/v1/admin/plan", json={**YEAR, "mode": "edge"}, headers=admin))
    assert edge["mode"] == "edge"


@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        ({"cap_epsilon": 0}, "cap_epsilon"),
        ({"cap_epsilon": "1"}, "cap_epsilon"),
        ({"days": 0}, "days"),
        ({"days": 1.5}, "days"),
        ({"days": 36_501}, "days"),
        ({"answers_per_day": -1}, "answers_per_day"),
        ({"graph_versions": 0}, "graph_versions"),
        ({"delta": 0.5}, "delta"),
        ({"mechanism": "pagerank"}, "mechanism"),
        ({"mode": "joint"}, "mode"),
        ({"mechanism": "blended", "mode": "edge"}, "mechanism"),
        ({"cap_epsilon": 0.3, "mechanism": "blended"}, "cap_epsilon"),  # the 4 releases alone
        ({"horizon": 3}, "horizon"),
    ],
)
def test_bad_plans_are_422_naming_the_parameter(
    client: TestClient, accounts: Accounts, change: dict[str, Any], parameter: str
) -> None:
    response = client.post("/v1/admin/plan", json={**YEAR, **change},
                           headers=bearer(accounts.admin_key))  # fmt: skip
    error = _refused(response, 422, "invalid_parameter")
    assert error["details"]["parameter"] == parameter, error


def test_missing_fields_and_bad_windows_are_422(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    error = _refused(client.post("/v1/admin/plan", json={"cap_epsilon": 1.0}, headers=admin),
                     422, "invalid_parameter")  # fmt: skip
    assert error["details"]["parameter"] == "days"
    for params in ({"window_days": 0}, {"near_cap_fraction": 0}, {"limit": 0}):
        _refused(client.get("/v1/admin/run-out", params=params, headers=admin), 422,
                 "invalid_parameter")  # fmt: skip


def test_run_out_projects_the_composed_spend(client: TestClient, accounts: Accounts) -> None:
    admin = bearer(accounts.admin_key)
    fast_id, fast_key = accounts.user("11", cap_epsilon=0.5)
    slow_id, slow_key = accounts.user("12", cap_epsilon=0.5)
    idle_id, idle_key = accounts.user("13", cap_epsilon=0.5)
    for _ in range(4):
        assert query(client, fast_key, "11", epsilon=0.1, fresh="true").status_code == 200
    assert query(client, slow_key, "12", epsilon=0.45).status_code == 200
    assert query(client, idle_key, "13", epsilon=0.45).status_code == 200
    ledger = ledger_of(client)
    with ledger.engine.begin() as connection:  # the idle account charged 10 days ago
        connection.execute(
            update(Charge)
            .where(Charge.charged_account_id == idle_id)
            .values(created_at=datetime.now(UTC) - timedelta(days=10))
        )

    fast = _ok(client.get(f"/v1/admin/accounts/{fast_id}/run-out", headers=admin))
    assert fast["window_charges"] == 4 and fast["window_days"] == 7
    assert fast["days_left"] is not None and fast["days_left"] > 0
    as_of = datetime.fromisoformat(fast["as_of"])
    at = datetime.fromisoformat(fast["runs_out_at"])
    assert abs((at - as_of).total_seconds() / 86400 - fast["days_left"]) < 1e-6
    # the date is where the spend plus t/7 of the week's curve reaches the cap
    curves = [RdpCurve.from_json(c["rdp"]) for c in _charges(client, fast_id)]
    week = sum(curves[1:], curves[0])
    days = fast["days_left"]
    assert projected(week, week, days / 7).epsilon(fast["delta"]) < 0.5
    assert projected(week, week, (days + 0.01) / 7).epsilon(fast["delta"]) >= 0.5
    assert "composed" in fast["projection"]
    idle = _ok(client.get(f"/v1/admin/accounts/{idle_id}/run-out", headers=admin))
    assert idle["window_charges"] == 0 and idle["days_left"] is None
    assert idle["runs_out_at"] is None

    near = _ok(client.get("/v1/admin/run-out", params={"near_cap_fraction": 0.5},
                          headers=admin))  # fmt: skip
    order = [row["account"]["account_id"] for row in near["items"]]
    assert order.index(slow_id) < order.index(idle_id)  # a date first, then none
    days_left = [row["run_out"]["days_left"] for row in near["items"]]
    dated = [d for d in days_left if d is not None]
    assert dated == sorted(dated) and days_left[: len(dated)] == dated
    assert near["near_cap_total"] >= 2 and near["scanned"] == near["near_cap_total"]


def _charges(client: TestClient, account_id: int) -> list[dict[str, Any]]:
    from sqlalchemy import select

    ledger = ledger_of(client)
    with ledger.engine.connect() as connection:
        rows = connection.execute(
            select(Charge.rdp).where(
                Charge.charged_account_id == account_id, Charge.state != "refunded"
            )
        ).all()
    return [{"rdp": row.rdp} for row in rows]
