"""``/v1/admin/synthetic`` against the real app (SQLite; PostgreSQL + Redis): admins only, a
job's life (charged at the start, progress, done, its file), bad requests and a cap that does
not allow the run refused with nothing charged, and the job visible to every view."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.graph.loader import load_edge_list
from tests.api_support import Backend, bearer, ledger_of, running_app
from tests.test_api import Accounts, accounts, backend, client

URL = "/v1/admin/synthetic"


def _wait_done(client: TestClient, job_id: str, key: str) -> dict[str, Any]:
    for _ in range(3000):
        body: dict[str, Any] = client.get(f"{URL}/{job_id}", headers=bearer(key)).json()
        if body["state"] != "running":
            return body
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} still running")


def test_an_admin_runs_a_job_and_downloads_its_file(
    client: TestClient, accounts: Accounts, tmp_path: Path
) -> None:
    admin = bearer(accounts.admin_key)
    _, user_key = accounts.user("5")
    _, service_key = accounts.service()
    for key in (user_key, service_key):
        assert client.post(URL, json={"epsilon": 1.0}, headers=bearer(key)).status_code == 403
        assert client.get(URL, headers=bearer(key)).status_code == 403
    assert client.post(URL, json={"epsilon": 1.0}).status_code == 401
    started = client.post(URL, json={"method": "communities", "epsilon": 1.0}, headers=admin)
    assert started.status_code == 202, started.text
    job = started.json()
    assert job["state"] == "running" and job["charge_state"] == "admitted"
    assert job["privacy_unit"] == "edge" and job["source"] == "api"
    done = _wait_done(client, job["job_id"], accounts.admin_key)
    assert done["state"] == "done", done
    assert (done["progress"], done["charge_state"], done["error"]) == (1.0, "released", None)
    assert 0.5 < done["epsilon"] <= 1.0 + 1e-9
    for key in (user_key, service_key):
        assert client.get(done["file_url"], headers=bearer(key)).status_code == 403
    got = client.get(done["file_url"], headers=admin)
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    assert hashlib.sha256(got.content).hexdigest() == done["sha256"]
    path = tmp_path / "synthetic.txt"
    path.write_bytes(got.content)
    assert load_edge_list(path).m == done["edges"]
    listed = client.get(URL, headers=admin).json()
    assert listed["total"] == 1 and listed["jobs"][0]["job_id"] == job["job_id"]
    exposure = client.get("/v1/admin/exposure", headers=admin).json()
    assert exposure["graph_releases"] >= 1 and exposure["epsilon"] > 0.5
    assert ledger_of(client).reports.verify().ok


def test_bad_requests_are_refused_and_charge_nothing(
    client: TestClient, accounts: Accounts
) -> None:
    admin = bearer(accounts.admin_key)
    for body, code in (
        ({"method": "communities"}, "invalid_parameter"),  # no epsilon
        ({"method": "chung_lu", "epsilon": 1.0}, "invalid_parameter"),
        ({"method": "communities", "epsilon": 1.0, "groups": 1}, "invalid_parameter"),
        ({"method": "communities", "epsilon": -1.0}, "invalid_parameter"),
        ({"method": "nope", "epsilon": 1.0}, "invalid_parameter"),
        ({"method": "communities", "epsilon": 1.0, "extra": 1}, "invalid_parameter"),
    ):
        response = client.post(URL, json=body, headers=admin)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == code
    assert client.get(f"{URL}/{'0' * 32}", headers=admin).json()["error"]["code"] == (
        "unknown_synthesis_job"
    )
    assert client.get(f"{URL}/nope", headers=admin).status_code == 422
    assert client.get(URL, headers=admin).json()["total"] == 0
    report = ledger_of(client).reports.exposure(delta=1e-5)
    assert (report.epsilon, report.graph_releases) == (0.0, 0)


def test_a_run_the_graph_cap_does_not_allow_is_refused(backend: Backend) -> None:
    with running_app(backend, graph_cap_epsilon=0.5) as client:
        admin = Accounts(client).admin_key
        response = client.post(URL, json={"epsilon": 1.0}, headers=bearer(admin))
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "graph_budget_exhausted"
        assert client.get(URL, headers=bearer(admin)).json()["total"] == 0
        assert ledger_of(client).reports.exposure(delta=1e-5).graph_releases == 0
