"""``evaluate --task classification``: labels parsing, the DeepWalk protocol, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from service.cli import main
from service.embeddings.dp import EMBEDDING_BETA
from service.embeddings.free import free_embedding, stored_top
from service.embeddings.hashing import embedding_hashes, new_salt
from service.embeddings.noise_free import noise_free_embeddings
from service.evaluation.classification import InvalidLabels, _top_labels, classify, parse_labels
from service.evaluation.embeddings import block_width, estimate_seconds, free_diffusion_embeddings
from service.mechanisms.diffusion import noisy_diffusion
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from tests.graph_helpers import random_graph


def test_parse_labels_multi_label_and_errors() -> None:
    graph = random_graph(6, 0.5, np.random.default_rng(0))
    labels = parse_labels(["0 a", "1 b", "1 a", "", "# comment", "2 b"], graph)
    assert labels.classes == ["a", "b"]
    assert labels.nodes.tolist() == [0, 1, 2]
    assert labels.matrix.tolist() == [[True, False], [True, True], [False, True]]
    assert labels.multi_label
    with pytest.raises(InvalidLabels, match="not in the graph"):
        parse_labels(["0 a", "77 b"], graph)
    with pytest.raises(InvalidLabels, match="at least 2"):
        parse_labels(["0 a", "1 a"], graph)
    with pytest.raises(InvalidLabels, match="expected 'node label'"):
        parse_labels(["0 a extra"], graph)


def test_top_labels_gives_each_node_its_true_count() -> None:
    scores = np.array([[0.1, 0.9, 0.5], [0.8, 0.2, 0.7]])
    predicted = _top_labels(scores, np.array([1, 2]))
    assert predicted.tolist() == [[False, True, False], [True, False, True]]


def test_classify_separates_informative_from_random_features() -> None:
    graph = random_graph(120, 0.05, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    classes = rng.integers(0, 3, 120)
    labels = parse_labels([f"{v} c{c}" for v, c in enumerate(classes)], graph)
    informative = np.eye(3)[classes] * 3 + rng.standard_normal((120, 3)) * 0.3
    good = classify(informative, labels, [0.5], 3, rng)[0]
    bad = classify(rng.standard_normal((120, 3)), labels, [0.5], 3, rng)[0]
    assert good.micro > 0.9 and good.macro > 0.9
    assert bad.micro < 0.6
    assert good.micro_ci[0] <= good.micro <= good.micro_ci[1]


def test_parallel_fits_score_as_one_after_the_other() -> None:
    """Threads change nothing: the splits are drawn before any fit, liblinear's primal
    solver is deterministic."""
    graph = random_graph(150, 0.05, np.random.default_rng(4))
    rng = np.random.default_rng(5)
    classes = rng.integers(0, 4, 150)
    labels = parse_labels([f"{v} c{c}" for v, c in enumerate(classes)], graph)
    features = np.eye(4)[classes] + rng.standard_normal((150, 4))
    serial = classify(features, labels, [0.3, 0.7], 4, np.random.default_rng(6), n_jobs=1)
    threaded = classify(features, labels, [0.3, 0.7], 4, np.random.default_rng(6), n_jobs=3)
    assert serial == threaded


def _files(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    edges = [(u, v) for u in range(30) for v in range(u + 1, 30) if rng.random() < 0.2]
    graph = tmp_path / "g.txt"
    graph.write_text("".join(f"{u} {v}\n" for u, v in edges))
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{v} {v % 2}\n" for v in range(30)))
    return graph, labels


def test_cli_classification_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, labels = _files(tmp_path)
    status = main([
        "evaluate", "--task", "classification", "--graph", str(graph), "--labels", str(labels),
        "--epsilon", "1", "--dim", "8", "--fractions", "0.5", "--splits", "2",
        "--embedding-sigma", "0.1", "--json",
    ])  # fmt: skip
    assert status == 0
    printed = capsys.readouterr()
    assert "[evaluate] expected time: about" in printed.err  # before the first row
    assert printed.err.index("expected time") < printed.err.index("[evaluate] random")
    rows = json.loads(printed.out)
    names = {(r["row"], r["epsilon"]) for r in rows}
    assert names == {
        ("random", None), ("instant_embedding", None), ("dp_ie_edge", 1.0),
        ("dp_ie_personalized", 1.0), ("free_noisy_diffusion", 1.0), ("free_blended", 1.0),
    }  # fmt: skip
    by_name = {r["row"]: r for r in rows}
    # edge rows cost the graph-wide exposure for all 30 releases; joint rows are not covered
    # (each achieves at most eps 1, a hair below: its scale (sigma n + the snapping slack) / eps
    # is rounded up to six significant digits)
    assert 30.0 * (1 - 2.0**-10) <= by_name["dp_ie_edge"]["exposure_pure_epsilon"] <= 30.0
    assert by_name["dp_ie_personalized"]["exposure_pure_epsilon"] is None
    assert by_name["free_blended"]["exposure_pure_epsilon"] is None
    assert by_name["random"]["exposure_pure_epsilon"] == 0.0
    assert len(by_name["random"]["fractions"]) == 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [("0 a\n1 a\n", "at least 2"), ("0 a\n999 b\n", "not in the graph")],
)
def test_cli_bad_labels_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    graph, _ = _files(tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    status = main([
        "evaluate", "--task", "classification", "--graph", str(graph), "--labels", str(bad),
        "--epsilon", "1",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.count("\n") == 0 and err.startswith("error [invalid_labels]") and expected in err


def test_free_diffusion_blocks_release_what_each_seed_alone_releases() -> None:
    """The free_noisy_diffusion row's blocks (a last block not full, a seed twice): each row
    is bit for bit the free embedding of the release ``noisy_diffusion`` gives that seed alone
    for the same generator, full and as a replay's top entries; each seed's own generator."""
    graph = random_graph(120, 0.06, np.random.default_rng(7))
    hashes = embedding_hashes(graph.node_ids, new_salt(), 8)
    config = plan_diffusion(1.0, 1e-6, 30, 0.8, 1e-3, Mode.EDGE).config
    nodes = np.array([5, 0, 119, 5, 60, 33, 7], dtype=np.int64)
    drawn = iter(range(100, 200))
    ticks: list[tuple[int, int]] = []
    full, top = free_diffusion_embeddings(
        graph, nodes, config, hashes, 10, width=3, progress=lambda d, t: ticks.append((d, t)),
        generator=lambda: np.random.default_rng(next(drawn)),
    )  # fmt: skip
    assert ticks == [(3, 7), (6, 7), (7, 7)]
    for i, s in enumerate(nodes):
        alone = noisy_diffusion(graph, int(s), config, rng=np.random.default_rng(100 + i))
        assert np.array_equal(full[i], free_embedding(alone, hashes))
        assert np.array_equal(top[i], free_embedding(stored_top(alone, 10), hashes))
    assert not np.array_equal(full[0], full[3])  # the same seed twice: its own noise each time


def test_block_width_depends_on_the_node_count_only_and_not_the_vectors() -> None:
    assert block_width(10_312) == 64 and block_width(10_312, threads=2) == 64
    assert block_width(1_000_000) == 3 and block_width(10**12) == 1
    graph = random_graph(90, 0.08, np.random.default_rng(9))
    hashes = embedding_hashes(graph.node_ids, new_salt(), 8)
    seeds = np.arange(0, 90, 2)
    args = {"beta": EMBEDDING_BETA, "rounds": 20}
    narrow, wide = (
        noise_free_embeddings(graph, hashes, seeds, 1e-2, Mode.EDGE, **args, block=b, threads=1)
        for b in (16, 64)
    )
    assert np.array_equal(narrow, wide)


def test_the_estimate_is_a_range_from_fits_without_and_with_signal() -> None:
    graph = random_graph(60, 0.1, np.random.default_rng(11))
    labels = parse_labels([f"{v} c{v % 3}" for v in range(60)], graph)
    hashes = embedding_hashes(graph.node_ids, new_salt(), 8)
    low, high = estimate_seconds(
        graph, labels, hashes, ["random", "free_noisy_diffusion"], [1e-3], [1.0], [0.5], 2, 1,
        beta=0.8, steps=20, eta=1e-3, delta=1e-6,
    )  # fmt: skip
    assert 0 < low <= high
    assert estimate_seconds(
        graph, labels, hashes, [], [1e-3], [1.0], [0.5], 2, 1, beta=0.8, steps=20, eta=1e-3,
        delta=1e-6,
    ) == (0.0, 0.0)  # fmt: skip
