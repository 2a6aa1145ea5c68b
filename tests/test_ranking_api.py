"""``mechanism=`` on the query and batch endpoints, on SQLite and on PostgreSQL + Redis: each
ranking is charged as its own release, replays key on the mechanism, the personalized-only
rankings are refused in edge mode, and the graph version's one DP degree release is charged to
the graph-wide exposure exactly once, also when two worker processes ask for it at once."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.graph.generate import write_generated_edge_list
from service.graph.loader import load_edge_list
from service.ledger import upgrade
from service.mechanisms.blended import MAX_COUNT_WEIGHT
from service.mechanisms.common_neighbours import common_neighbour_counts
from service.mechanisms.postprocess import score_grid
from service.mechanisms.registry import DEFAULT_MECHANISM
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import plan_diffusion
from service.privacy.curves import laplace_curve
from service.privacy.laplace import plan_laplace
from service.privacy.modes import Mode
from service.privacy.sampler import count_release_delta
from service.serving.rankings import degree_release_name
from tests import test_api
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    bearer,
    ledger_of,
    open_ledger,
    running_app,
    user_with_key,
    uvicorn_server,
)
from tests.connection_support import new_connection_each
from tests.test_api import Accounts, charge_count, query

backend = test_api.backend


@pytest.fixture
def client(backend: Backend) -> Iterator[TestClient]:
    # the service's real default ranking (the shared test settings pin noisy_diffusion)
    with running_app(backend, default_mechanism=DEFAULT_MECHANISM.value) as client:
        yield client


@pytest.fixture
def accounts(client: TestClient) -> Accounts:
    return Accounts(client)


def graph_releases(database_url: str) -> list[tuple[str, str, str]]:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.ledger.tables import GraphRelease

    with open_ledger(database_url) as ledger, Session(ledger._engine) as session:
        rows = session.execute(
            select(GraphRelease.graph_version, GraphRelease.mechanism, GraphRelease.state)
        ).all()
    return [(str(v), str(m), str(s)) for v, m, s in rows]


def test_each_mechanism_is_named_calibrated_and_charged(
    client: TestClient, accounts: Accounts, backend: Backend
) -> None:
    account_id, key = accounts.user("5")
    cn = query(client, key, "5", k=30, epsilon=0.2, mechanism="common_neighbours")
    assert cn.status_code == 200, cn.text
    body = cn.json()
    delta = body["budget"]["delta"]
    assert body["mechanism"] == {
        "name": "common_neighbours", "mode": "personalized", "epsilon": 0.2,
        "delta": count_release_delta(0.2),
        "sensitivity": 2.0, "noise_scale": 10.0, "score_grid": score_grid(10.0),
    }  # fmt: skip
    assert all((r["score"] / score_grid(10.0)).is_integer() for r in body["results"])
    assert body["epsilon_charged"] == 0.2
    assert body["budget"]["spent_epsilon"] == pytest.approx(laplace_curve(0.2).epsilon(delta))

    fof = query(client, key, "5", k=30, epsilon=0.2, mechanism="friends_of_friends").json()
    assert fof["mechanism"] == {
        "name": "friends_of_friends", "mode": "personalized", "epsilon": 0.2,
        "delta": count_release_delta(0.2),
        "sensitivity": 2.0, "noise_scale": 10.0, "friend_noise_scale": 10.0,
        "candidate_sensitivity": 1.0, "candidate_noise_scale": 5.0,
        "score_grid": score_grid(5.0),
    }  # fmt: skip
    assert all((r["score"] / score_grid(5.0)).is_integer() for r in fof["results"])
    # charged exactly as common_neighbours at the same epsilon (the same Laplace curve)
    assert fof["epsilon_charged"] == 0.2
    spent = laplace_curve(0.2) * 2
    assert fof["budget"]["spent_epsilon"] == pytest.approx(spent.epsilon(delta))
    # friends_of_friends is the default: a query that names no mechanism replays its release
    default = query(client, key, "5", k=30, epsilon=0.2).json()
    assert default["mechanism"] == fof["mechanism"] and default["replayed"] is True
    assert default["results"] == fof["results"] and default["epsilon_charged"] == 0.0

    blended = query(client, key, "5", k=30, epsilon=0.2, mechanism="blended").json()
    mech = blended["mechanism"]
    assert mech["name"] == "blended" and mech["epsilon"] == 0.2 and mech["noise_scale"] == 10.0
    assert mech["friend_noise_scale"] == 10.0 and mech["candidate_noise_scale"] == 5.0
    assert mech["degree_epsilon"] == 0.1 and mech["degree_noise_scale"] == 20.0
    assert 0.0 <= mech["weight"] <= MAX_COUNT_WEIGHT and mech["score_grid"] > 0
    # the first answer built on the version's degree release also pays for it (eps_d = 0.1)
    assert blended["epsilon_charged"] == pytest.approx(0.2 + 0.1)
    spent = laplace_curve(0.2) * 3 + laplace_curve(0.1)
    assert blended["budget"]["spent_epsilon"] == pytest.approx(spent.epsilon(delta))
    grid = mech["score_grid"]
    assert grid == 2.0 ** np.floor(np.log2(grid))  # a power of two
    assert all((r["score"] / grid).is_integer() for r in blended["results"])
    # the seed's friends come first (free in the personalized model), ranked as rounded
    graph = load_edge_list(backend.graph_path)
    friends = set(graph.external_ids(graph.neighbors(graph.index_of("5"))))
    ranked = [r["node"] for r in blended["results"]]
    head = ranked[: len(friends)]
    assert set(head) == friends or set(ranked) <= friends
    scores = [r["score"] for r in blended["results"]]
    assert scores == sorted(scores, reverse=True)

    popular = query(client, key, "5", k=10, mechanism="popular").json()
    assert popular["mechanism"]["name"] == "popular" and popular["epsilon_charged"] == 0.0
    assert popular["mechanism"]["noise_scale"] == 20.0
    assert popular["mechanism"]["score_grid"] == score_grid(20.0)
    assert popular["budget"]["charges"] == 4  # the degree release was paid with blended

    diffusion = query(client, key, "5", k=10, epsilon=0.2, mechanism="noisy_diffusion").json()
    assert diffusion["mechanism"]["name"] == "noisy_diffusion"
    curve = (
        laplace_curve(0.2) * 3
        + laplace_curve(0.1)
        + plan_diffusion(0.2, delta, 30, 0.8, 1e-7, "personalized").curve
    )
    assert diffusion["budget"]["spent_epsilon"] == pytest.approx(curve.epsilon(delta))
    charges = ledger_of(client).reports.list_charges(account_id)
    assert sorted(c.mechanism for c in charges) == [
        "blended", "common_neighbours", "degree_release", "friends_of_friends", "noisy_diffusion"
    ]  # fmt: skip
    # the ledger stores the one-scale Laplace curve at eps for every count-based charge
    for charge in charges:
        if charge.mechanism not in ("noisy_diffusion", "degree_release"):
            assert charge.epsilon == 0.2


def test_noisy_common_neighbours_centre_on_the_exact_counts(
    client: TestClient, accounts: Accounts, backend: Backend
) -> None:
    """The served counts are the exact |N(s) & N(v)| plus noise of the stated scale (a test
    that fails if the counts or the scale are wrong)."""
    _, key = accounts.user("7", cap_epsilon=100.0)
    graph = load_edge_list(backend.graph_path)
    exact = common_neighbour_counts(graph, graph.index_of("7"))
    body = query(client, key, "7", k=1000, epsilon=2.0, mechanism="common_neighbours").json()
    served = {r["node"]: r["score"] for r in body["results"]}
    ids = graph.external_ids(np.arange(graph.n))
    errors = [served[v] - exact[i] for i, v in enumerate(ids) if v in served and served[v] > 0]
    assert len(errors) > 100
    # Lap(1): mean |error| is 1 (scores clipped at 0 are left out, hence the loose bounds)
    assert 0.6 < float(np.mean(np.abs(errors))) < 1.4


def _mean_absolute_deviation(errors: list[float]) -> float:
    """Mean |x - median(x)|: the Laplace scale b of x = constant + Lap(b) (its MLE)."""
    values = np.asarray(errors, dtype=np.float64)
    return float(np.mean(np.abs(values - np.median(values))))


def test_two_scale_counts_have_the_stated_scale_on_each_part(
    client: TestClient, accounts: Accounts, backend: Backend
) -> None:
    """``friends_of_friends`` serves c~ - low + 1 on the candidates and the same plus one
    constant on the friends (every score >= 1, so nothing is clipped): within each part the
    served score minus the exact count is a constant plus Laplace noise of that part's scale,
    Lap(1/eps) on the candidates and Lap(2/eps) on the friends. The estimated scales would be
    twice too large with the one-scale noise on the candidates, and half too small with the
    candidates' scale on the friends."""
    graph = load_edge_list(backend.graph_path)
    candidate_errors: list[float] = []
    friend_errors: list[list[float]] = []
    # 3 seeds x 4 answers: at eps 2 each, a fifth answer of one account composes past the eps
    # at which the sampler's share still fits in its delta (docs/privacy.md section 5)
    for draw in range(12):
        if draw % 4 == 0:
            seed = int(np.argsort(graph.degrees)[-1 - draw // 4])
            node = str(graph.node_ids[seed])
            _, key = accounts.user(node, cap_epsilon=1000.0)
            exact = common_neighbour_counts(graph, seed)
            friends = set(graph.neighbors(seed).tolist())
        body = query(
            client, key, node, k=1000, epsilon=2.0, mechanism="friends_of_friends", fresh="true"
        ).json()
        assert body["mechanism"]["candidate_noise_scale"] == 0.5
        assert body["mechanism"]["friend_noise_scale"] == 1.0
        assert len(body["results"]) == graph.n - 1  # every node but the seed, none clipped
        draw_candidates: list[float] = []
        draw_friends: list[float] = []
        for r in body["results"]:
            i = graph.index_of(r["node"])
            part = draw_friends if i in friends else draw_candidates
            part.append(r["score"] - exact[i])
        # one draw's shift is a constant per part: remove it before pooling the draws
        candidate_errors += list(np.asarray(draw_candidates) - np.median(draw_candidates))
        friend_errors.append(list(np.asarray(draw_friends) - np.median(draw_friends)))
    pooled_friends = [e for draw in friend_errors for e in draw]
    assert len(candidate_errors) > 2000 and len(pooled_friends) > 200
    assert 0.45 < _mean_absolute_deviation(candidate_errors) < 0.55  # b_c = 1 / eps = 0.5
    assert 0.8 < _mean_absolute_deviation(pooled_friends) < 1.2  # b_f = 2 / eps = 1
    # the friends all rank above every candidate (free in the personalized model)
    ranked = [graph.index_of(r["node"]) for r in body["results"]]
    assert set(ranked[: len(friends)]) == friends


def test_replays_key_on_the_mechanism(client: TestClient, accounts: Accounts) -> None:
    _, key = accounts.user("9")
    names = ("blended", "friends_of_friends", "common_neighbours", "noisy_diffusion")
    first = {
        name: query(client, key, "9", k=20, epsilon=0.1, mechanism=name).json() for name in names
    }
    assert all(not body["replayed"] for body in first.values())
    assert charge_count(client) == 5  # and blended's degree release, once
    for name, body in first.items():
        again = query(client, key, "9", k=20, epsilon=0.1, mechanism=name).json()
        assert again["replayed"] is True and again["results"] == body["results"]
        assert again["mechanism"] == body["mechanism"]
    assert charge_count(client) == 5
    # the default (friends_of_friends) replays friends_of_friends' release
    default = query(client, key, "9", k=20, epsilon=0.1).json()
    assert default["replayed"] is True
    assert default["results"] == first["friends_of_friends"]["results"]
    # an Idempotency-Key belongs to one mechanism
    ok = query(client, key, "9", k=5, mechanism="blended", fresh="true", idempotency_key="a-1")
    assert ok.status_code == 200 and charge_count(client) == 6
    for other in ("common_neighbours", "friends_of_friends", "popular"):
        clash = query(client, key, "9", k=5, mechanism=other, idempotency_key="a-1")
        assert clash.status_code == 422
        assert clash.json()["error"]["details"]["parameter"] == "Idempotency-Key"
    assert charge_count(client) == 6


def test_personalized_only_rankings_are_refused_in_edge_mode(
    client: TestClient, accounts: Accounts
) -> None:
    _, service_key = accounts.service(modes=["edge", "personalized"])
    for name in ("blended", "friends_of_friends", "common_neighbours"):
        refused = query(client, service_key, "4", mode="edge", mechanism=name)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_parameter"
        assert error["details"]["parameter"] == "mechanism"
        assert "personalized mode only" in error["message"] and name in error["message"]
    unknown = query(client, service_key, "4", mechanism="pagerank")
    assert unknown.status_code == 422
    assert unknown.json()["error"]["details"]["parameter"] == "mechanism"
    assert charge_count(client) == 0
    # edge mode without a mechanism: the personalized-only default falls back to the diffusion
    edge = query(client, service_key, "4", mode="edge", k=5)
    assert edge.status_code == 200 and edge.json()["mechanism"]["name"] == "noisy_diffusion"
    popular = query(client, service_key, "4", mode="edge", k=5, mechanism="popular")
    assert popular.status_code == 200 and popular.json()["epsilon_charged"] == 0.1
    assert charge_count(client) == 2  # the degree release, charged to the service account

    for name in ("blended", "friends_of_friends"):
        batch = client.post(
            "/v1/ppr/batch",
            json={"nodes": ["4", "6"], "mode": "edge", "mechanism": name},
            headers=bearer(service_key),
        )
        assert batch.status_code == 422
        assert batch.json()["error"]["details"]["parameter"] == "mechanism"
    assert charge_count(client) == 2


def test_batch_takes_the_mechanism(client: TestClient, accounts: Accounts) -> None:
    _, key_a = accounts.user("11")
    _, service_key = accounts.service(modes=["personalized"], may_create_seed_accounts=False)
    accounts.user("12")
    answer = client.post(
        "/v1/ppr/batch",
        json={"nodes": ["11", "12"], "k": 5, "epsilon": 0.3, "mechanism": "common_neighbours"},
        headers=bearer(service_key),
    )
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    charged = [i["epsilon_charged"] for i in items]
    assert charged == [plan_laplace(0.3, 2.0).epsilon] * 2 and charged[0] <= 0.3
    charges = ledger_of(client).reports.list_charges(None)
    assert {c.mechanism for c in charges} == {"common_neighbours"} and len(charges) == 2
    # the same release, asked for singly, is a replay
    single = query(client, key_a, "11", k=5, epsilon=0.3, mechanism="common_neighbours").json()
    assert single["replayed"] is True and single["results"] == items[0]["results"]


def test_the_degree_release_is_charged_once_per_graph_version(
    client: TestClient, accounts: Accounts, backend: Backend
) -> None:
    ledger = ledger_of(client)
    _, key = accounts.user("3")
    _, other = accounts.user("8")
    for k, mechanism, user, node in (
        (5, "popular", key, "3"), (5, "blended", key, "3"), (5, "popular", other, "8"),
        (5, "blended", other, "8"),
    ):  # fmt: skip
        assert query(client, user, node, k=k, mechanism=mechanism).status_code == 200
    version = client.get("/v1/admin/graph", headers=bearer(accounts.admin_key)).json()["version"]
    name = degree_release_name(20.0)
    assert graph_releases(backend.database_url) == [(version, name, "released")]
    report = ledger.reports.exposure(delta=1e-6)
    assert report.graph_releases == 1
    charged = RdpCurve.zero()
    for _ in range(2):
        charged = charged + laplace_curve(0.1)  # the two blended queries at the default 0.1
    assert report.epsilon == pytest.approx((charged + laplace_curve(0.1)).epsilon(1e-6))
    # the same released bytes serve every query: popular answers agree across users
    a = query(client, key, "3", k=50, mechanism="popular").json()["results"]
    b = query(client, other, "8", k=50, mechanism="popular").json()["results"]
    assert [r for r in a if r["node"] != "8"][:40] == [r for r in b if r["node"] != "3"][:40]

    # a new version is a new release, charged again
    write_generated_edge_list(backend.graph_path, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
    reload = client.post("/v1/admin/graph/reload", headers=bearer(accounts.admin_key))
    assert reload.status_code == 200
    assert query(client, key, "3", k=5, mechanism="popular").status_code == 200
    releases = graph_releases(backend.database_url)
    assert len(releases) == 2 and {r[0] for r in releases} == {version, reload.json()["version"]}
    assert ledger.reports.exposure(delta=1e-6).graph_releases == 2


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_two_workers_make_one_degree_release(postgres_url: str, tmp_path: Path) -> None:
    """Concurrent first queries on two worker processes: one release, one exposure charge."""
    if not test_api.redis_answers():
        pytest.skip("Redis does not answer")
    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    upgrade(postgres_url)
    users = [user_with_key(postgres_url, str(node)) for node in range(20, 36)]
    backend = Backend("postgres+redis", postgres_url, test_api.REDIS_URL, graph_path)
    try:
        with (
            uvicorn_server(
                backend, workers=2, extra_env={"PPR_DEFAULT_MECHANISM": "blended"}, forked=True
            ) as server,
            new_connection_each(server.base_url) as fresh,
        ):

            def ask(i: int) -> httpx.Response:
                _, key = users[i % len(users)]
                node = str(20 + i % len(users))
                params: dict[str, Any] = {"k": 5}
                if i % 2:
                    params["mechanism"] = "popular"
                # a new connection each
                return fresh.get(f"/v1/ppr/{node}", params=params, headers=bearer(key))

            with ThreadPoolExecutor(max_workers=32) as pool:
                responses = list(pool.map(ask, range(32)))
            served_by = {
                line["pid"]
                for line in server.log_lines()
                if line.get("route") == "/v1/ppr/{node_id}"
            }
    finally:
        test_api.forget_cached_keys(postgres_url, test_api.REDIS_URL)
    assert [r.status_code for r in responses] == [200] * 32, [r.text for r in responses]
    assert {r.json()["mechanism"]["name"] for r in responses} == {"blended", "popular"}
    assert len(served_by) == 2, "both workers answered"
    releases = graph_releases(postgres_url)
    assert len(releases) == 1 and releases[0][2] == "released"
    with open_ledger(postgres_url) as ledger:
        report = ledger.reports.exposure(delta=1e-6)
        charges = ledger.reports.list_charges(None, limit=1000)
    assert report.graph_releases == 1
    # even requests ask 8 users twice for blended (the second is a replay or a joined twin)
    blended = [c for c in charges if c.mechanism == "blended"]
    degree = [c for c in charges if c.mechanism == "degree_release"]
    assert len(blended) == 8 and len(blended) + len(degree) == len(charges)
    # every one of the 16 users paid the degree release exactly once
    assert sorted(c.charged_account_id for c in degree) == sorted(a for a, _ in users)
    # the exposure counts the release once, not once per account that paid for it
    expected = laplace_curve(0.1) * 9  # 8 blended charges + the one degree release
    assert report.epsilon == pytest.approx(expected.epsilon(1e-6))
    assert report.shards_epsilon == pytest.approx(report.epsilon)


def test_openapi_states_the_mechanism(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    params = {p["name"]: p for p in schema["paths"]["/v1/ppr/{node_id}"]["get"]["parameters"]}
    assert "mechanism" in params
    mechanism = schema["components"]["schemas"]["Mechanism"]
    assert set(mechanism["required"]) == {"name", "mode", "epsilon", "delta", "noise_scale"}
    assert {"score_grid", "degree_epsilon", "weight", "beta"} <= set(mechanism["properties"])
    assert {"friend_noise_scale", "candidate_noise_scale"} <= set(mechanism["properties"])
    assert "friends_of_friends" in mechanism["properties"]["name"]["enum"]
    assert "mechanism" in schema["components"]["schemas"]["BatchQuery"]["properties"]


def test_service_default_is_the_new_ranking() -> None:
    from service.config import Settings

    assert Settings().default_mechanism.value == "friends_of_friends"
    assert Mode.PERSONALIZED.value == "personalized"


def test_the_degree_release_respects_the_graph_cap(backend: Backend) -> None:
    """A degree release that would pass PPR_GRAPH_CAP_EPSILON is refused (nothing drawn or
    charged); under a cap it fits, it is made and counted in the exposure the cap reads."""
    with running_app(backend, graph_cap_epsilon=0.05) as client:
        accounts = Accounts(client)
        _, key = accounts.user("3")
        for mechanism in ("popular", "blended"):
            refused = query(client, key, "3", k=5, mechanism=mechanism)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "graph_budget_exhausted", refused.text
        assert graph_releases(backend.database_url) == []
        assert charge_count(client) == 0
        ok = query(client, key, "3", k=5, epsilon=0.02, mechanism="common_neighbours")
        assert ok.status_code == 200, ok.text
    with running_app(backend, graph_cap_epsilon=0.5) as client:
        _, key = accounts.user("4")
        assert query(client, key, "4", k=5, mechanism="popular").status_code == 200
        assert len(graph_releases(backend.database_url)) == 1
        assert ledger_of(client).reports.exposure(delta=1e-6).graph_releases == 1


@pytest.mark.parametrize("default", ["friends_of_friends", "blended"])
def test_a_two_scale_ranking_can_be_the_configured_default(backend: Backend, default: str) -> None:
    """PPR_DEFAULT_MECHANISM=friends_of_friends (the service's default) or blended (the advice
    for well-mixed graphs): a query that names no mechanism uses it in personalized mode (a
    blended one also pays the degree release) and the diffusion in edge mode."""
    with running_app(backend, default_mechanism=default) as client:
        accounts = Accounts(client)
        _, key = accounts.user("6")
        body = query(client, key, "6", k=5, epsilon=0.3).json()
        assert body["mechanism"]["name"] == default
        assert body["mechanism"]["candidate_noise_scale"] == plan_laplace(0.3, 2.0).scale / 2
        degree = 1 if default == "blended" else 0
        charged = plan_laplace(0.3, 2.0).epsilon + 0.1 * degree
        assert body["epsilon_charged"] == pytest.approx(charged)
        again = query(client, key, "6", k=5, epsilon=0.3, mechanism=default).json()
        assert again["replayed"] is True and again["results"] == body["results"]
        _, service_key = accounts.service(modes=["edge"])
        edge = query(client, service_key, "6", mode="edge", k=5)
        assert edge.status_code == 200 and edge.json()["mechanism"]["name"] == "noisy_diffusion"
        assert charge_count(client) == 2 + degree
