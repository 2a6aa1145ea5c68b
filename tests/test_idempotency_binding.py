"""An Idempotency-Key binds to the answer it first returned (issue 23, finding 1).

The first answer given under a key (fresh, replayed from a stored release, or a batch call's
items) is what every retry under that key returns, and no other query may take the key: the
ledger records the key against the release in the transaction that decides the answer. The
same tests run on SQLite with the in-process cache and on PostgreSQL with Redis, in process,
and as ``serve --workers 2`` with concurrent clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from service.ledger.ledger import Ledger
from service.ledger.tables import IdempotencyBinding
from service.privacy.curves import laplace_curve
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    Server,
    bearer,
    ledger_of,
    open_ledger,
    running_app,
    user_with_key,
    uvicorn_server,
)
from tests.connection_support import new_connection_each
from tests.ledger_support import admit_and_charge
from tests.test_api import backend_on


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with backend_on(request.param, tmp_path) as made:
        yield made


def get(http: Any, key: str, node: str, idem: str | None = None, **params: Any) -> Any:
    headers = bearer(key)
    if idem is not None:
        headers["Idempotency-Key"] = idem
    return http.get(f"/v1/ppr/{node}", params={"k": 5, "epsilon": 0.05, **params}, headers=headers)


def results(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["results"]
    return found


def bindings(ledger: Ledger, principal: int | None = None) -> list[tuple[str, str, int, bool]]:
    """The ledger's bindings (``principal``'s only if given), oldest first."""
    query = select(
        IdempotencyBinding.idempotency_key, IdempotencyBinding.kind,
        IdempotencyBinding.charge_id, IdempotencyBinding.freed_at.is_(None),
    ).order_by(IdempotencyBinding.id)  # fmt: skip
    if principal is not None:
        query = query.where(IdempotencyBinding.principal_account_id == principal)
    with ledger.engine.connect() as conn:
        rows = conn.execute(query)
        return [(str(r[0]), str(r[1]), int(r[2]), bool(r[3])) for r in rows]


def the_issue_sequence(http: Any, key: str, node: str, **params: Any) -> None:
    """The repro of issue 23: a charged query (R0 below, no key); the same with K-1 (a replay
    of it); a fresh draw R2 without a key; the retry under K-1 must still be the replay; a
    different query under K-1 is 422 and the original retry is unharmed."""
    first = results(get(http, key, node, **params))
    keyed = get(http, key, node, "K-1", **params)
    assert keyed.json()["replayed"] is True and results(keyed) == first
    newer = results(get(http, key, node, fresh="true", **params))
    assert newer != first  # fresh noise
    for _ in range(3):
        retry = get(http, key, node, "K-1", **params)
        assert retry.json()["replayed"] is True
        assert results(retry) == first, "a keyed retry must return the answer it first got"
    other = get(http, key, node, "K-1", **{**params, "epsilon": 0.07})
    assert other.status_code == 422, other.text
    assert other.json()["error"]["details"]["parameter"] == "Idempotency-Key"
    assert results(get(http, key, node, "K-1", **params)) == first
    # and a fresh retry under the key is the same answer too (the key is bound, not free)
    assert results(get(http, key, node, "K-1", fresh="true", **params)) == first


@pytest.mark.parametrize("groups", [1, 0], ids=["grouped", "alone"])
def test_a_keyed_replay_binds_its_key_to_that_release(backend: Backend, groups: int) -> None:
    account_id, key = user_with_key(backend.database_url, "7")
    with running_app(backend, query_groups_in_flight=groups) as client:
        the_issue_sequence(client, key, "7", mechanism="noisy_diffusion")
        ledger = ledger_of(client)
        charges = ledger.reports.list_charges(account_id)
        assert len(charges) == 2  # the first query and the fresh one; nothing else charged
        first_charge = min(c.charge_id for c in charges)
        assert bindings(ledger) == [("K-1", "replayed", first_charge, True)]
        assert ledger.reports.verify().ok


def test_edge_mode_keys_bind_too(backend: Backend) -> None:
    with running_app(backend) as client:
        ledger = ledger_of(client)
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=1e-6, modes=["edge"]
        )
        key, _ = ledger.api_keys.create_api_key(service.account_id)
        the_issue_sequence(client, key, "11", mode="edge")
        assert len(ledger.reports.list_charges(service.account_id)) == 2
        assert ledger.reports.verify().ok


def batch(http: Any, key: str, nodes: list[str], idem: str, **body: Any) -> Any:
    headers = {**bearer(key), "Idempotency-Key": idem}
    payload = {"nodes": nodes, "k": 5, "epsilon": 0.05, "mode": "edge", **body}
    return http.post("/v1/ppr/batch", json=payload, headers=headers)


def test_a_retried_batch_returns_the_items_it_first_returned(backend: Backend) -> None:
    with running_app(backend) as client:
        ledger = ledger_of(client)
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=1e-6, modes=["edge"]
        )
        key, _ = ledger.api_keys.create_api_key(service.account_id)
        nodes = ["3", "4", "5"]
        for node in nodes[:2]:  # two of the three have a stored release: replayed in the batch
            results(get(client, key, node, mode="edge"))
        first = batch(client, key, nodes, "nightly-1")
        assert first.status_code == 200, first.text
        items = first.json()["items"]
        assert [i["replayed"] for i in items] == [True, True, False]
        for node in nodes:  # newer releases of every item's query
            results(get(client, key, node, fresh="true", mode="edge"))
        retry = batch(client, key, nodes, "nightly-1")
        assert [i["results"] for i in retry.json()["items"]] == [i["results"] for i in items]
        assert all(i["replayed"] for i in retry.json()["items"])
        clash = batch(client, key, nodes, "nightly-1", epsilon=0.07)
        assert all(i["error"]["code"] == "invalid_parameter" for i in clash.json()["items"])
        again = batch(client, key, nodes, "nightly-1")
        assert [i["results"] for i in again.json()["items"]] == [i["results"] for i in items]
        assert len(ledger.reports.list_charges(service.account_id)) == 2 + 1 + 3
        assert ledger.reports.verify().ok


def test_ledger_binds_each_key_once_and_a_refund_frees_it(ledger: Ledger) -> None:
    user = ledger.accounts.create_account("user", node_id="1", cap_epsilon=5.0, delta=1e-6)
    curve = laplace_curve(0.1)

    def charge(idem: str | None, request_id: str) -> int:
        return admit_and_charge(
            ledger,
            charged_account_id=user.account_id, principal_account_id=user.account_id,
            seed="1", mechanism="common_neighbours", mode="personalized", params={},
            query_curve=curve, query_epsilon=0.1, graph_version="g1",
            request_id=request_id, idempotency_key=idem,
        ).charge_id  # fmt: skip

    released, in_flight = charge(None, "r1"), charge(None, "r2")
    ledger.settlement.refund(in_flight, reason="test: nothing drawn")
    released_too = charge(None, "r3")
    assert ledger.stored_releases.bind_idempotency_keys([(user.account_id, "A", released)]) == [
        released
    ]
    # a later binding of the same key keeps the first; another key binds on its own
    assert ledger.stored_releases.bind_idempotency_keys(
        [(user.account_id, "A", released_too), (user.account_id, "B", released_too)]
    ) == [released, released_too]
    # a charged query under a bound key is not charged: it gets the bound charge back
    reused = admit_and_charge(
        ledger,
        charged_account_id=user.account_id, principal_account_id=user.account_id, seed="1",
        mechanism="common_neighbours", mode="personalized", params={}, query_curve=curve,
        query_epsilon=0.1, graph_version="g1", request_id="r4", idempotency_key="A",
    )  # fmt: skip
    assert reused.reused and reused.charge_id == released
    # a charged key is bound to its charge; refunding the charge frees the key
    keyed = charge("C", "r5")
    assert ledger.stored_releases.bind_idempotency_keys([(user.account_id, "C", released)]) == [
        keyed
    ]
    ledger.settlement.refund(keyed, reason="test: nothing drawn")
    again = charge("C", "r6")
    assert again not in (keyed, released)
    kinds = [(k, kind, live) for k, kind, _, live in bindings(ledger)]
    assert kinds == [
        ("A", "replayed", True), ("B", "replayed", True), ("C", "charged", False),
        ("C", "charged", True),
    ]  # fmt: skip
    report = ledger.reports.verify()
    assert report.ok, report.mismatches


# -- real server processes: two workers, concurrent clients ------------------------------


@dataclass
class TwoWorkers:
    """A ``serve --workers 2`` shared by the module's two-worker tests on one backend: each
    test asks as its own user, under its own keys, and reads its own part of the log."""

    backend: Backend
    server: Server

    def log_since(self, start: int) -> list[dict[str, Any]]:
        return self.server.log_lines()[start:]


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres+redis", marks=[pytest.mark.postgres])],
)
def two_workers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoWorkers]:
    folder = tmp_path_factory.mktemp("two-workers")
    with (
        backend_on(request.param, folder) as backend,
        uvicorn_server(backend, workers=2, forked=True) as server,
    ):
        yield TwoWorkers(backend, server)


@pytest.mark.slow
@pytest.mark.xdist_group("test_idempotency_binding")  # one server per backend: one worker
def test_two_workers_bind_keys_under_concurrent_fresh_draws(two_workers: TwoWorkers) -> None:
    """Many threads re-ask keyed queries on two worker processes while others keep making
    newer releases of the same queries with fresh=true: every keyed answer, first or retried,
    is the one that key first returned; a key raced by two first requests binds once."""
    backend, server = two_workers.backend, two_workers.server
    start = len(server.log_lines())
    principal, key = user_with_key(backend.database_url, "7", cap_epsilon=50.0)
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        the_issue_sequence(http, key, "7", mechanism="noisy_diffusion")

    keys = [f"K-{i}" for i in range(12)]
    first: dict[str, list[Any]] = {}
    seen: dict[str, list[list[Any]]] = {k: [] for k in keys}
    lock = threading.Lock()
    stop = threading.Event()

    def fresh_draws() -> int:
        made = 0
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            while not stop.is_set():
                response = get(http, key, "7", fresh="true", mechanism="noisy_diffusion")
                assert response.status_code == 200, response.text
                made += 1
        return made

    def ask(idem: str) -> None:
        # a new connection per request: the kernel hands it to either worker
        response = fresh.get(
            "/v1/ppr/7",
            params={"k": 5, "epsilon": 0.05, "mechanism": "noisy_diffusion"},
            headers={**bearer(key), "Idempotency-Key": idem},
        )
        if response.status_code == 409:  # the key's first request still in flight
            return
        with lock:
            seen[idem].append(results(response))

    with new_connection_each(server.base_url) as fresh, ThreadPoolExecutor(8) as pool:
        drawers = [pool.submit(fresh_draws) for _ in range(2)]
        # two racing first requests per key, then retries mixed with the fresh draws
        try:  # a failed ask ends the draws too, instead of leaving them to spend the budget
            for _ in range(4):
                list(pool.map(ask, [k for k in keys for _ in range(2)]))
        finally:
            stop.set()
        made = sum(d.result() for d in drawers)
    log = two_workers.log_since(start)

    assert made >= 1
    for idem in keys:
        answers = seen[idem]
        assert answers, idem
        first[idem] = answers[0]
        assert all(a == answers[0] for a in answers), f"{idem} returned different answers"
    pids = {line["pid"] for line in log if line.get("route") == "/v1/ppr/{node_id}"}
    assert len(pids) == 2, "both workers should have answered"
    with open_ledger(backend.database_url) as ledger:
        bound = {k: c for k, _, c, live in bindings(ledger, principal) if live and k in first}
        assert set(bound) == set(keys)
        for idem in keys:
            release = ledger.stored_releases.release_for_charge(bound[idem])
            assert release is not None
            assert [r.node for r in release.results[:5]] == [r["node"] for r in first[idem]]
        report = ledger.reports.verify()
        assert report.ok, report.mismatches


def test_the_migration_binds_the_keys_of_live_charges(ledger_url: str) -> None:
    """A ledger whose charges were made before revision 0006 (here: downgraded to 0003 after
    charging) comes back with every live keyed charge's key bound, and verifies clean."""
    from alembic import command

    from service.ledger.database import alembic_config
    from service.ledger.records import ReleaseKey, StoredRelease
    from service.mechanisms.postprocess import RankedNode

    upgrade(ledger_url)
    with open_ledger(ledger_url) as ledger:
        user = ledger.accounts.create_account("user", node_id="1", cap_epsilon=5.0, delta=1e-6)
        uid, curve = user.account_id, laplace_curve(0.1)
        ids = [
            admit_and_charge(
                ledger,
                charged_account_id=uid, principal_account_id=uid, seed="1",
                mechanism="common_neighbours", mode="personalized", params={},
                query_curve=curve, query_epsilon=0.1, graph_version="g1",
                request_id=f"r{i}", idempotency_key=idem,
            ).charge_id
            for i, idem in enumerate(["released", "refunded", "in-flight", None])
        ]  # fmt: skip
        key = ReleaseKey(uid, "1", "g1", "personalized", 0.1, "common_neighbours")
        stored = StoredRelease(key, ids[0], [RankedNode("2", 0.5)], {}, "r0")
        ledger.settlement.store_release(
            stored, idempotency_key="released", principal_account_id=uid
        )
        ledger.settlement.refund(ids[1], reason="test: nothing drawn")
    command.downgrade(alembic_config(ledger_url), "0003_admin_dashboard")
    upgrade(ledger_url)
    with open_ledger(ledger_url) as ledger:
        assert sorted((k, kind, c, live) for k, kind, c, live in bindings(ledger)) == [
            ("in-flight", "charged", ids[2], True), ("released", "charged", ids[0], True),
        ]  # fmt: skip
        assert ledger.stored_releases.release_for_idempotency_key(uid, "released") == stored
        report = ledger.reports.verify()
        assert report.ok, report.mismatches


def test_a_key_joined_to_an_in_flight_twin_is_freed_when_the_twin_is_refunded(
    ledger: Ledger,
) -> None:
    from service.ledger.records import ReleaseKey

    user = ledger.accounts.create_account("user", node_id="1", cap_epsilon=5.0, delta=1e-6)
    uid, curve = user.account_id, laplace_curve(0.1)
    key = ReleaseKey(uid, "1", "g1", "personalized", 0.1, "common_neighbours")

    def admit(idem: str | None, request_id: str) -> Any:
        return admit_and_charge(
            ledger,
            charged_account_id=uid, principal_account_id=uid, seed="1",
            mechanism="common_neighbours", mode="personalized", params={}, query_curve=curve,
            query_epsilon=0.1, graph_version="g1", request_id=request_id,
            idempotency_key=idem, release_key=key,
        )  # fmt: skip

    twin = admit(None, "r1")
    joined = admit("J", "r2")
    assert joined.joined and joined.charge_id == twin.charge_id
    assert bindings(ledger) == [("J", "joined", twin.charge_id, True)]
    retry = admit("J", "r3")
    assert retry.reused and retry.charge_id == twin.charge_id
    ledger.settlement.reconcile(
        older_than_seconds=0
    )  # the twin's worker died: nothing was released
    assert bindings(ledger) == [("J", "joined", twin.charge_id, False)]
    again = admit("J", "r4")
    assert not (again.reused or again.joined) and again.charge_id != twin.charge_id
    assert bindings(ledger)[-1] == ("J", "charged", again.charge_id, True)
    report = ledger.reports.verify()
    assert report.ok, report.mismatches


# -- popular answers bind their keys too ------------------------------------------------


def popular_bindings(
    ledger: Ledger, principal: int | None = None
) -> list[tuple[str, str | None, str | None, int]]:
    """The ledger's popular bindings (``principal``'s only if given), oldest first."""
    query = (
        select(
            IdempotencyBinding.idempotency_key, IdempotencyBinding.seed,
            IdempotencyBinding.mode, IdempotencyBinding.charge_id,
        )
        .where(IdempotencyBinding.kind == "popular")
        .order_by(IdempotencyBinding.id)
    )  # fmt: skip
    if principal is not None:
        query = query.where(IdempotencyBinding.principal_account_id == principal)
    with ledger.engine.connect() as conn:
        rows = conn.execute(query)
        return [(str(r[0]), r[1], r[2], int(r[3])) for r in rows]


def refused_for_the_key(response: Any) -> None:
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"]["parameter"] == "Idempotency-Key"


def test_a_popular_answer_binds_its_key(backend: Backend) -> None:
    """A key first used for ``popular`` is bound (kind ``popular``) to the account's charge for
    the degree release, with the query's node and mode: its retries are that answer
    (``replayed``, with or without ``exclude_neighbors``), and no charged query may take it.
    Before, nothing was recorded and a later charged query under the key was charged."""
    account_id, key = user_with_key(backend.database_url, "7", cap_epsilon=5.0)
    with running_app(backend) as client:
        ledger = ledger_of(client)
        first = get(client, key, "7", "P-1", mechanism="popular")
        assert first.json()["replayed"] is False and first.json()["epsilon_charged"] > 0
        dropped = results(get(client, key, "7", mechanism="popular", exclude_neighbors="true"))
        for extra in ({}, {"fresh": "true"}, {"k": 3}):
            retry = get(client, key, "7", "P-1", mechanism="popular", **extra)
            assert retry.json()["replayed"] is True and retry.json()["epsilon_charged"] == 0
            assert results(retry) == results(first)[: extra.get("k", 5)]
        without = get(client, key, "7", "P-1", mechanism="popular", exclude_neighbors="true")
        assert without.json()["replayed"] is True and results(without) == dropped
        # another query under the key: refused, nothing charged, the key keeps its answer
        refused_for_the_key(get(client, key, "7", "P-1", mechanism="noisy_diffusion"))
        refused_for_the_key(get(client, key, "7", "P-1", mechanism="popular", mode="edge"))
        assert results(get(client, key, "7", "P-1", mechanism="popular")) == results(first)
        # and the other way round: a charged query's key is not taken by popular
        results(get(client, key, "7", "N-1", mechanism="common_neighbours"))
        refused_for_the_key(get(client, key, "7", "N-1", mechanism="popular"))
        # a key first used with exclude_neighbors binds the same way
        kept = get(client, key, "7", "P-2", mechanism="popular", exclude_neighbors="true")
        assert results(kept) == dropped
        again = get(client, key, "7", "P-2", mechanism="popular")
        assert again.json()["replayed"] is True and results(again) == results(first)

        charges = ledger.reports.list_charges(account_id)
        degree = [c for c in charges if c.mechanism == "degree_release"]
        assert len(degree) == 1 and len(charges) == 2  # the degree release, common_neighbours
        assert popular_bindings(ledger) == [
            ("P-1", "7", "personalized", degree[0].charge_id),
            ("P-2", "7", "personalized", degree[0].charge_id),
        ]
        report = ledger.reports.verify()
        assert report.ok, report.mismatches


def test_a_popular_key_after_a_new_graph_version_is_refused(backend: Backend) -> None:
    """The first answer under a popular key ranked the old version's degree release: after a
    reload, its retry is 422 (as for a charged query's key), not the new version's ranking."""
    with running_app(backend) as client:
        ledger = ledger_of(client)
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=1e-6, modes=["edge"]
        )
        key, _ = ledger.api_keys.create_api_key(service.account_id)
        admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
        admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
        first = get(client, key, "11", "E-1", mechanism="popular", mode="edge")
        assert get(client, key, "11", "E-1", mechanism="popular", mode="edge").json()["replayed"]
        write_generated_edge_list(backend.graph_path, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
        reloaded = client.post("/v1/admin/graph/reload", headers=bearer(admin_key))
        assert reloaded.json()["version"] != first.json()["graph_version"]
        refused_for_the_key(get(client, key, "11", "E-1", mechanism="popular", mode="edge"))
        fresh_key = get(client, key, "11", "E-2", mechanism="popular", mode="edge")
        assert fresh_key.json()["graph_version"] == reloaded.json()["version"]
        report = ledger.reports.verify()
        assert report.ok, report.mismatches


def test_a_batch_of_popular_items_binds_each_item_key(backend: Backend) -> None:
    with running_app(backend) as client:
        ledger = ledger_of(client)
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=1e-6, modes=["edge"]
        )
        key, _ = ledger.api_keys.create_api_key(service.account_id)
        nodes = ["3", "4", "5"]
        first = batch(client, key, nodes, "popular-1", mechanism="popular")
        assert first.status_code == 200, first.text
        assert not any(i["replayed"] for i in first.json()["items"])
        retry = batch(client, key, nodes, "popular-1", mechanism="popular")
        assert all(i["replayed"] for i in retry.json()["items"])
        items = [i["results"] for i in first.json()["items"]]
        assert [i["results"] for i in retry.json()["items"]] == items
        clash = batch(client, key, nodes, "popular-1")  # noisy_diffusion under the same key
        assert all(i["error"]["code"] == "invalid_parameter" for i in clash.json()["items"])
        assert len(ledger.reports.list_charges(service.account_id)) == 1  # the degree release only
        assert len(popular_bindings(ledger)) == 3
        assert ledger.reports.verify().ok


@pytest.mark.slow
@pytest.mark.xdist_group("test_idempotency_binding")  # one server per backend: one worker
def test_two_workers_give_a_key_to_popular_or_to_a_charged_query_never_both(
    two_workers: TwoWorkers,
) -> None:
    """On two worker processes, each key is raced by a popular request (with or without
    exclude_neighbors) and a charged one: exactly one of them is answered, the other is 422,
    and every retry of the winner returns its first answer."""
    backend, server = two_workers.backend, two_workers.server
    start = len(server.log_lines())
    # node 9's user: the other two-worker test on this server asks as node 7's
    principal, key = user_with_key(backend.database_url, "9", cap_epsilon=50.0)
    keys = [f"R-{i}" for i in range(10)]
    queries = {
        "popular": {"mechanism": "popular"},
        "popular-excluding": {"mechanism": "popular", "exclude_neighbors": "true"},
        "charged": {"mechanism": "common_neighbours", "fresh": "true"},
    }

    def ask(idem: str, which: str) -> tuple[str, str, int, Any]:
        response = fresh.get(
            "/v1/ppr/9",
            params={"k": 5, "epsilon": 0.05, **queries[which]},
            headers={**bearer(key), "Idempotency-Key": idem},
        )  # a new connection per request: the kernel hands it to either worker
        body = response.json()
        return idem, which, response.status_code, body.get("results", body)

    with new_connection_each(server.base_url) as fresh, ThreadPoolExecutor(6) as pool:
        races = [(k, "popular-excluding" if i % 2 else "popular") for i, k in enumerate(keys)]
        firsts = list(
            pool.map(
                lambda pair: ask(*pair),
                [(k, w) for k, w in races] + [(k, "charged") for k in keys],
            )
        )
        retries = list(pool.map(lambda f: ask(f[0], f[1]), firsts * 2))
    log = two_workers.log_since(start)
    winners: dict[str, tuple[str, Any]] = {}
    for idem, which, status, found in firsts:
        assert status in (200, 422), (idem, which, status, found)
        if status == 200:
            assert idem not in winners, f"{idem} answered two different queries"
            winners[idem] = (which, found)
    assert set(winners) == set(keys)
    for idem, which, status, found in retries:
        if winners[idem][0] == which:
            assert status == 200 and found == winners[idem][1], (idem, which)
        else:
            assert status == 422, (idem, which, status)
    pids = {line["pid"] for line in log if line.get("route") == "/v1/ppr/{node_id}"}
    assert len(pids) == 2, "both workers should have answered"
    with open_ledger(backend.database_url) as ledger:
        popular = {k for k, _, _, _ in popular_bindings(ledger, principal)}
        assert popular == {k for k, (w, _) in winners.items() if w != "charged"}
        report = ledger.reports.verify()
        assert report.ok, report.mismatches


def test_verify_checks_popular_bindings(ledger: Ledger) -> None:
    """``ledger verify`` flags a popular binding that names anything but a released
    degree-release charge, and a charged query's binding that names a degree-release charge."""
    from service.ledger.records import DegreeCharge
    from service.ledger.tables import utcnow

    user = ledger.accounts.create_account("user", node_id="1", cap_epsilon=5.0, delta=1e-6)
    uid, curve = user.account_id, laplace_curve(0.1)
    popular = ledger.quota_and_degree.admit_degree_release(
        charged_account_id=uid, principal_account_id=uid, seed="1", mode="personalized",
        degree=DegreeCharge("g1", 0.1, curve), request_id="r1", idempotency_key="P",
    )  # fmt: skip
    assert popular.charged and not popular.replayed
    again = ledger.quota_and_degree.admit_degree_release(
        charged_account_id=uid, principal_account_id=uid, seed="1", mode="personalized",
        degree=DegreeCharge("g1", 0.1, curve), request_id="r2", idempotency_key="P",
    )  # fmt: skip
    assert again.replayed and not again.charged
    assert ledger.reports.verify().ok
    charged = admit_and_charge(
        ledger,
        charged_account_id=uid, principal_account_id=uid, seed="1",
        mechanism="common_neighbours", mode="personalized", params={}, query_curve=curve,
        query_epsilon=0.1, graph_version="g1", request_id="r3", idempotency_key=None,
    ).charge_id  # fmt: skip
    degree_charge = next(
        c.charge_id for c in ledger.reports.list_charges(uid) if c.charge_id != charged
    )
    with ledger.engine.begin() as conn:
        conn.execute(
            IdempotencyBinding.__table__.insert(),  # type: ignore[attr-defined]
            [
                {"principal_account_id": uid, "idempotency_key": "bad-popular",
                 "charge_id": charged, "kind": "popular", "created_at": utcnow(),
                 "seed": "1", "mode": "personalized"},
                {"principal_account_id": uid, "idempotency_key": "bad-charged",
                 "charge_id": degree_charge, "kind": "replayed", "created_at": utcnow(),
                 "seed": None, "mode": None},
            ],
        )  # fmt: skip
    details = {
        m["detail"] for m in ledger.reports.verify().mismatches if m["kind"] == "idempotency"
    }
    assert details == {
        "popular Idempotency-Key not bound to a released degree-release charge",
        "Idempotency-Key of a charged query bound to a degree-release charge",
    }
