"""Issue 19, findings 1, 2, 3, 6 and 7: nothing a caller sees is an exact function of the edges.

Each test fails on the old behaviour: the version was a hash of the edges, the node set was
the ids the edges named, delta was min(1e-6, 1/|E|), the count releases drew with
``Generator.laplace`` and stated delta 0 (then with the float64 ziggurat, stating its coupling
delta; now exactly, stating 0), and kappa used the graph's own largest degree.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import MechanismSettings, Settings
from service.errors import GraphLoadError
from service.graph.build import build_graph
from service.graph.demo import demo_graph
from service.graph.loader import load_edge_list, read_node_list
from service.ledger import Ledger, upgrade
from service.mechanisms.engine import DiffusionJob, margin_degree, run_jobs
from service.mechanisms.randomness import laplace_noise
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import DiffusionConfig
from service.privacy.modes import Mode
from service.privacy.sampler import count_release_delta
from service.privacy.state_grid import step_noise_plan
from service.serving.graph_identity import as_served
from tests.api_support import Backend, bearer, open_ledger, running_app, user_with_key
from tests.cli_runner_support import run_cli
from tests.ledger_support import graph_fingerprint_of

# --------------------------------------------------------------------------- finding 1


def test_public_graph_id_is_random_stable_and_not_the_fingerprint(ledger: Ledger) -> None:
    graph = build_graph([0, 1, 2], [1, 2, 3])
    served = as_served(graph, ledger.graph_versions, max_degree_bound=10)
    assert served.version != graph.fingerprint == served.fingerprint
    again = as_served(build_graph([2, 1, 0], [3, 2, 1]), ledger.graph_versions, max_degree_bound=10)
    assert again.version == served.version  # same content: the recorded id, in any worker
    toggled = as_served(
        build_graph([0, 1], [1, 2], num_nodes=4), ledger.graph_versions, max_degree_bound=10
    )
    assert toggled.version not in (served.version, toggled.fingerprint)
    assert graph_fingerprint_of(ledger, served.version) == graph.fingerprint


def test_two_ledgers_give_the_same_graph_unrelated_ids(tmp_path: Path) -> None:
    graph = build_graph([0, 1], [1, 2])
    ids = []
    for name in ("a", "b"):
        url = f"sqlite:///{tmp_path / name}.db"
        upgrade(url)
        with open_ledger(url) as ledger:
            ids.append(ledger.graph_versions.public_graph_version(graph.fingerprint))
    assert ids[0] != ids[1] and len(ids[0]) == 20


def test_an_old_ledger_keeps_its_recorded_version_as_the_public_id(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0003_admin_dashboard")
    old = demo_graph().fingerprint  # what main stored and showed: the content hash
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO ledger_meta (key, value) VALUES ('current_graph_version', :v)"),
            {"v": old},
        )
    engine.dispose()
    upgrade(url)
    with open_ledger(url) as ledger:
        assert ledger.graph_versions.public_graph_version(old) == old
        assert ledger.reports.verify().ok


@pytest.fixture
def app_backend(tmp_path: Path) -> Iterator[Backend]:
    path = tmp_path / "graph.txt"
    path.write_text("0 1\n1 2\n2 3\n3 0\n0 2\n")
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("0\n1\n2\n3\nlonely\n")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    yield Backend("sqlite", url, None, path, env={"nodes": str(nodes)})


def _client(backend: Backend, **overrides: object) -> TestClient:
    return running_app(  # type: ignore[return-value]
        backend, nodes_path=Path(backend.env["nodes"]), steps=5, **overrides
    )


def test_answers_carry_the_public_id_and_admins_see_the_fingerprint(
    app_backend: Backend,
) -> None:
    _, key = user_with_key(app_backend.database_url, "1")
    with _client(app_backend) as client:
        answer = client.get("/v1/ppr/1", params={"k": 2}, headers=bearer(key)).json()
        with open_ledger(app_backend.database_url) as ledger:
            admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
            admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
        info = client.get("/v1/admin/graph", headers=bearer(admin_key)).json()
    nodes = read_node_list(app_backend.env["nodes"])
    fingerprint = load_edge_list(app_backend.graph_path, nodes=nodes).fingerprint
    assert answer["graph_version"] == info["version"] != fingerprint
    assert info["fingerprint"] == fingerprint and info["node_set"] == "listed"
    assert info["max_degree_bound"] == 10_000


# --------------------------------------------------------------------------- finding 2


def test_a_listed_node_without_edges_is_served(app_backend: Backend) -> None:
    _, key = user_with_key(app_backend.database_url, "lonely")
    with open_ledger(app_backend.database_url) as ledger:
        service = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=1e-6)
        service_key, _ = ledger.api_keys.create_api_key(service.account_id)
    with _client(app_backend) as client:
        alone = client.get("/v1/ppr/lonely", params={"mode": "edge", "k": 3}, headers=bearer(key))
        unknown = client.get("/v1/ppr/nobody", params={"mode": "edge"}, headers=bearer(service_key))
        ready = _admin_readiness(client, app_backend.database_url)
    assert alone.status_code == 200, alone.text
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_node"
    assert ready["checks"]["graph"]["node_set"] == "listed"


def test_the_node_set_comes_from_the_list_not_the_edges(tmp_path: Path) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("a b\n")
    with_edge = load_edge_list(edges, nodes=["a", "b", "c"], header=False)
    edges.write_text("a c\n")
    other = load_edge_list(edges, nodes=["c", "b", "a"], header=False)
    assert list(with_edge.node_ids) == list(other.node_ids) == ["a", "b", "c"]
    assert with_edge.index_of("b") == other.index_of("b") == 1


def test_an_edge_naming_an_unlisted_node_is_refused_with_its_line(tmp_path: Path) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("# comment\n1 2\n2 3\n3 99\n")
    with pytest.raises(GraphLoadError) as caught:
        load_edge_list(edges, nodes=["1", "2", "3"])
    assert caught.value.line == 4 and "'99'" in str(caught.value)
    nodes = tmp_path / "n.txt"
    nodes.write_text("1\n2\n2\n")
    with pytest.raises(GraphLoadError) as twice:
        read_node_list(nodes)
    assert twice.value.line == 3


def test_serve_refuses_a_node_list_that_misses_an_edge_in_one_line(tmp_path: Path) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("1 2\n2 7\n")
    nodes = tmp_path / "n.txt"
    nodes.write_text("1\n2\n")
    done = run_cli(
        ["serve", "--graph", str(edges), "--nodes", str(nodes),
         "--database-url", f"sqlite:///{tmp_path / 'l.db'}", "--auto-migrate"],
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error [graph_load_error]: {edges}:2: edge names node '7', which is not in the node list"
    ]


def test_without_a_node_list_readiness_says_the_node_set_is_derived(tmp_path: Path) -> None:
    path = tmp_path / "graph.txt"
    path.write_text("0 1\n1 2\n")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    with running_app(Backend("sqlite", url, None, path), steps=5) as client:
        ready = _admin_readiness(client, url)
    assert ready["checks"]["graph"]["node_set"] == "derived_from_edges"


def _admin_readiness(client: TestClient, database_url: str) -> dict[str, Any]:
    with open_ledger(database_url) as ledger:
        admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
        admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
    body: dict[str, Any] = client.get("/readyz", headers=bearer(admin_key)).json()
    return body


# --------------------------------------------------------------------------- finding 3


def test_delta_does_not_depend_on_the_number_of_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PPR_DEFAULT_DELTA", raising=False)
    assert MechanismSettings().account_delta == 1e-6  # for 2,000,000 edges main said 5e-07
    bounded = MechanismSettings(edge_count_bound=4_000_000)
    assert bounded.account_delta == 2.5e-7  # from the configured public bound


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-1e-6"])
def test_a_delta_outside_its_range_is_one_line_and_exit_2(value: str, tmp_path: Path) -> None:
    done = run_cli(
        ["serve"], timeout=60,
        env={"PATH": "/usr/bin:/bin", "PPR_DEFAULT_DELTA": value, "HOME": str(tmp_path)},
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("error [invalid_parameter]: PPR_DEFAULT_DELTA")


def test_account_deltas_are_the_configured_one_on_any_graph(app_backend: Backend) -> None:
    with _client(app_backend) as client:
        with open_ledger(app_backend.database_url) as ledger:
            admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
            admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
        made = client.post(
            "/v1/admin/accounts", json={"type": "user", "node_id": "2"}, headers=bearer(admin_key)
        )
    assert made.status_code in (200, 201), made.text
    assert made.json()["budget"]["delta"] == 1e-6  # not min(1e-6, 1/5)... nor 1/|E| on big ones


# --------------------------------------------------------------------------- finding 6


MECHANISMS = ["popular", "common_neighbours", "friends_of_friends", "blended", "pushflowcap",
              "noisy_diffusion"]  # fmt: skip


@pytest.mark.parametrize("name", MECHANISMS)
def test_no_mechanism_draws_with_generator_laplace(name: str) -> None:
    from service.mechanisms.blended import blend
    from service.mechanisms.common_neighbours import (
        noisy_common_neighbours,
        two_scale_common_neighbours,
    )
    from service.mechanisms.diffusion import noisy_diffusion
    from service.mechanisms.popular import noisy_degrees
    from service.mechanisms.pushflowcap import dp_pushflowcap
    from service.privacy.calibration import plan_diffusion
    from service.privacy.laplace import plan_laplace, plan_two_scale

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Generator.laplace is not an exact sampler")

    class RefusingGenerator(np.random.Generator):  # numpy's type is immutable: subclass it
        laplace = refuse  # type: ignore[assignment]

    graph = demo_graph()
    rng = RefusingGenerator(np.random.PCG64DXSM())
    if name == "popular":
        noisy_degrees(graph, plan_laplace(0.1, 2.0), rng)
    elif name == "common_neighbours":
        noisy_common_neighbours(graph, 5, plan_laplace(0.1, 2.0), rng)
    elif name == "friends_of_friends":
        two_scale_common_neighbours(graph, 5, plan_two_scale(0.1), rng)
    elif name == "blended":
        plan = plan_two_scale(0.1)
        counts = two_scale_common_neighbours(graph, 5, plan, rng)
        degrees = noisy_degrees(graph, plan_laplace(0.1, 2.0), rng)
        blend(graph, 5, counts, degrees, plan.candidate_scale, 20.0)
    elif name == "pushflowcap":
        dp_pushflowcap(graph, 5, beta=0.8, rounds=5, sigma=1e-6, epsilon=1.0, rng=rng)
    else:
        config = plan_diffusion(0.1, 1e-6, 10, 0.8, 1e-7, Mode.EDGE).config
        noisy_diffusion(graph, 5, config, rng=rng)


def test_the_sampler_keeps_the_exponential_tail_beyond_the_inverse_cdf_cut() -> None:
    """Generator.laplace's inverse CDF cannot pass ln(2^53) = 36.7 scales; the ziggurat's tail
    is r - log1p(-U): conditioned on the tail, |X| - r is Exp(1) up to 53 ln 2."""
    draws = np.abs(laplace_noise(np.random.default_rng(), 1.0, 4_000_000))
    tail = draws[draws > 7.69711747013105] - 7.69711747013105
    assert 1_600 < tail.size < 2_050  # 4e6 * e^-r = 1,817
    assert abs(tail.mean() - 1.0) < 0.1 and tail.max() < 53 * np.log(2) + 1e-9


def test_count_noise_is_on_the_grid_and_added_exactly() -> None:
    """Count releases add g N (exact sampler) to integer counts, g a power of two <= 1: the
    sum is exact, so the law of what is released does not see the count's low bits."""
    from service.mechanisms.exact_laplace import grid_laplace
    from service.mechanisms.postprocess import count_grid

    assert count_grid(20.0) == 2.0**-4 and count_grid(1e6) == 1.0  # never coarser than 1
    grid = 2.0**-6
    noise = grid_laplace(np.random.default_rng(3), 20.0, grid, count=10_000)
    assert np.array_equal(np.round(noise / grid) * grid, noise)
    for count in (0.0, 3.0, 1_234_567.0):
        released = count + noise
        assert np.array_equal(released - count, noise)  # the law does not see the count


COUNT_MECHANISMS = ["popular", "common_neighbours", "friends_of_friends", "blended"]
#: The lazy top-k the service stores for common_neighbours and friends_of_friends.
LAZY_TOP_K = ["common_neighbours_top", "friends_of_friends_top"]


def _draw_count_release(name: str, rng: np.random.Generator) -> None:
    from service.mechanisms.blended import blended_ranking
    from service.mechanisms.common_neighbours import common_neighbours_top, noisy_common_neighbours
    from service.mechanisms.friends_of_friends import friends_of_friends, friends_of_friends_top
    from service.mechanisms.popular import noisy_degrees
    from service.privacy.laplace import plan_laplace, plan_two_scale

    graph = demo_graph()
    if name == "popular":
        noisy_degrees(graph, plan_laplace(0.1, 2.0), rng)
    elif name == "common_neighbours":
        noisy_common_neighbours(graph, 5, plan_laplace(0.1, 2.0), rng)
    elif name == "friends_of_friends":
        friends_of_friends(graph, 5, plan_two_scale(0.1), rng)
    elif name == "common_neighbours_top":
        common_neighbours_top(graph, 5, plan_laplace(0.1, 2.0), 30, rng)
    elif name == "friends_of_friends_top":
        friends_of_friends_top(graph, 5, plan_two_scale(0.1), 30, rng)
    elif name == "blended":
        degrees = np.asarray(graph.degrees, dtype=np.float64)  # stands in for the release
        blended_ranking(graph, 5, plan_two_scale(0.1), degrees, 20.0, rng)
    else:  # dp_instant_embedding
        from service.embeddings.dp import dp_instant_embedding
        from service.embeddings.hashing import embedding_hashes

        hashes = embedding_hashes([str(v) for v in graph.external_ids(np.arange(graph.n))],
                                  bytes(16), 16)  # fmt: skip
        dp_instant_embedding(graph, 5, hashes, 1.0, 1e-3, Mode.EDGE, rng=rng)


@pytest.mark.parametrize("name", [*COUNT_MECHANISMS, *LAZY_TOP_K, "dp_instant_embedding"])
def test_count_releases_and_dp_ie_never_draw_floats(name: str) -> None:
    """Neither the float64 ziggurat (``standard_exponential``, behind ``laplace_noise``) nor any
    other float sampler: only raw 64-bit words (the exact sampler). Fails on the float
    sampler the count releases and DP-IE used before."""

    class WordsOnly(np.random.Generator):  # numpy's type is immutable: subclass it
        def __getattribute__(self, attribute: str) -> Any:
            if attribute != "bit_generator":
                raise AssertionError(f"a float sampler was used: Generator.{attribute}")
            return super().__getattribute__(attribute)

    _draw_count_release(name, WordsOnly(np.random.PCG64DXSM()))


def test_count_answers_state_delta_zero_and_charge_no_sampler_share(
    app_backend: Backend,
) -> None:
    """Every count answer states delta 0, and every curve it charged (the account's charges,
    the version's degree release) carries sampler_tv 0. Fails on the float sampler's
    accounting, which stated (1 + e^eps) 2e-11 and charged 2e-11 per release."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.ledger.tables import Charge, GraphRelease

    account, key = user_with_key(app_backend.database_url, "1")
    with _client(app_backend) as client:
        for mechanism in COUNT_MECHANISMS:
            response = client.get(
                "/v1/ppr/1", params={"k": 2, "mechanism": mechanism, "epsilon": 0.2},
                headers=bearer(key),
            )  # fmt: skip
            assert response.status_code == 200, response.text
            block = response.json()["mechanism"]
            assert block["delta"] == count_release_delta(block["epsilon"]) == 0.0
            if "degree_delta" in block:
                assert block["degree_delta"] == 0.0
    with open_ledger(app_backend.database_url) as ledger, Session(ledger.engine) as session:
        charges = list(session.scalars(select(Charge).where(Charge.charged_account_id == account)))
        releases = list(session.scalars(select(GraphRelease)))
        assert len(charges) >= 3 and releases
        for row in [*charges, *releases]:
            assert RdpCurve.from_json(row.rdp).sampler_tv == 0.0
        assert ledger.budgets.budget(account).spent_epsilon > 0


# --------------------------------------------------------------------------- finding 7


def test_kappa_comes_from_the_public_bound_not_the_graph(ledger: Ledger) -> None:
    star = [(0, i) for i in range(1, 40)]
    before = build_graph([u for u, _ in star], [v for _, v in star], num_nodes=41)
    after = build_graph([u for u, _ in star] + [0], [v for _, v in star] + [40])
    assert before.stats.degree_max + 1 == after.stats.degree_max  # an edge at the hub
    scales = []
    for graph in (before, after):
        served = as_served(graph, ledger.graph_versions, max_degree_bound=500)
        assert margin_degree(served) == 500
        config = DiffusionConfig(
            mode=Mode.EDGE, beta=0.8, steps=3, eta=1e-7, noise_scale=1e-5, noisy_steps=1
        )
        job = DiffusionJob(0, config, rng=np.random.default_rng(1))
        run_jobs(served, [job])
        scales.append(job.noise_scale)
    plan = step_noise_plan(1e-5, n=41, max_degree=500, eta=1e-7, beta=0.8)
    assert scales[0] == scales[1] == plan.scale


def test_a_graph_over_the_degree_bound_is_refused(ledger: Ledger) -> None:
    graph = build_graph([0, 0, 0], [1, 2, 3])
    with pytest.raises(GraphLoadError, match="PPR_MAX_DEGREE_BOUND = 2"):
        as_served(graph, ledger.graph_versions, max_degree_bound=2)


def test_admin_reload_over_the_bound_is_422_and_keeps_the_graph(
    app_backend: Backend, tmp_path: Path
) -> None:
    graph_dir = tmp_path / "graphs"
    graph_dir.mkdir()
    (graph_dir / "star.txt").write_text("0 1\n0 2\n0 3\n0 lonely\n")  # degree 4 > 3
    (graph_dir / "open.txt").write_text("0 1\n1 9\n")  # 9 is not listed
    with _client(app_backend, max_degree_bound=3, graph_dir=graph_dir) as client:
        with open_ledger(app_backend.database_url) as ledger:
            admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
            admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
        before = client.get("/v1/admin/graph", headers=bearer(admin_key)).json()
        star = client.post(
            "/v1/admin/graph/reload", json={"path": "star.txt"}, headers=bearer(admin_key)
        )
        nine = client.post(
            "/v1/admin/graph/reload", json={"path": "open.txt"}, headers=bearer(admin_key)
        )
        after = client.get("/v1/admin/graph", headers=bearer(admin_key)).json()
    assert star.status_code == 422 and star.json()["error"]["code"] == "graph_load_error"
    assert "PPR_MAX_DEGREE_BOUND = 3" in star.json()["error"]["message"]
    assert nine.status_code == 422 and nine.json()["error"]["code"] == "graph_load_error"
    assert "not in the node list" in nine.json()["error"]["message"]
    assert after["version"] == before["version"]
    assert after["fingerprint"] == before["fingerprint"]


def test_serve_refuses_a_graph_over_the_degree_bound(tmp_path: Path) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("".join(f"0 {i}\n" for i in range(1, 6)))
    done = run_cli(
        ["serve", "--graph", str(edges),
         "--database-url", f"sqlite:///{tmp_path / 'l.db'}", "--auto-migrate"],
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PPR_MAX_DEGREE_BOUND": "4", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error [graph_load_error]: {edges}: a node has more than PPR_MAX_DEGREE_BOUND = 4 "
        "edges; raise the bound (a public setting) or load another graph"
    ]


def test_settings_defaults() -> None:
    settings = Settings()
    assert settings.max_degree_bound == 10_000 and settings.nodes_path is None
