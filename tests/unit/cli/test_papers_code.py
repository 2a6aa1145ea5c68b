"""``bench --papers-code`` (service/cli/papers_code.py and the driver it runs,
service/cli/papers_driver.py): the papers' class is called on bench's own graph, seeds and
parameters, one timed call per seed, and every way it can fail ends in one clear error.

The papers' code cannot be part of this repository, so these tests write a stand-in
``model.py`` with the papers' interface (``PrivatePageRankClip(graph, epsilon, delta, eta,
sigma, beta, max_iter, sample)`` and ``propagate_selected(indices, noise_type)``) that runs a
plain thresholded diffusion and records what it was given, and run the real driver on it in a
subprocess, on this interpreter."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from service.cli import main as cli_main
from service.cli.papers_code import (
    PapersCodeFailed,
    PapersSession,
    check_papers_code,
    write_edge_list,
)
from service.cli.papers_driver import PAPERS_CLASS
from service.errors import InvalidParameter
from service.graph.generate import generate_graph
from service.graph.model import Graph
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode

STAND_IN = """
import json, os, time
import numpy as np
import scipy.sparse as sp

RECORD = os.path.join(os.path.dirname(__file__), "record.json")


class PrivatePageRankClip:
    def __init__(self, graph, epsilon, delta, eta, sigma, beta, max_iter, sample):
        edges = graph.edges.to_numpy()
        n = int(graph.edges.max().max()) + 1
        a = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
        self.walk = ((a + a.T) @ sp.diags(1.0 / np.maximum((a + a.T).sum(axis=0).A1, 1))).tocsr()
        self.steps, self.beta = max_iter, beta
        self.record = {"nodes": graph.nodes, "edges": edges.tolist(), "epsilon": epsilon,
                       "delta": delta, "eta": eta, "sigma": sigma, "beta": beta,
                       "max_iter": max_iter, "sample": sample, "calls": []}

    def propagate_selected(self, sampled_indices, noise_type, personalize=True):
        print("Calibrated Noise: 0.1")  # their code prints; the driver keeps it off its replies
        if os.environ.get("STAND_IN_FAILS"):
            raise MemoryError("the stand-in ran out of memory")
        if os.environ.get("STAND_IN_SLOW"):
            time.sleep(float(os.environ["STAND_IN_SLOW"]))
        self.record["calls"].append([sampled_indices.tolist(), noise_type, personalize])
        with open(RECORD, "w") as f:
            json.dump(self.record, f)
        p = np.zeros(self.walk.shape[0])
        p[sampled_indices[0]] = 1.0
        for _ in range(self.steps):
            p = self.beta * (self.walk @ p)
        return p[None, :]
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(STAND_IN)
    return tmp_path


@pytest.fixture(scope="module")
def graph() -> Graph:
    return generate_graph(60, 240, seed=4)


def test_the_papers_class_gets_bench_s_graph_seeds_and_parameters(
    stand_in: Path, graph: Graph
) -> None:
    config = plan_diffusion(0.5, 1e-6, 12, 0.7, 1e-5, Mode.EDGE).config
    seeds = [17, 3, 42]
    with PapersSession(graph, config, epsilon=0.5, delta=1e-6, directory=stand_in) as papers:
        assert "pandas" in papers.environment and papers.setup_seconds > 0
        times = [papers.time(seed) for seed in seeds]
    assert len(times) == 3 and all(t > 0 for t in times)
    assert not Path(papers._tmp.name).exists()  # the edge list is removed
    record = json.loads((stand_in / "record.json").read_text())
    # the same noise: their step adds two Laplace vectors of scale sigma / sqrt(2) each
    assert record["sigma"] == pytest.approx(config.noise_scale * math.sqrt(2.0), rel=1e-15)
    assert (record["max_iter"], record["beta"], record["eta"]) == (12, 0.7, config.eta)
    assert (record["epsilon"], record["delta"], record["sample"]) == (0.5, 1e-6, False)
    assert record["calls"] == [[[s], "Laplacian", True] for s in seeds]  # one at a time
    edges = {tuple(e) for e in record["edges"]}
    rows = np.repeat(np.arange(graph.n), np.diff(graph.indptr))
    expected = {(int(u), int(v)) for u, v in zip(rows, graph.indices, strict=True) if u < v}
    assert edges == expected and len(record["edges"]) == len(expected)
    assert record["nodes"] == graph.n


def test_the_edge_list_holds_each_edge_once_in_internal_ids(tmp_path: Path, graph: Graph) -> None:
    path = tmp_path / "edges.txt"
    write_edge_list(graph, path)
    pairs = np.loadtxt(path, dtype=np.int64)
    assert (pairs[:, 0] < pairs[:, 1]).all()
    assert len(pairs) == graph.m


def test_a_directory_without_the_papers_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"no model.py.*Graph-COM/DP_GraphDiffusion"):
        check_papers_code(tmp_path, sys.executable)


def test_a_python_that_cannot_run_the_papers_code_is_refused(stand_in: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"not an executable Python"):
        check_papers_code(stand_in, str(stand_in / "no-such-python"))
    # a stand-in for a Python without pandas: it fails the requirements check as one would
    lacking = stand_in / "python-without-pandas"
    lacking.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'pandas'\" >&2\n"
                       "exit 1\n")  # fmt: skip
    lacking.chmod(0o755)
    with pytest.raises(InvalidParameter, match=r"No module named 'pandas'.*scipy==1.11.4"):
        check_papers_code(stand_in, str(lacking))


def test_the_papers_code_failing_is_one_error_with_its_reason(
    stand_in: Path, graph: Graph, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plan_diffusion(0.5, 1e-6, 12, 0.7, 1e-5, Mode.EDGE).config
    monkeypatch.setenv("STAND_IN_FAILS", "1")
    failed = r"failed a query from 1 \(status 1\): MemoryError: the stand"
    with (
        PapersSession(graph, config, epsilon=0.5, delta=1e-6, directory=stand_in) as papers,
        pytest.raises(PapersCodeFailed, match=failed),
    ):
        papers.time(1)
    monkeypatch.delenv("STAND_IN_FAILS")
    (stand_in / "model.py").write_text("class Other:\n    pass\n")
    with pytest.raises(PapersCodeFailed, match=rf"failed set up .*has no class {PAPERS_CLASS}"):
        PapersSession(graph, config, epsilon=0.5, delta=1e-6, directory=stand_in)


def test_the_papers_code_that_does_not_answer_in_time_is_stopped(
    stand_in: Path, graph: Graph, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = plan_diffusion(0.5, 1e-6, 12, 0.7, 1e-5, Mode.EDGE).config
    monkeypatch.setenv("STAND_IN_SLOW", "30")
    papers = PapersSession(graph, config, epsilon=0.5, delta=1e-6, directory=stand_in, timeout=1.0)
    with pytest.raises(PapersCodeFailed, match=r"did not answer \(a query from 2\) in 1 s"):
        papers.time(2)
    papers.close()  # ends the process (killed: it is still asleep) and removes the edge list
    assert papers._process.returncode is not None
    assert not Path(papers._tmp.name).exists()


def test_bench_adds_the_papers_row_and_its_ratio(
    stand_in: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main([
        "bench", "--generate", "300,1500", "--queries", "3", "--mode", "edge",
        "--mechanisms", "noisy_cold", "noisy_warm", "--batch", "4",
        "--papers-code", str(stand_in), "--json",
    ])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["papers_code"]["code"] == str(stand_in)
    rows = {(r["mechanism"], r["batch"]): r for r in report["latency"]}
    papers = rows[("papers_code", 1)]
    assert papers["queries"] == 3 and papers["speedup_vs_papers"] == pytest.approx(1.0)
    for key in [("noisy_cold", 1), ("noisy_warm", 1), ("noisy_cold", 4), ("noisy_warm", 4)]:
        row = rows[key]
        assert row["speedup_vs_papers"] == pytest.approx(papers["p50_ms"] / row["p50_ms"])
    record = json.loads((stand_in / "record.json").read_text())
    assert [call[0][0] for call in record["calls"]] == report["seeds"]


def test_bench_refuses_a_bad_papers_code_before_timing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["bench", "--demo", "--papers-code", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error [invalid_parameter]: papers_code:") and "model.py" in err
    assert os.listdir(tmp_path) == []
