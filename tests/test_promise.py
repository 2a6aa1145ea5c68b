"""The privacy promise under crashes, duplicates and coalitions: charge states, reconciliation,
``ledger verify``, one charge for identical concurrent queries, service-account scopes, and
the graph-wide exposure against an independent composition."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from dp_accounting import rdp as dp_rdp
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from service.cli import main as cli_main
from service.ledger import GraphBudgetExhausted, GraphCap, Ledger, ReleaseKey, upgrade
from service.privacy.curves import diffusion_curve
from service.privacy.modes import Mode
from service.privacy.orders import ORDERS
from tests.api_support import (
    Backend,
    bearer,
    database_goes_away_then,
    ledger_of,
    open_ledger,
    running_app,
    user_with_key,
    uvicorn_server,
)
from tests.conftest import POSTGRES_BASE_URL
from tests.connection_support import new_connection_each
from tests.ledger_support import admit_and_charge
from tests.test_api import Accounts, backend, query  # noqa: F401  (the backend fixture)


def verify(database_url: str) -> dict[str, Any]:
    with open_ledger(database_url) as ledger:
        return ledger.reports.verify().to_dict()


# -- identical concurrent queries: one charge, one answer ---------------------------------------


def _sixteen_identical(base_url: str, key: str, node: str) -> list[httpx.Response]:
    barrier = threading.Barrier(16)

    def ask(_: int) -> httpx.Response:  # a new connection each
        barrier.wait()
        return http.get(f"/v1/ppr/{node}", params={"k": 10}, headers=bearer(key))

    with new_connection_each(base_url) as http, ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(ask, range(16)))


def _assert_one_charge(responses: list[httpx.Response], database_url: str, account: int) -> None:
    assert [r.status_code for r in responses] == [200] * 16, [r.text for r in responses]
    bodies = [r.json() for r in responses]
    assert len({json.dumps(b["results"]) for b in bodies}) == 1  # 16 identical answers
    assert sum(not b["replayed"] for b in bodies) == 1
    with open_ledger(database_url) as ledger:
        charges = ledger.reports.list_charges(account)
        assert len(charges) == 1 and charges[0].state == "released"
        assert ledger.budgets.budget(account).charges == 1
    report = verify(database_url)
    assert report["ok"] and report["admitted_without_release"]["count"] == 0


@pytest.mark.slow
def test_sixteen_identical_requests_charge_once_on_the_embedded_default(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    graph = tmp_path / "graph.txt"
    from service.graph.generate import write_generated_edge_list

    write_generated_edge_list(graph, 400, 2400, seed=7)
    account, key = user_with_key(url, "17")
    with uvicorn_server(Backend("sqlite", url, None, graph), workers=1, forked=True) as server:
        responses = _sixteen_identical(server.base_url, key, "17")
    _assert_one_charge(responses, url, account)


@pytest.mark.slow
@pytest.mark.postgres
def test_sixteen_identical_requests_charge_once_on_two_workers(
    postgres_url: str, tmp_path: Path
) -> None:
    upgrade(postgres_url)
    graph = tmp_path / "graph.txt"
    from service.graph.generate import write_generated_edge_list

    write_generated_edge_list(graph, 400, 2400, seed=7)
    account, key = user_with_key(postgres_url, "17")
    with uvicorn_server(
        Backend("postgres", postgres_url, None, graph), workers=2, forked=True
    ) as server:
        responses = _sixteen_identical(server.base_url, key, "17")
        served_by = {
            line["pid"] for line in server.log_lines() if line.get("route") == "/v1/ppr/{node_id}"
        }
    _assert_one_charge(responses, postgres_url, account)
    assert len(served_by) == 2, "both workers answered: the database, not memory, deduplicated"


# -- a worker that died between charge and release -------------------------------------------


def _orphan_charge(client: TestClient, account: int, node: str, idem: str) -> int:
    """A charge exactly as a worker makes it just before it is killed (no release stored)."""
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    graph = runtime.graphs.current
    plan = runtime.queries.planner.plan(0.1, 1e-6, 30, 0.8, 1e-7, Mode.PERSONALIZED)
    key = ReleaseKey(account, node, graph.version, "personalized", 0.1)
    receipt = admit_and_charge(
        ledger_of(client),
        charged_account_id=account,
        principal_account_id=account,
        seed=node,
        mechanism="noisy_diffusion",
        mode="personalized",
        params={},
        query_curve=plan.curve,
        query_epsilon=plan.epsilon,
        graph_version=graph.version,
        request_id="killed-worker",
        idempotency_key=idem,
        release_key=key,
    )
    return receipt.charge_id


def test_a_dead_workers_key_is_reconciled_and_retried(backend: Backend) -> None:  # noqa: F811
    with running_app(backend, twin_wait_seconds=0.3, reconcile_interval_seconds=0) as client:
        account, key = user_with_key(backend.database_url, "21")
        orphan = _orphan_charge(client, account, "21", "idem-1")
        # the twin is in flight (as far as anyone can tell): 409 with Retry-After, no charge
        busy = query(client, key, "21", epsilon=0.1, idempotency_key="idem-1")
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "request_in_progress"
        assert int(busy.headers["Retry-After"]) >= 1
        same_query = query(client, key, "21", epsilon=0.1)  # no key: an identical query
        assert same_query.status_code == 409
        report = verify(backend.database_url)
        assert report["ok"] and report["admitted_without_release"]["count"] == 1
        # nothing left the process, so reconciliation refunds it (CLI, as an operator would)
        code = cli_main(
            ["ledger", "reconcile", "--older-than", "0", "--database-url", backend.database_url]
        )
        assert code == 0
        assert ledger_of(client).settlement.charge_state(orphan) == "refunded"
        assert ledger_of(client).budgets.budget(account).charges == 0
        retried = query(client, key, "21", epsilon=0.1, idempotency_key="idem-1")
        assert retried.status_code == 200 and retried.json()["replayed"] is False
        again = query(client, key, "21", epsilon=0.1, idempotency_key="idem-1")
        assert (
            again.json()["replayed"] is True
            and again.json()["results"] == retried.json()["results"]
        )
        states = sorted(c.state for c in ledger_of(client).reports.list_charges(account))
        assert states == ["refunded", "released"]
    report = verify(backend.database_url)
    assert report["ok"] and report["admitted_without_release"]["count"] == 0


def test_a_stale_twin_is_reconciled_by_the_next_identical_query(backend: Backend) -> None:  # noqa: F811
    with running_app(backend, reconcile_after_seconds=1, reconcile_interval_seconds=0) as client:
        account, key = user_with_key(backend.database_url, "22")
        orphan = _orphan_charge(client, account, "22", "idem-2")
        import time

        time.sleep(1.2)
        answered = query(client, key, "22", epsilon=0.1)
        assert answered.status_code == 200 and answered.json()["replayed"] is False
        assert ledger_of(client).settlement.charge_state(orphan) == "refunded"
    assert verify(backend.database_url)["ok"]


@pytest.mark.postgres
def test_a_release_that_cannot_be_stored_is_never_sent(postgres_url: str, tmp_path: Path) -> None:
    """PostgreSQL refuses connections between the charge and the release: the client gets 503
    ledger_unavailable (no answer), the charge stays admitted and is reconciled later."""
    upgrade(postgres_url)
    graph = tmp_path / "graph.txt"
    from service.graph.generate import write_generated_edge_list

    write_generated_edge_list(graph, 400, 2400, seed=7)
    account, key = user_with_key(postgres_url, "30")
    name = make_url(postgres_url).database
    admin = create_engine(POSTGRES_BASE_URL, isolation_level="AUTOCOMMIT")
    pg = Backend("postgres", postgres_url, None, graph)
    try:
        with running_app(pg, reconcile_interval_seconds=0) as client:
            ledger = ledger_of(client)
            # A query is stored alone or with the queries of its group: both paths lose it.
            ledger.settlement.store_release = database_goes_away_then(
                admin, name, ledger.settlement.store_release
            )
            ledger.settlement.store_releases = database_goes_away_then(
                admin, name, ledger.settlement.store_releases
            )
            response = query(client, key, "30", epsilon=0.1)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "ledger_unavailable"
            assert "results" not in response.text
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        with open_ledger(postgres_url) as ledger:
            (charge,) = ledger.reports.list_charges(account)
            assert charge.state == "admitted"
            assert ledger.settlement.reconcile(older_than_seconds=0) == [charge.charge_id]
            assert ledger.budgets.budget(account).charges == 0
        assert verify(postgres_url)["ok"]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


# -- ledger verify -------------------------------------------------------------------------------


def test_verify_finds_a_tampered_spend_and_exits_1(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(ledger_url)
    with open_ledger(ledger_url) as ledger:
        user = ledger.accounts.create_account("user", node_id="n", cap_epsilon=5.0, delta=1e-6)
        curve = diffusion_curve(80.0, 100, 0.8, Mode.PERSONALIZED)
        for i in range(3):
            admit_and_charge(
                ledger,
                charged_account_id=user.account_id, principal_account_id=user.account_id,
                seed="n", mechanism="noisy_diffusion", mode="personalized", params={},
                query_curve=curve, query_epsilon=0.1, graph_version="g", request_id=f"r{i}",
                idempotency_key=None,
            )  # fmt: skip
    args = ["ledger", "verify", "--json", "--database-url", ledger_url]
    assert cli_main(args) == 0
    clean = json.loads(capsys.readouterr().out)
    assert clean["ok"] and clean["accounts_checked"] == 1 and clean["mismatches"] == []
    assert clean["admitted_without_release"]["count"] == 3
    engine = create_engine(ledger_url)
    with engine.begin() as conn:  # someone "fixes" a budget by hand
        conn.execute(text("UPDATE spend SET charges = 1, epsilon = 0.05"))
    engine.dispose()
    assert cli_main(args) == 1
    tampered = json.loads(capsys.readouterr().out)
    assert not tampered["ok"] and {m["kind"] for m in tampered["mismatches"]} == {"spend"}


# -- the graph-wide exposure -----------------------------------------------------------------


def test_exposure_equals_an_independent_composition(backend: Backend) -> None:  # noqa: F811
    with running_app(backend) as client:
        accounts = Accounts(client)
        admin = bearer(accounts.admin_key)
        _, alice = accounts.user("1", cap_epsilon=5.0)
        _, bob = accounts.user("2", cap_epsilon=5.0)
        _, backend_key = accounts.service(modes=["edge"], cap_epsilon=5.0)
        script = [
            (alice, "1", 0.1, "personalized"), (alice, "1", 0.5, "personalized"),
            (bob, "2", 0.2, "personalized"), (bob, "2", 0.2, "edge"),
            (backend_key, "3", 1.0, "edge"), (backend_key, "4", 0.1, "edge"),
            (backend_key, "5", 0.1, "edge"),
        ]  # fmt: skip
        for key, node, eps, mode in script:
            assert query(client, key, node, epsilon=eps, mode=mode).status_code == 200
        report = client.get("/v1/admin/exposure", headers=admin).json()
        charges = ledger_of(client).reports.list_charges(None, limit=100)
    # independent: rebuild each charge's curve from its stored parameters, sum, and convert
    # with dp_accounting (the RDP part) and the pure bound
    rdp = [0.0] * len(ORDERS)
    pure = 0.0
    for charge in charges:
        p = charge.params
        curve = diffusion_curve(p["noise_scale"] / p["eta"], p["steps"], p["beta"], Mode(p["mode"]))
        rdp = [a + b for a, b in zip(rdp, curve.rdp.tolist(), strict=True)]
        pure += curve.pure
    delta = report["delta"]
    theirs, _ = dp_rdp.compute_epsilon(list(ORDERS), rdp, delta)
    assert len(charges) == len(script) == report["charges"]
    assert report["epsilon"] == pytest.approx(min(theirs, pure), rel=1e-9)
    assert report["shards_epsilon"] == pytest.approx(report["epsilon"], rel=1e-9)
    assert report["by_mode"]["edge"]["charges"] == 4
    assert report["series"][-1]["epsilon"] == pytest.approx(report["epsilon"], rel=1e-12)
    assert report["cap_epsilon"] is None
    naive = sum(eps for _, _, eps, _ in script)
    assert report["epsilon"] < naive


def test_graph_cap_holds_under_concurrent_charges(ledger_url: str) -> None:
    """Eight threads charge eight accounts as fast as they can under a graph-wide cap: the
    exposure never passes it, and exactly as many charges as fit are admitted."""
    upgrade(ledger_url)
    delta = 1e-6
    curve = diffusion_curve(8.0, 100, 0.8, Mode.EDGE)  # eps ~1 per charge
    cap = GraphCap(cap_epsilon=6.0, delta=delta, max_charge=curve)
    fits = max(q for q in range(1, 100) if (curve * q).epsilon(delta) <= 6.0 * (1 - 1e-12))
    ledger = Ledger.from_url(ledger_url)
    try:
        ids = [
            ledger.accounts.create_account("service", cap_epsilon=1e3, delta=delta).account_id
            for _ in range(8)
        ]
        admitted: list[int] = []
        refused: list[str] = []
        barrier = threading.Barrier(8)

        def spend(account: int) -> None:
            barrier.wait()
            for i in range(6):
                try:
                    admit_and_charge(
                        ledger,
                        charged_account_id=account, principal_account_id=account, seed="s",
                        mechanism="noisy_diffusion", mode="edge", params={},
                        query_curve=curve, query_epsilon=1.0, graph_version="g",
                        request_id=f"{account}-{i}", idempotency_key=None, graph_cap=cap,
                    )  # fmt: skip
                    admitted.append(account)
                except GraphBudgetExhausted as exc:
                    refused.append(exc.code)

        threads = [threading.Thread(target=spend, args=(a,)) for a in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        exposure = ledger.reports.exposure(delta=delta)
        assert len(admitted) == fits and len(refused) == 48 - fits
        assert exposure.epsilon <= 6.0 and exposure.charges == fits
        assert math.isclose(exposure.shards_epsilon, exposure.epsilon, rel_tol=1e-9)
        assert ledger.reports.verify().ok
    finally:
        ledger.dispose()


# -- a worker restarted while the database is down -----------------------------------------------


@pytest.mark.postgres
def test_a_starting_worker_waits_for_the_database(postgres_url: str) -> None:
    """uvicorn stops the whole server when a restarted worker fails to start: a worker that
    starts while PostgreSQL is briefly unreachable must wait for it, not fail."""
    from service.api.runtime import open_ledger as open_runtime_ledger
    from service.config import Settings
    from service.ledger import LedgerUnavailable

    missing = make_url(postgres_url).set(database=make_url(postgres_url).database + "_later")
    url = missing.render_as_string(hide_password=False)
    admin = create_engine(make_url(POSTGRES_BASE_URL), isolation_level="AUTOCOMMIT")

    with pytest.raises(LedgerUnavailable):  # no wait allowed: the database does not answer
        open_runtime_ledger(Settings(database_url=url, ledger_connect_timeout_seconds=0))

    def appear() -> None:  # the (migrated) database comes back a moment later, at once
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'ALTER DATABASE "{make_url(postgres_url).database}" RENAME TO "{missing.database}"'
            )

    upgrade(postgres_url)
    later = threading.Timer(1.0, appear)
    later.start()
    try:
        ledger = open_runtime_ledger(Settings(database_url=url, ledger_connect_timeout_seconds=60))
        assert ledger.ledger_id and ledger.ping()
        ledger.dispose()
    finally:
        later.join()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{missing.database}" WITH (FORCE)')
        admin.dispose()
