"""Ranking metrics, the evaluation runner and the ``evaluate`` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from service.cli import main
from service.errors import InvalidParameter
from service.evaluation.metrics import dcg, ideal_ranking, mean_ci, ndcg_at_k, recall_at_k
from service.evaluation.runner import MECHANISMS, EvaluationRow, evaluate, sample_seeds
from service.graph.model import Graph
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges, random_graph
from tests.shared_data import needs_shared_file, shared_file

# ---------------------------------------------------------------- metrics


def test_dcg_by_hand() -> None:
    assert dcg(np.array([3.0, 2.0, 1.0])) == pytest.approx(3 + 2 / math.log2(3) + 1 / 2)
    assert dcg(np.array([])) == 0.0


def test_perfect_and_reversed_rankings() -> None:
    exact = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    best = np.array([0, 1, 2, 3, 4])
    assert ndcg_at_k(best, exact, 3) == pytest.approx(1.0)
    assert recall_at_k(best, exact, 3) == 1.0
    worst = best[::-1]
    expected = (0.05 + 0.1 / math.log2(3) + 0.15 / 2) / (0.5 + 0.2 / math.log2(3) + 0.15 / 2)
    assert ndcg_at_k(worst, exact, 3) == pytest.approx(expected)
    assert recall_at_k(worst, exact, 3) == pytest.approx(1 / 3)  # only node 2 is shared


def test_exclude_is_removed_from_both_lists() -> None:
    exact = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    exclude = np.array([0])
    # ideal list without node 0: [1, 2]; the private list's node 0 is dropped, not counted
    assert ndcg_at_k(np.array([0, 1, 2]), exact, 2, exclude) == pytest.approx(1.0)
    assert recall_at_k(np.array([0, 1, 2]), exact, 2, exclude) == 1.0
    np.testing.assert_array_equal(ideal_ranking(exact, 2, exclude), [1, 2])
    swapped = (0.15 + 0.2 / math.log2(3)) / (0.2 + 0.15 / math.log2(3))
    assert ndcg_at_k(np.array([2, 1]), exact, 2, exclude) == pytest.approx(swapped)


def test_zero_score_nodes_are_not_relevant() -> None:
    exact = np.array([0.6, 0.4, 0.0, 0.0])
    assert recall_at_k(np.array([1, 2, 3]), exact, 3, np.array([0])) == 1.0  # ideal = [1]
    assert math.isnan(ndcg_at_k(np.array([2, 3]), exact, 2, np.array([0, 1])))
    assert math.isnan(recall_at_k(np.array([2, 3]), exact, 2, np.array([0, 1])))


def test_mean_ci_matches_scipy() -> None:
    values = np.random.default_rng(0).random(20)
    mean, (low, high) = mean_ci(values)
    ref = stats.t.interval(0.95, 19, loc=values.mean(), scale=stats.sem(values))
    assert mean == pytest.approx(values.mean())
    assert (low, high) == pytest.approx(ref)
    mean, ci = mean_ci([0.5, float("nan")])
    assert mean == 0.5 and all(math.isnan(c) for c in ci)
    assert math.isnan(mean_ci([])[0])


# ---------------------------------------------------------------- runner


def two_communities(size: int = 60, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    edges = [
        (u, v)
        for u in range(2 * size)
        for v in range(u + 1, 2 * size)
        if rng.random() < (0.2 if (u < size) == (v < size) else 0.01)
    ]
    return graph_from_edges(edges, 2 * size + 3)  # 3 isolated nodes: never seeds


def test_rows_shape_and_ranges() -> None:
    graph = two_communities()
    notes: list[str] = []
    rows = evaluate(
        graph, [0.5, 2.0], seeds_count=5, k=10, rng=np.random.default_rng(1), notes=notes
    )
    assert [(r.mechanism, r.epsilon) for r in rows] == [
        (m, e) for e in (0.5, 2.0) for m in MECHANISMS
    ]
    assert notes == ["default = friends_of_friends (the service's default in personalized mode)"]
    for row in rows:
        assert row.seeds == 5
        for value, ci in (
            (row.ndcg, row.ndcg_ci),
            (row.recall, row.recall_ci),
            (row.ndcg_beyond, row.ndcg_beyond_ci),
            (row.recall_beyond, row.recall_beyond_ci),
        ):
            assert 0.0 <= value <= 1.0
            assert ci[0] <= value <= ci[1]
        payload = row.to_dict()
        assert set(payload) == {
            "mechanism", "epsilon", "ndcg", "ndcg_ci", "recall", "recall_ci", "ndcg_beyond",
            "ndcg_beyond_ci", "recall_beyond", "recall_beyond_ci", "seeds",
        }  # fmt: skip
        json.dumps(payload, allow_nan=False)
    by = {(r.mechanism, r.epsilon): r for r in rows}
    # the free baselines do not depend on epsilon
    assert by[("random", 0.5)].ndcg == by[("random", 2.0)].ndcg
    assert by[("neighbours_only", 0.5)].ndcg > by[("random", 0.5)].ndcg


def test_near_exact_mechanisms_score_high() -> None:
    """Huge epsilon and non-binding caps: PushFlowCap's ranking is the exact one."""
    graph = two_communities(40, seed=3)
    rows = evaluate(
        graph, [1e6], seeds_count=4, k=10, mechanisms=["pushflowcap", "random"],
        sigma=10.0, rng=np.random.default_rng(0),
    )  # fmt: skip
    push, rand = rows
    assert push.ndcg > 0.99 and push.recall > 0.95 and push.ndcg_beyond > 0.99
    assert rand.ndcg < 0.7


def test_neighbours_only_ranks_neighbours_first() -> None:
    # A star around 0 plus a far path: neighbours-only gets the top of the list right.
    edges = [(0, i) for i in range(1, 6)] + [(5, 6), (6, 7), (7, 8), (8, 9)]
    graph = graph_from_edges(edges)
    rows = evaluate(
        graph, [1.0], seeds_count=10, k=5, mechanisms=["neighbours_only"],
        rng=np.random.default_rng(0),
    )  # fmt: skip
    assert rows[0].seeds == 10
    assert rows[0].recall > 0.5


def test_seed_sample() -> None:
    graph = two_communities()
    seeds = sample_seeds(graph, 500, np.random.default_rng(0))
    assert seeds.shape[0] == int((graph.degrees >= 1).sum())  # capped at the eligible count
    assert np.all(graph.degrees[seeds] >= 1)
    assert len(set(seeds.tolist())) == seeds.shape[0]
    with pytest.raises(InvalidParameter):
        sample_seeds(graph_from_edges([], 4), 1, np.random.default_rng(0))


def test_edge_flipping_skipped_on_large_graphs() -> None:
    graph = two_communities(30)
    notes: list[str] = []
    rows = evaluate(
        graph, [1.0], seeds_count=2, k=5, mechanisms=["random", "edge_flipping"],
        edge_flipping_max_nodes=10, notes=notes,
    )  # fmt: skip
    assert [r.mechanism for r in rows] == ["random"]
    assert len(notes) == 1 and "edge_flipping skipped" in notes[0]


def test_edge_mode_runs() -> None:
    graph = two_communities(30)
    notes: list[str] = []
    rows = evaluate(
        graph, [1.0], seeds_count=3, k=5, mode=Mode.EDGE, mechanisms=MECHANISMS, notes=notes
    )
    personalized_only = {"common_neighbours", "friends_of_friends", "blended"}
    assert [r.mechanism for r in rows] == [m for m in MECHANISMS if m not in personalized_only]
    assert len(notes) == 4 and all("skipped: personalized mode only" in n for n in notes[:3])
    assert notes[3] == "default = noisy_diffusion (the service's default in edge mode)"


def _same_numbers(a: EvaluationRow, b: EvaluationRow) -> bool:
    return (a.ndcg, a.recall, a.ndcg_beyond, a.recall_beyond, a.seeds) == (
        b.ndcg, b.recall, b.ndcg_beyond, b.recall_beyond, b.seeds
    )  # fmt: skip


def test_default_row_is_the_services_default() -> None:
    graph = two_communities(30)
    rows = evaluate(
        graph, [0.5, 1.0], seeds_count=4, k=5, rng=np.random.default_rng(2),
        mechanisms=["common_neighbours", "friends_of_friends", "default"],
    )  # fmt: skip
    by = {(r.mechanism, r.epsilon): r for r in rows}
    assert [r.mechanism for r in rows] == ["common_neighbours", "friends_of_friends", "default"] * 2
    for eps in (0.5, 1.0):  # the same draws, reported under the default's name
        assert _same_numbers(by[("default", eps)], by[("friends_of_friends", eps)])
    # another configured default, not asked for by name: computed, shown as `default` only
    notes: list[str] = []
    rows = evaluate(
        graph, [1.0], seeds_count=4, k=5, rng=np.random.default_rng(2),
        mechanisms=["random", "default"], default_mechanism="popular", notes=notes,
    )  # fmt: skip
    assert [r.mechanism for r in rows] == ["random", "default"]
    assert notes == ["default = popular (the service's default in personalized mode)"]
    # edge mode: a personalized-only default is the diffusion there, as in the service
    rows = evaluate(
        graph, [1.0], seeds_count=3, k=5, mode=Mode.EDGE, rng=np.random.default_rng(2),
        mechanisms=["noisy_diffusion", "default"],
    )  # fmt: skip
    assert _same_numbers(rows[0], rows[1])


def test_cli_default_row_follows_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    edges = tmp_path / "edges.txt"
    _write_edges(edges)
    monkeypatch.setenv("PPR_DEFAULT_MECHANISM", "common_neighbours")
    argv = ["evaluate", "--graph", str(edges), "--epsilon", "1", "--seeds", "3", "--k", "5",
            "--mechanisms", "common_neighbours", "default", "--sample-seed", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "note: default = common_neighbours" in out
    assert [line.split()[0] for line in out.splitlines()[2:4]] == ["common_neighbours", "default"]


def test_popular_is_one_release_and_common_neighbours_find_the_community() -> None:
    """Popular is drawn once for the run (the same under every epsilon); at a huge epsilon the
    noisy common-neighbour counts rank the seed's community first beyond its neighbours."""
    graph = two_communities(40, seed=5)
    rows = evaluate(
        graph, [0.5, 1e5], seeds_count=6, k=10,
        mechanisms=["popular", "common_neighbours", "friends_of_friends", "blended", "random"],
        rng=np.random.default_rng(2),
    )  # fmt: skip
    by = {(r.mechanism, r.epsilon): r for r in rows}
    assert by[("popular", 0.5)].to_dict() | {"epsilon": 0} == by[("popular", 1e5)].to_dict() | {
        "epsilon": 0
    }
    assert by[("common_neighbours", 1e5)].recall_beyond > 0.5
    assert by[("common_neighbours", 1e5)].ndcg_beyond > by[("random", 1e5)].ndcg_beyond
    # blended puts the seed's friends first and, beyond them, finds the community better than
    # the degrees alone (it keeps >= 15% of the noisy degrees even when the counts are exact,
    # so beyond the friends it need not match common_neighbours here: docs/ranking.md)
    assert by[("blended", 1e5)].recall > by[("common_neighbours", 1e5)].recall
    assert by[("blended", 1e5)].recall_beyond > by[("popular", 1e5)].recall_beyond
    assert by[("blended", 1e5)].recall_beyond > by[("random", 1e5)].recall_beyond
    # friends_of_friends: the seed's friends first, then the community by its counts
    assert by[("friends_of_friends", 1e5)].recall > by[("common_neighbours", 1e5)].recall
    assert by[("friends_of_friends", 1e5)].recall_beyond > 0.5


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"epsilons": []}, "epsilon"),
        ({"epsilons": [0.0]}, "epsilon"),
        ({"epsilons": [-1.0]}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"delta": 0.0}, "delta"),
        ({"beta": 1.0}, "beta"),
        ({"beta": 0.0}, "beta"),
        ({"steps": 0}, "steps"),
        ({"eta": 0.0}, "eta"),
        ({"k": 0}, "k"),
        ({"seeds_count": 0}, "seeds"),
        ({"mechanisms": ["noisy_diffusion", "magic"]}, "mechanisms"),
        ({"mode": "public"}, "mode"),
        ({"sigma": -1.0}, "sigma"),
        ({"popular_epsilon": 0.0}, "popular_epsilon"),
    ],
)
def test_bad_parameters(kwargs: dict[str, object], parameter: str) -> None:
    graph = random_graph(20, 0.3, np.random.default_rng(0))
    arguments: dict[str, object] = {"epsilons": [1.0], **kwargs}
    with pytest.raises(InvalidParameter) as info:
        evaluate(graph, **arguments)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def load_snap(path: Path) -> Graph:
    pairs = np.loadtxt(path, dtype=np.int64, comments="#")
    return graph_from_edges(map(tuple, pairs.tolist()))


@pytest.mark.slow
@needs_shared_file("email-Eu-core.txt")
def test_integration_email_eu_core() -> None:
    graph = load_snap(shared_file("email-Eu-core.txt"))
    rows = evaluate(graph, [1.0], seeds_count=4, k=50, rng=np.random.default_rng(0))
    by = {r.mechanism: r for r in rows}
    assert set(by) == set(MECHANISMS)  # 1,005 nodes: edge flipping runs
    assert by["noisy_diffusion"].ndcg > by["random"].ndcg
    assert by["noisy_diffusion"].ndcg > 0.5


# ---------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv",
    [
        ["--epsilon", "0"],
        ["--epsilon", "-1"],
        ["--epsilon", "1", "--beta", "1.5"],
        ["--epsilon", "1", "--steps", "0"],
        ["--epsilon", "1", "--eta", "0"],
        ["--epsilon", "1", "--delta", "1"],
        ["--epsilon", "1", "--k", "0"],
        ["--epsilon", "1", "--mechanisms", "magic"],
        ["--epsilon", "1", "--mode", "public"],
        ["--epsilon", "1", "--popular-epsilon", "0"],
    ],
)
def test_cli_rejects_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--graph", "unused.txt", *argv])
    assert info.value.code != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" in err


def test_cli_rejects_too_many_steps(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["evaluate", "--graph", "unused.txt", "--epsilon", "1", "--steps", "100000"])
    assert code != 0
    err = capsys.readouterr().err
    assert "steps" in err and "Traceback" not in err


def _write_edges(path: Path) -> None:
    graph = two_communities(25)
    rows, cols = np.nonzero(np.triu(graph.adjacency.toarray(), k=1))
    path.write_text("".join(f"{u} {v}\n" for u, v in zip(rows, cols, strict=True)))


def test_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("service.graph.loader")
    edges = tmp_path / "edges.txt"
    _write_edges(edges)
    base = ["evaluate", "--graph", str(edges), "--epsilon", "0.5", "1", "--seeds", "3",
            "--k", "5", "--sample-seed", "1"]  # fmt: skip
    assert main([*base, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload) == 2 * len(MECHANISMS)
    assert payload[0]["mechanism"] == "blended" and payload[0]["seeds"] == 3
    assert len(payload[0]["ndcg_ci"]) == 2
    assert main([*base, "--mechanisms", "random", "pushflowcap"]) == 0
    out = capsys.readouterr().out
    assert "NDCG@5" in out and "Recall@5 beyond" in out and "pushflowcap" in out


def test_row_to_dict_turns_nan_into_null() -> None:
    nan = math.nan
    row = EvaluationRow("random", 1.0, nan, (nan, nan), 0.5, (0.4, 0.6), 0, (0, 0), 0, (0, 0), 1)
    payload = row.to_dict()
    assert payload["ndcg"] is None and payload["ndcg_ci"] == [None, None]
    assert payload["recall_ci"] == [0.4, 0.6]
