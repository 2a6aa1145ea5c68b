"""The all-node edge-mode embedding release and the similar-nodes index over it (the single
DP-IE release of `GET /v1/embeddings/{node}` is tests/unit/embeddings/test_release.py).

- the compiled all-node computation is Algorithm 2 + InstantEmbedding, seed by seed;
- the index's recall@10 against exact cosine search;
- a release is ONE graph-wide release: charged once with the N-fold composition, stored in the
  ledger (payload = the vectors file), listed in the exposure, verify clean; refused runs
  charge nothing and leave no file; the CLI's bad input is one line and exit 2; a long release
  beats its heartbeat, so a server's reconciler spares it (a control without the heartbeat is
  refunded) (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from service.cli import main
from service.embeddings.all_node_release import (
    RELEASE_PREFIX,
    EmbeddingRequest,
    read_vectors,
    release_embeddings,
)
from service.embeddings.all_nodes import edge_embeddings, edge_instant_embeddings
from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    dp_instant_embedding_curve,
    plan_dp_instant_embedding,
)
from service.embeddings.hashing import embedding_hashes
from service.embeddings.instant import instant_embedding
from service.embeddings.similar import POINTER, SimilarIndex, build_index, measure_recall
from service.errors import InvalidParameter
from service.graph.generate import generate_graph, write_generated_edge_list
from service.graph.model import Graph
from service.ledger import GraphCap, Ledger
from service.ledger.records import ChargeSettled, GraphBudgetExhausted
from service.ledger.tables import GraphRelease
from service.mechanisms.floored_pushflowcap import floored_pushflowcap
from service.mechanisms.pushflowcap import pushflowcap, pushflowcap_dense
from service.privacy.modes import Mode
from service.release_payload import decode_payload
from service.serving.reconciler import Reconciler

SALT = b"0123456789abcdef"


@pytest.mark.parametrize("sigma", [1e-3, 1e-2, 0.1, 1.0])
@pytest.mark.parametrize("rounds", [1, 3, 100])
def test_all_node_computation_is_pushflowcap_then_instant_embedding(
    sigma: float, rounds: int
) -> None:
    graph = generate_graph(300, 1200, seed=3)
    hashes = embedding_hashes(graph.node_ids, SALT, 16)
    want = np.array(
        [
            instant_embedding(
                pushflowcap_dense(graph, s, EMBEDDING_BETA, rounds, sigma, Mode.EDGE), hashes
            )
            for s in range(graph.n)
        ]
    )  # at floor 0 the dense reference, bit for bit, whatever the block size and the threads
    floored = np.array(
        [
            instant_embedding(
                floored_pushflowcap(
                    graph, s, EMBEDDING_BETA, rounds, sigma, Mode.EDGE, EMBEDDING_FLOOR
                ),
                hashes,
            )
            for s in range(graph.n)
        ]
    )  # with the floor (the default) the single query's vector, bit for bit
    for block, threads in ((16, 1), (7, 2), (1, 3)):
        got = edge_instant_embeddings(
            graph, hashes, np.arange(graph.n), sigma, rounds=rounds, floor=0.0, block=block,
            threads=threads,
        )  # fmt: skip
        assert np.array_equal(got, want), (block, threads)
        by_default = edge_instant_embeddings(
            graph, hashes, np.arange(graph.n), sigma, rounds=rounds, block=block, threads=threads
        )
        assert np.array_equal(by_default, floored), (block, threads)
    if sigma >= 0.01:
        assert np.count_nonzero(want) > 0  # the caps let mass through: not a vacuous check


def test_isolated_seed_embeds_nothing(tmp_path: Path) -> None:
    from service.graph.loader import load_edge_list

    path = tmp_path / "g.txt"
    path.write_text("a b\nb c\n")
    graph = load_edge_list(path, nodes=["a", "b", "c", "lonely"])
    hashes = embedding_hashes(graph.node_ids, SALT, 4)
    got = edge_instant_embeddings(graph, hashes, np.arange(graph.n), 1.0)
    lonely = graph.index_of("lonely")
    assert not got[lonely].any()
    assert not pushflowcap(graph, lonely, EMBEDDING_BETA, 100, 1.0, Mode.EDGE).any()


def test_recall_at_10_against_exact_cosine_search(tmp_path: Path) -> None:
    from service.config import Settings

    graph = generate_graph(3000, 15000, seed=5)
    hashes = embedding_hashes(graph.node_ids, SALT, 64)
    released, _, _ = edge_embeddings(
        graph, hashes, np.arange(graph.n), 1.0, 1e-3, np.random.default_rng(1), rounds=3
    )
    vectors = released.astype(np.float32)
    build_index(vectors, tmp_path / "x.usearch")
    from usearch.index import Index

    index = Index.restore(str(tmp_path / "x.usearch"), view=True)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = np.random.default_rng(2).choice(graph.n, 200, replace=False)
    ef = Settings.model_fields["similar_ef"].default
    approximate = {"release_name": "t", "files": {"index": {"recall_at_10": 1.0, "ef": ef}}}
    loaded = SimilarIndex(approximate, [str(i) for i in range(graph.n)],
                          {str(i): i for i in range(graph.n)}, index)  # fmt: skip
    assert not loaded.exact(ef)  # the HNSW search is what is measured here
    hits = 0
    for q in queries:
        scores = unit @ unit[q]
        scores[q] = -np.inf
        exact = set(np.argsort(-scores)[:10].tolist())
        found = {int(node) for node, _ in loaded.neighbours(str(q), 10, ef)}
        hits += len(found & exact)
    recall = hits / (10 * queries.size)
    assert recall >= 0.95, recall
    assert measure_recall(tmp_path / "x.usearch", ef) >= 0.9  # the release's own estimate


def _edge_file(tmp_path: Path) -> Path:
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, 200, 800, seed=9)
    return path


def _served(ledger: Ledger, path: Path) -> Graph:
    from service.graph.loader import load_edge_list
    from service.serving.graph_identity import as_served

    return as_served(load_edge_list(path), ledger.graph_versions, max_degree_bound=10_000)


def test_release_is_one_graph_wide_charge_stored_and_listed(ledger: Ledger, tmp_path: Path) -> None:
    graph = _served(ledger, _edge_file(tmp_path))
    out = tmp_path / "emb"
    out.mkdir()
    request = EmbeddingRequest(epsilon=0.5, k=16, sigma=1e-2, rounds=100)
    release = release_embeddings(
        ledger, graph, request, out, cap=None, rng_factory=np.random.default_rng
    )
    assert release.nodes == graph.n and release.privacy_unit == "edge"
    assert release.release_name.startswith(RELEASE_PREFIX)
    # on sigma n, the snapping slack and the float64 margins at the public degree bound
    plan = plan_dp_instant_embedding(0.5, 1e-2, graph.n, rounds=100, degree_bound=10_000)
    composed = dp_instant_embedding_curve(plan.epsilon) * graph.n
    assert release.epsilon == pytest.approx(graph.n * plan.epsilon)
    report = ledger.reports.exposure(delta=1e-6)
    assert report.graph_releases == 1 and report.charges == 0
    assert report.epsilon == pytest.approx(composed.epsilon(1e-6), rel=1e-9)
    assert (
        ledger.graph_releases.graph_release_state(graph.version, release.release_name) == "released"
    )
    assert ledger.reports.verify().ok
    pointer = json.loads((out / POINTER).read_text())
    vectors_file = out / pointer["files"]["vectors"]["name"]
    header, body = decode_payload(
        ledger.graph_releases.graph_release(graph.version, release.release_name, epsilon=0.0,
                             curve=composed, draw=lambda: b"never", cap=None)
    )  # fmt: skip
    assert body == vectors_file.read_bytes()  # the ledger holds what the file holds
    assert header["parameters"]["k"] == 16 and header["method"] == "dp_instant_embedding"
    vectors, nodes = read_vectors(vectors_file)
    assert vectors.shape == (graph.n, 16) and nodes == list(graph.node_ids)
    grid = header["parameters"]["grid"]
    assert np.array_equal(np.round(vectors / grid) * grid, vectors)  # on the stated grid
    for name in (POINTER, vectors_file.name, pointer["files"]["index"]["name"]):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o600
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    index = SimilarIndex.load(out)
    assert len(index.neighbours(nodes[0], 5, 64)) == 5


def test_node_list_release_charges_its_nodes_only(ledger: Ledger, tmp_path: Path) -> None:
    graph = _served(ledger, _edge_file(tmp_path))
    some = [str(x) for x in graph.node_ids[:10]]
    release = release_embeddings(
        ledger, graph, EmbeddingRequest(1.0, 8, 1e-3, 3, nodes=some), tmp_path,
        cap=None, rng_factory=np.random.default_rng,
    )  # fmt: skip
    plan = plan_dp_instant_embedding(1.0, 1e-3, graph.n, rounds=3, degree_bound=10_000)
    assert release.nodes == 10 and release.epsilon == pytest.approx(10 * plan.epsilon)
    assert read_vectors(tmp_path / f"{release.release_name[len(RELEASE_PREFIX) :]}.npz")[1] == some


def test_refused_releases_charge_nothing_and_leave_no_file(ledger: Ledger, tmp_path: Path) -> None:
    graph = _served(ledger, _edge_file(tmp_path))
    out = tmp_path / "emb"
    out.mkdir()
    rng = np.random.default_rng
    good = EmbeddingRequest(1.0, 8, 1e-3, 3)
    for bad in (
        EmbeddingRequest(0.0, 8, 1e-3, 3),
        EmbeddingRequest(1.0, 0, 1e-3, 3),
        EmbeddingRequest(1.0, 8, 5.0, 3),
        EmbeddingRequest(1.0, 8, 1e-3, 0),
        EmbeddingRequest(1.0, 8, 1e-3, 3, nodes=["no-such-node"]),
        EmbeddingRequest(1.0, 8, 1e-3, 3, nodes=[]),
    ):
        with pytest.raises(InvalidParameter):
            release_embeddings(ledger, graph, bad, out, cap=None, rng_factory=rng)
    with pytest.raises(InvalidParameter):
        release_embeddings(ledger, graph, good, tmp_path / "missing", cap=None, rng_factory=rng)
    with pytest.raises(GraphBudgetExhausted):  # 200 releases at eps 1 are far past 10
        release_embeddings(ledger, graph, good, out, cap=GraphCap(10.0, 1e-6, max_charge=None),
                           rng_factory=rng)  # fmt: skip

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        release_embeddings(ledger, graph, good, out, cap=None, rng_factory=rng, progress=interrupt)
    assert list(out.iterdir()) == []
    report = ledger.reports.exposure(delta=1e-6)
    assert report.epsilon == 0.0 and report.graph_releases == 0
    assert ledger.reports.verify().ok


def test_cli_release_and_its_bad_input(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.ledger import upgrade

    upgrade(sqlite_url)
    graph = _edge_file(tmp_path)
    out = tmp_path / "emb"
    out.mkdir()
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("0\nno-such-node\n")
    base = ["embeddings", "release", "--graph", str(graph), "--database-url", sqlite_url,
            "--no-progress"]  # fmt: skip
    for extra in (
        ["--epsilon", "1", "--out", str(tmp_path / "missing")],
        ["--epsilon", "1", "--sigma", "2", "--out", str(out)],
        ["--epsilon", "1", "--k", "5000", "--out", str(out)],
        ["--epsilon", "1", "--nodes", str(nodes), "--out", str(out)],
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error [invalid_parameter]"), err
    assert list(out.iterdir()) == []
    ok = [*base, "--epsilon", "0.5", "--k", "8", "--rounds", "3", "--out", str(out)]
    assert main(ok) == 0
    printed = capsys.readouterr().out
    assert "charged once to the graph-wide exposure" in printed and "200-fold" in printed
    ledger = Ledger.from_url(sqlite_url)
    try:
        assert ledger.reports.exposure(delta=1e-6).graph_releases == 1
        assert ledger.reports.verify().ok
    finally:
        ledger.dispose()
    assert (out / POINTER).exists()


def test_index_below_the_recall_target_is_answered_exactly(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.embeddings.similar as similar

    graph = _served(ledger, _edge_file(tmp_path))
    release_embeddings(ledger, graph, EmbeddingRequest(1.0, 16, 1e-2, 3), tmp_path, cap=None,
                       rng_factory=np.random.default_rng)  # fmt: skip
    measured = json.loads((tmp_path / POINTER).read_text())["files"]["index"]
    assert 0.0 <= measured["recall_at_10"] <= 1.0 and measured["ef"] == 128
    index = SimilarIndex.load(tmp_path)
    # the measured recall is random (a sample of rows, a multi-threaded build): taken as the
    # target here, so that only the depth decides; the index's quality has its own test
    monkeypatch.setattr(similar, "RECALL_TARGET", measured["recall_at_10"])
    assert not index.exact(128) and index.exact(64)  # a shallower search than measured
    monkeypatch.setattr(similar, "RECALL_TARGET", 1.01)  # as if the index had missed it
    assert index.exact(128)
    vectors, nodes = read_vectors(tmp_path / measured["name"].replace(".usearch", ".npz"))
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    for row in range(0, graph.n, 17):
        scores = unit @ unit[row]
        scores[row] = -np.inf
        want = [nodes[i] for i in np.argsort(-scores, kind="stable")[:5]]
        got = index.neighbours(nodes[row], 5, 128)
        assert [n for n, _ in got] == want
        assert np.allclose([s for _, s in got], scores[np.argsort(-scores, kind="stable")[:5]],
                           atol=1e-5)  # fmt: skip


def _release_row(ledger: Ledger) -> GraphRelease:
    from sqlalchemy.orm import Session

    with Session(ledger.engine) as session:
        rows = list(
            session.scalars(
                select(GraphRelease).where(GraphRelease.mechanism.startswith(RELEASE_PREFIX))
            )
        )
    assert len(rows) == 1, rows
    return rows[0]


def _utc(moment: datetime | None) -> datetime:
    assert moment is not None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(3000):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.mark.parametrize("beats", [True, False], ids=["heartbeat", "control-no-heartbeat"])
def test_reconciler_spares_a_beating_release_and_refunds_a_silent_one(
    ledger: Ledger, tmp_path: Path, beats: bool
) -> None:
    """A release still computing after the reconciler's limit keeps its charge while it beats
    and is released; the control (no heartbeat) is refunded by the same pass, and its vectors
    are then never released: the run fails with charge_settled and writes no file."""
    graph = _served(ledger, _edge_file(tmp_path))
    out = tmp_path / "emb"
    out.mkdir()
    gate, computing = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def progress(done: int, total: int) -> None:  # the run stays in its draw until the gate
        computing.set()
        assert gate.wait(60), "the test never opened the gate"

    def run() -> None:
        try:
            release_embeddings(
                ledger, graph, EmbeddingRequest(1.0, 8, 1e-2, 3), out, cap=None,
                rng_factory=np.random.default_rng, progress=progress,
                heartbeat_seconds=0.05 if beats else 0.0,
            )  # fmt: skip
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert computing.wait(60), "the release never started computing"
        started = _utc(_release_row(ledger).created_at)
        if beats:  # a beat well after the start: the run is older than the cutoff below
            _wait_for(
                lambda: (_utc(_release_row(ledger).heartbeat_at) - started).total_seconds() > 1.0,
                "a heartbeat",
            )
        else:
            threading.Event().wait(1.2)
        # cutoff = start + 0.5 s: older than the run's start, younger than its last beat
        age = (datetime.now(UTC) - started).total_seconds()
        Reconciler(ledger, older_than_seconds=age - 0.5, interval_seconds=0).run_once()
        assert _release_row(ledger).state == ("admitted" if beats else "refunded")
    finally:
        gate.set()
        thread.join()
    row = _release_row(ledger)
    if beats:
        assert not failures and row.state == "released"
        assert json.loads((out / POINTER).read_text())["release_name"] == row.mechanism
        assert ledger.reports.exposure(delta=1e-6).graph_releases == 1
    else:
        assert len(failures) == 1 and isinstance(failures[0], ChargeSettled), failures
        assert row.state == "refunded" and list(out.iterdir()) == []
        assert ledger.reports.exposure(delta=1e-6).epsilon == 0.0
    assert ledger.reports.verify().ok
