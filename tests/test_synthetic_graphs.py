"""The edge-level generator's accounting and sampling, the evaluation, and a synthesis run as
one graph-wide release in the ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from service.cli import main
from service.errors import InvalidParameter
from service.evaluation.synthetic import SyntheticSettings, evaluate_synthetic, structure
from service.graph.loader import load_edge_list
from service.ledger import GraphBudgetExhausted, GraphCap, Ledger
from service.privacy.curves import laplace_curve
from service.privacy.synthetic import (
    EDGE_COUNT_SENSITIVITY,
    GROUP_COUNT_SENSITIVITY,
    community_plan,
)
from service.release_payload import decode_payload
from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.privdpr import PrivdprParams
from service.synthetic.release import Request, synthesize_release
from service.synthetic.sampling import block_configuration, denoise_degrees, erdos_renyi


def _edges(n: int, mask: int) -> sp.csr_matrix:
    pairs = list(itertools.combinations(range(n), 2))
    rows = [a for bit, (a, b) in enumerate(pairs) if mask >> bit & 1]
    cols = [b for bit, (a, b) in enumerate(pairs) if mask >> bit & 1]
    a = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    return (a + a.T).tocsr()


# --- sensitivities of the released statistics, brute force ---------------------------------


def test_group_counts_degrees_and_edge_count_move_by_the_stated_sensitivity() -> None:
    n = 4
    pairs = list(itertools.combinations(range(n), 2))
    rng = np.random.default_rng(0)
    worst = {"groups": 0.0, "degrees": 0.0, "edges": 0.0}
    for mask in range(1 << len(pairs)):
        a = _edges(n, mask)
        for bit in range(len(pairs)):
            b = _edges(n, mask ^ (1 << bit))  # one edge added or removed
            for _ in range(3):
                groups = rng.integers(0, 3, n)
                h = sp.csr_matrix((np.ones(n), (np.arange(n), groups)), shape=(n, 3))
                diff = ((a - b) @ h).toarray()
                worst["groups"] = max(worst["groups"], float(np.abs(diff).sum()))
            worst["degrees"] = max(worst["degrees"], float(abs(a - b).sum()))
            worst["edges"] = max(worst["edges"], abs(a.nnz - b.nnz) / 2)
    assert worst["groups"] == GROUP_COUNT_SENSITIVITY
    assert worst["degrees"] == 2.0
    assert worst["edges"] == EDGE_COUNT_SENSITIVITY


def test_plan_splits_the_budget_and_its_curve_is_the_sum() -> None:
    plan = community_plan(1.0, probe_share=0.05, degree_share=0.35, rounds=5)
    assert plan.epsilon == pytest.approx(1.0)
    assert plan.curve.pure == pytest.approx(1.0)
    expected = laplace_curve(0.05) + laplace_curve(0.35) + laplace_curve(0.12) * 5
    assert np.allclose(plan.curve.rdp, expected.rdp)
    sparse = plan.without_rounds()
    assert sparse.epsilon == pytest.approx(1.0) and sparse.rounds == 0
    with pytest.raises(InvalidParameter):
        community_plan(1.0, probe_share=0.5, degree_share=0.6, rounds=2)


# --- sampling ------------------------------------------------------------------------------


def test_denoised_degrees_are_integers_in_the_order_of_the_noisy_ones() -> None:
    rng = np.random.default_rng(1)
    noisy = np.array([5.2, -3.0, 1.0, 40.0, 0.5, 7.7])
    out = denoise_degrees(noisy, 60.0, rng)
    assert out.dtype.kind == "i" and np.all(out >= 0)
    assert abs(int(out.sum()) - 60) <= noisy.size
    order = np.argsort(noisy)
    assert np.all(np.diff(out[order]) >= -1)  # monotone up to the random rounding


def test_block_configuration_keeps_degrees_and_is_simple() -> None:
    rng = np.random.default_rng(2)
    n = 400
    degrees = rng.integers(1, 12, n)
    groups = rng.integers(0, 4, n)
    mixing = np.full((4, 4), 0.05) + np.eye(4) * 0.8
    mixing /= mixing.sum(axis=1, keepdims=True)
    u, v = block_configuration(degrees, groups, mixing, rng)
    assert np.all(u < v)
    assert len(set(zip(u.tolist(), v.tolist(), strict=True))) == u.size
    realised = np.bincount(np.concatenate([u, v]), minlength=n)
    assert realised.sum() >= 0.9 * degrees.sum()
    assert np.mean(groups[u] == groups[v]) > 0.6  # the mixing matrix is followed


def test_erdos_renyi_has_the_asked_edge_count() -> None:
    u, v = erdos_renyi(50, 100, np.random.default_rng(3))
    assert u.size == 100 and np.all(u < v)


def test_communities_finds_planted_blocks_and_sparse_graphs_skip_rounds() -> None:
    rng = np.random.default_rng(4)
    n, k = 600, 3
    truth = np.repeat(np.arange(k), n // k)
    prob = np.where(truth[:, None] == truth[None, :], 0.12, 0.005)
    upper = np.triu(rng.random((n, n)) < prob, 1)
    a = sp.csr_matrix(upper | upper.T, dtype=np.float64)
    u, v, plan, summary = community_synthesize(
        a.indptr, a.indices, 8.0, CommunityParams(groups=3, rounds=5), rng
    )
    assert plan.rounds == 5 and summary["groups"] == 3
    assert np.mean(truth[u] == truth[v]) > 0.6  # real edges: about 0.9; a random graph: 1/3
    ring = sp.csr_matrix(
        (
            np.ones(2 * n),
            (np.arange(2 * n) % n, (np.arange(2 * n) % n + np.repeat([1, -1], n)) % n),
        ),
        shape=(n, n),
    )
    _, _, sparse_plan, sparse_summary = community_synthesize(
        ring.indptr, ring.indices, 1.0, CommunityParams(), rng
    )
    assert sparse_plan.rounds == 0 and sparse_summary["groups"] == 1
    assert sparse_plan.epsilon == pytest.approx(1.0)


# --- evaluation ----------------------------------------------------------------------------


def test_structure_of_a_known_graph() -> None:
    # a triangle with a pendant: 1 triangle, wedges 1+1+3+0 = 5, claws 1
    a = sp.csr_matrix(np.array([[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 1], [0, 0, 1, 0]], float))
    s = structure(a, np.random.default_rng(0), bfs_sources=4)
    assert (s.triangles, s.wedges, s.claws, s.lcc, s.diameter) == (1, 5, 1, 4, 2)
    assert s.cpl == pytest.approx((1 + 1 + 2 + 1 + 2 + 1) / 6)


def test_path_lengths_are_exact_up_to_the_limit_and_sampled_beyond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.evaluation.synthetic as evaluation

    n = 1200  # a path: CPL (n + 1) / 3, diameter n - 1, more nodes than BFS chunks
    a = sp.csr_matrix(
        (np.ones(2 * (n - 1)), (np.r_[0 : n - 1, 1:n], np.r_[1:n, 0 : n - 1])), shape=(n, n)
    )
    exact = structure(a, np.random.default_rng(1), bfs_sources=2)
    assert exact.cpl == pytest.approx((n + 1) / 3) and exact.diameter == n - 1
    monkeypatch.setattr(evaluation, "EXACT_PATH_NODES", n - 1)
    sampled = structure(a, np.random.default_rng(1), bfs_sources=2)
    assert sampled.cpl != pytest.approx((n + 1) / 3)  # two sources only: an estimate
    assert sampled.diameter == n - 1  # the double sweep still finds the ends


def test_evaluation_on_a_tiny_graph() -> None:
    rng = np.random.default_rng(5)
    n = 120
    u, v = erdos_renyi(n, 600, rng)
    labels = rng.integers(0, 3, n)
    settings = SyntheticSettings(
        privdpr=PrivdprParams(
            embedding_dim=8,
            hidden_dim=4,
            start_nodes=8,
            walks=1,
            walk_length=4,
            epochs=1,
            score_rounds=2,
        ),
        bfs_sources=20,
    )
    cells = evaluate_synthetic(
        (u, v), n, [1.0], runs=2, methods=["privdpr", "communities", "chung_lu", "erdos_renyi"],
        settings=settings, rng=rng, labels=labels,
    )  # fmt: skip
    rows = {c.method: c.to_dict() for c in cells}
    assert set(rows) == {"real", "privdpr", "communities", "chung_lu", "erdos_renyi"}
    assert rows["real"]["triangles_mre"] == 0.0 and rows["real"]["runs"] == 2
    for row in rows.values():
        assert 0.0 <= row["auc"] <= 1.0 and 0.0 <= row["ks"] <= 1.0
        assert 0.0 <= row["micro_f1"] <= 1.0


# --- a run as a graph-wide release ---------------------------------------------------------


@pytest.fixture
def karate_like(tmp_path: Path) -> Path:
    rng = np.random.default_rng(6)
    u, v = erdos_renyi(60, 240, rng)
    path = tmp_path / "graph.txt"
    path.write_text("".join(f"n{a} n{b}\n" for a, b in zip(u, v, strict=True)))
    return path


def _request(method: str, epsilon: float = 1.0) -> Request:
    return Request(
        method=method,
        epsilon=epsilon,
        privdpr=PrivdprParams(
            embedding_dim=8,
            hidden_dim=4,
            start_nodes=8,
            walks=1,
            walk_length=4,
            epochs=1,
            score_rounds=2,
        ),
    )


@pytest.mark.parametrize("method", ["communities", "privdpr"])
def test_run_is_one_charged_graph_release_and_the_file_loads(
    ledger: Ledger, karate_like: Path, tmp_path: Path, method: str
) -> None:
    graph = load_edge_list(karate_like)
    out = tmp_path / "synthetic.txt"
    release = synthesize_release(
        ledger, graph, _request(method), out, cap=None, rng_factory=np.random.default_rng
    )
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    synthetic = load_edge_list(out)
    assert synthetic.m == release.edges
    assert release.privacy_unit == ("node" if method == "privdpr" else "edge")
    report = ledger.reports.exposure(delta=1e-5)
    assert report.graph_releases == 1
    assert 0.5 < report.epsilon <= 1.0 + 1e-9  # the run's curve, calibrated to eps 1
    assert ledger.reports.verify().ok
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".synthetic-")]


def test_chung_lu_is_free_post_processing(
    ledger: Ledger, karate_like: Path, tmp_path: Path
) -> None:
    graph = load_edge_list(karate_like)
    released = graph.degrees.astype(float) + 0.5
    release = synthesize_release(
        ledger, graph, _request("chung_lu"), tmp_path / "cl.txt", cap=None,
        degrees=lambda: (released, "popular_degrees:b=20.0"), rng_factory=np.random.default_rng,
    )  # fmt: skip
    assert release.epsilon == 0.0 and "post-processing" in release.note
    assert ledger.reports.exposure(delta=1e-5).epsilon == 0.0


def test_refused_runs_charge_nothing_and_leave_no_file(
    ledger: Ledger, karate_like: Path, tmp_path: Path
) -> None:
    graph = load_edge_list(karate_like)
    rng = np.random.default_rng
    with pytest.raises(InvalidParameter):
        synthesize_release(ledger, graph, _request("communities"), tmp_path / "no" / "x.txt",
                           cap=None, rng_factory=rng)  # fmt: skip
    with pytest.raises(InvalidParameter):
        bad = Request("communities", 1.0, communities=CommunityParams(groups=1))
        synthesize_release(ledger, graph, bad, tmp_path / "x.txt", cap=None, rng_factory=rng)
    cap = GraphCap(0.5, 1e-5, max_charge=None)
    with pytest.raises(GraphBudgetExhausted):
        synthesize_release(ledger, graph, _request("communities"), tmp_path / "x.txt", cap=cap,
                           rng_factory=rng)  # fmt: skip

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        synthesize_release(ledger, graph, _request("privdpr"), tmp_path / "x.txt", cap=None,
                           progress=interrupt, rng_factory=rng)  # fmt: skip
    assert list(tmp_path.glob("x.txt")) == [] and not list(tmp_path.glob(".synthetic-*"))
    report = ledger.reports.exposure(delta=1e-5)
    assert report.epsilon == 0.0 and report.graph_releases == 0
    assert ledger.reports.verify().ok


def test_payload_holds_the_file_and_its_record(
    ledger: Ledger, karate_like: Path, tmp_path: Path
) -> None:
    graph = load_edge_list(karate_like)
    out = tmp_path / "s.txt"
    release = synthesize_release(ledger, graph, _request("communities"), out, cap=None,
                                 rng_factory=np.random.default_rng)  # fmt: skip
    payload = ledger.graph_releases.graph_release(
        graph.version, release.release_name, epsilon=0.0, curve=laplace_curve(1.0),
        draw=lambda: b"never", cap=None,
    )  # fmt: skip
    header, text = decode_payload(payload)
    assert text == out.read_bytes()
    assert header["privacy_unit"] == "edge" and header["parameters"]["groups"] >= 1


def test_cli_bad_input_is_one_line_exit_2(
    karate_like: Path, tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.ledger import upgrade

    upgrade(sqlite_url)
    base = ["synthesize", "--graph", str(karate_like), "--database-url", sqlite_url]
    for extra in (
        ["--method", "communities", "--epsilon", "1", "--out", str(tmp_path / "no" / "x")],
        ["--method", "communities", "--out", str(tmp_path / "x")],
        [
            "--method",
            "communities",
            "--epsilon",
            "1",
            "--groups",
            "1000",
            "--out",
            str(tmp_path / "x"),
        ],
        ["--method", "chung_lu", "--epsilon", "1", "--out", str(tmp_path / "x")],
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error [invalid_parameter]")
    assert not list(tmp_path.glob("x*"))
    ledger = Ledger.from_url(sqlite_url)
    try:
        assert ledger.reports.exposure(delta=1e-5).graph_releases == 0
    finally:
        ledger.dispose()
    ok = [*base, "--method", "communities", "--epsilon", "2", "--out", str(tmp_path / "x")]
    assert main(ok) == 0
    assert "edge-level DP, epsilon 2" in capsys.readouterr().out


def test_evaluate_task_synthetic_cli(karate_like: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv = ["evaluate", "--task", "synthetic", "--graph", str(karate_like), "--epsilon", "1",
            "--runs", "2", "--methods", "chung_lu", "erdos_renyi", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["real", "chung_lu", "erdos_renyi"]
    assert all(r["runs"] == 2 and 0.0 <= r["auc"] <= 1.0 for r in rows)
    assert main(["evaluate", "--task", "synthetic", "--demo", "--epsilon", "1"]) == 2
