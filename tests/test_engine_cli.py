"""The engine commands (calibrate, query, bench) through their real entry point.

Each command prints JSON that other tools parse, and every bad input ends in a non-zero exit
with a one-line ``error [code]: message`` (or argparse's usage error), never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import main
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert isinstance(payload, dict)
    return payload


def write_edges(path: Path) -> Path:
    # two triangles joined by one edge, plus a tail
    path.write_text("# a small graph\na b\nb c\nc a\nc d\nd e\ne f\nf d\nf g\n")
    return path


def test_calibrate_json_matches_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["calibrate", "--epsilon", "0.1", "--delta", "3e-6", "--steps", "100"]
    out = run_json([*argv, "--beta", "0.8", "--eta", "1e-7", "--json"], capsys)
    plan = plan_diffusion(0.1, 3e-6, 100, 0.8, 1e-7, Mode.PERSONALIZED)
    assert out["noise_scale"] == plan.config.noise_scale
    assert out["noisy_steps"] == plan.config.noisy_steps
    assert isinstance(out["epsilon"], float) and out["epsilon"] <= 0.1
    assert out["noise_ratio"] == pytest.approx(80.0, rel=0.005)


def test_calibrate_edge_mode_needs_more_noise(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["calibrate", "--epsilon", "0.5", "--delta", "1e-6", "--steps", "50", "--json"]
    personalized = run_json(base, capsys)
    edge = run_json([*base, "--mode", "edge"], capsys)
    assert float(str(edge["noise_scale"])) > float(str(personalized["noise_scale"]))


def test_query_json_on_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = write_edges(tmp_path / "g.txt")
    argv = ["query", "--graph", str(graph), "--seed", "a", "--epsilon", "1", "--k", "3"]
    out = run_json([*argv, "--json"], capsys)
    results = out["results"]
    assert isinstance(results, list) and len(results) == 3
    assert all(r["node"] != "a" for r in results)  # the seed is excluded
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True) and min(scores) >= 0.0
    mechanism = out["mechanism"]
    assert isinstance(mechanism, dict)
    assert mechanism["epsilon"] <= 1.0 and mechanism["noise_scale"] > 0


def test_query_answers_differ_between_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No fixed seed anywhere: two runs draw different noise."""
    graph = write_edges(tmp_path / "g.txt")
    argv = ["query", "--graph", str(graph), "--seed", "a", "--epsilon", "0.1", "--k", "6"]
    first = run_json([*argv, "--json"], capsys)["results"]
    second = run_json([*argv, "--json"], capsys)["results"]
    assert first != second


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["query", "--seed", "no-such-node", "--epsilon", "0.1"], "error [unknown_node]"),
        (["query", "--seed", "1", "--epsilon", "0"], "--epsilon"),
        (["query", "--seed", "1", "--epsilon", "0.1", "--k", "0"], "--k"),
        (["query", "--seed", "1", "--epsilon", "0.1", "--beta", "1"], "--beta"),
        (["query", "--seed", "1", "--epsilon", "0.1", "--eta", "-1"], "--eta"),
        (["query", "--seed", "1", "--epsilon", "0.1", "--steps", "0"], "--steps"),
        (["query", "--seed", "1", "--epsilon", "0.1", "--delta", "1"], "--delta"),
        (["query", "--seed", "1", "--epsilon", "abc"], "--epsilon"),
        (["query", "--seed", "1", "--epsilon", "0.1", "--mode", "global"], "--mode"),
        (["calibrate", "--epsilon", "0.1", "--delta", "0", "--steps", "10"], "--delta"),
        (
            ["query", "--graph", "/no/such/file.txt", "--seed", "1", "--epsilon", "0.1"],
            "graph_load",
        ),
        (["bench", "--generate", "10", "--json"], "--generate"),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process, as tests/test_cli_errors.py runs its cases (``python -m service`` is
    ``SystemExit(main())``; the subprocess test below runs that entry point itself)."""
    with pytest.raises(SystemExit) as raised:
        raise SystemExit(main(argv))
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


def test_broken_graph_file_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("a b\nlonely\n")
    proc = subprocess.run(
        [sys.executable, "-m", "service", "query", "--graph", str(bad), "--seed", "a",
         "--epsilon", "0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{bad}:2" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_reports_every_mechanism(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(["bench", "--generate", "2000,10000", "--queries", "2", "--json"], capsys)
    rows = out["latency"]
    assert isinstance(rows, list)
    names = {row["mechanism"] for row in rows}
    expected = {
        "noisy_cold", "noisy_warm", "blended", "friends_of_friends", "common_neighbours",
        "exact_ppr", "pushflowcap", "naive_reference",
    }  # fmt: skip
    assert names == expected
    single = [row for row in rows if row["batch"] == 1]
    assert {row["mechanism"] for row in single} == expected
    assert all(row["queries"] == 2 and row["p50_ms"] > 0 for row in single)
    batched = {row["mechanism"]: row for row in rows if row["batch"] == 32}
    assert set(batched) == {"noisy_cold", "noisy_warm"}  # --batch 32 by default
    assert all(row["queries"] == 32 * 3 and row["p50_ms"] > 0 for row in batched.values())
    assert all(row["speedup_vs_naive"] > 0 for row in rows)
    graph = out["graph"]
    assert isinstance(graph, dict) and graph["nodes"] == 2000 and graph["edges"] == 10000
