"""Link prediction (``evaluate --task links``): the seeded split, the metrics by hand, the rows,
and the command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from service.cli import main
from service.errors import InvalidParameter
from service.evaluation.links import evaluate_links, link_metrics, split_edges
from service.evaluation.options import LINK_ROWS
from service.graph.generate import write_generated_edge_list
from service.graph.loader import load_edge_list
from tests.graph_helpers import random_graph


def test_the_split_hides_a_seeded_tenth_and_keeps_the_nodes() -> None:
    graph = random_graph(120, 0.1, np.random.default_rng(3))
    split = split_edges(graph, split_seed=5)
    assert split.hidden.shape == (math.floor(0.1 * graph.m), 2)
    assert split.train.m + split.hidden.shape[0] == graph.m
    assert split.train.n == graph.n and list(split.train.node_ids) == list(graph.node_ids)
    u, v = graph.edge_arrays()
    everything = set(zip(u.tolist(), v.tolist(), strict=True))
    tu, tv = split.train.edge_arrays()
    kept = set(zip(tu.tolist(), tv.tolist(), strict=True))
    hidden = {(int(a), int(b)) for a, b in split.hidden}
    assert kept | hidden == everything and not kept & hidden
    again = split_edges(graph, split_seed=5)
    assert np.array_equal(again.hidden, split.hidden)  # the same split every run
    assert not np.array_equal(split_edges(graph, split_seed=6).hidden, split.hidden)
    by_node = split.hidden_neighbours()
    assert sum(len(x) for x in by_node.values()) == 2 * split.hidden.shape[0]
    with pytest.raises(InvalidParameter):
        split_edges(graph, hidden_fraction=1.0)


def test_link_metrics_by_hand() -> None:
    relevant = np.array([3, 7])
    recall, ndcg = link_metrics(np.array([7, 1, 3, 4]), relevant, 3)
    assert recall == 1.0
    assert ndcg == pytest.approx((1 + 1 / 2) / (1 + 1 / math.log2(3)))
    recall, ndcg = link_metrics(np.array([1, 2, 3]), relevant, 3)
    assert recall == 0.5 and ndcg == pytest.approx((1 / 2) / (1 + 1 / math.log2(3)))
    assert link_metrics(np.array([1, 2]), relevant, 2) == (0.0, 0.0)
    assert all(math.isnan(x) for x in link_metrics(np.array([1]), np.array([], dtype=int), 1))


def test_rows_and_references(tmp_path: Path) -> None:
    path = tmp_path / "g.txt"
    write_generated_edge_list(path, 300, 2400, seed=3)
    graph = load_edge_list(path)
    report = evaluate_links(graph, [1.0], seeds=30, k=10, sample_seed=2, steps=20,
                            own_epsilons={"blended": 0.05})  # fmt: skip
    by = {(r.mechanism, r.epsilon): r for r in report.rows}
    private = ("blended", "noisy_diffusion", "friends_of_friends", "common_neighbours",
               "pushflowcap")  # fmt: skip
    for name in private:
        assert (name, 1.0) in by
    for name in ("popular", "exact_ppr", "common_neighbours_exact", "random"):
        assert (name, None) in by  # once: they do not depend on the per-answer epsilon
    assert ("blended", 0.05) in by and ("default", 1.0) in by
    assert by[("default", 1.0)].recall == by[("friends_of_friends", 1.0)].recall
    assert report.seeds == 30 and all(r.seeds == 30 for r in report.rows)
    assert report.hidden_edges == math.floor(0.1 * graph.m)
    for r in report.rows:
        assert 0.0 <= r.recall <= 1.0 and 0.0 <= r.ndcg <= 1.0
        assert r.recall_ci[0] <= r.recall <= r.recall_ci[1]
    # the exact references find hidden edges far better than chance
    assert by[("exact_ppr", None)].recall > by[("random", None)].recall
    assert by[("common_neighbours_exact", None)].recall > by[("random", None)].recall
    edge = evaluate_links(graph, [1.0], seeds=5, k=10, sample_seed=2, steps=20, mode="edge",
                          mechanisms=["blended", "noisy_diffusion", "exact_ppr"])  # fmt: skip
    assert {r.mechanism for r in edge.rows} == {"noisy_diffusion", "exact_ppr"}
    assert any("personalized mode only" in n for n in edge.notes)


def test_bad_parameters() -> None:
    graph = random_graph(60, 0.2, np.random.default_rng(1))
    for kwargs in ({"seeds": 0}, {"k": 0}, {"mechanisms": ["pagerank"]}):
        with pytest.raises(InvalidParameter):
            evaluate_links(graph, [1.0], **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        evaluate_links(graph, [0.0])


def test_the_links_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.txt"
    write_generated_edge_list(path, 200, 1600, seed=4)
    argv = ["evaluate", "--task", "links", "--graph", str(path), "--epsilon", "1",
            "--seeds", "12", "--steps", "20", "--sample-seed", "1",
            "--plan", "1", "365", "1", "4"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Recall@20" in out and "NDCG@20" in out and "(plan)" in out
    assert "exact_ppr" in out and "common_neighbours_exact" in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["k"] == 20 and data["seeds"] == 12
    assert data["planned_epsilons"]["blended"] == pytest.approx(0.00829366)
    assert {r["mechanism"] for r in data["rows"]} >= set(LINK_ROWS)
    assert main(["evaluate", "--task", "links", "--graph", str(path)]) == 2
    assert "--epsilon" in capsys.readouterr().err
