"""``bench --papers-code DIR``: the papers' own code, timed on bench's graph and seeds.

The papers' repository (Graph-COM/DP_GraphDiffusion) is not part of this project and none of it
is copied here: the person running the benchmark gives a checkout of it (a directory holding
its ``model.py``) and, optionally, a Python that has its requirements (pandas, their pinned
scipy; default: this interpreter). bench writes the graph it loaded (internal ids, each edge
once) to a temporary edge list, runs ``papers_driver.py`` by its path under that Python with
the same seeds and the same K, beta, eta and noise scale, and reads back one time per seed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidParameter, ServiceError

if TYPE_CHECKING:
    from service.graph.model import Graph
    from service.privacy.calibration import DiffusionConfig

DRIVER = Path(__file__).with_name("papers_driver.py")
#: Where the papers' code is published, for the messages that ask for a checkout of it.
PAPERS_REPOSITORY = "https://github.com/Graph-COM/DP_GraphDiffusion"
#: Seconds the papers' code may take for all its seeds (their query is ~0.1-1 s on 10^4-10^5
#: nodes; the setup, once, is longer on large graphs).
PAPERS_TIMEOUT = 3600.0


class PapersCodeFailed(ServiceError):
    """The papers' code ran and failed, or printed no report."""

    code = "papers_code_failed"
    exit_code = 1


@dataclass(frozen=True)
class PapersTimes:
    """The papers' code on bench's seeds: seconds per query (in the seeds' order), its one-off
    setup, and what it ran with."""

    seconds: list[float]
    setup_seconds: float
    environment: str


def check_papers_code(directory: Path, python: str) -> None:
    """A clear error, before anything is timed, when the checkout or its Python is unusable."""
    if not (directory / "model.py").is_file():
        raise InvalidParameter(
            "papers_code",
            f"{directory} has no model.py; give a checkout of {PAPERS_REPOSITORY}",
        )
    executable = shutil.which(python)
    if executable is None:
        raise InvalidParameter("papers_python", f"{python} is not an executable Python")
    probe = subprocess.run(
        [executable, "-c", "import numpy, scipy, pandas"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        raise InvalidParameter(
            "papers_python",
            f"{python} cannot run the papers' code ({reason}); give a Python with their "
            "requirements (numpy, scipy, pandas), e.g. a venv made with "
            "'pip install numpy pandas scipy==1.11.4'",
        )


def write_edge_list(graph: Graph, path: Path) -> None:
    """The graph's edges in internal ids, ``u v`` with u < v, one a line."""
    import numpy as np

    rows = np.repeat(np.arange(graph.n, dtype=np.int64), np.diff(graph.indptr))
    columns = graph.indices.astype(np.int64)
    upper = rows < columns
    np.savetxt(path, np.column_stack([rows[upper], columns[upper]]), fmt="%d")


def time_papers_code(
    graph: Graph,
    seeds: Sequence[int],
    config: DiffusionConfig,
    *,
    epsilon: float,
    delta: float,
    directory: Path,
    python: str = sys.executable,
    timeout: float = PAPERS_TIMEOUT,
) -> PapersTimes:
    """The papers' ``PrivatePageRankClip`` on ``graph`` for each of ``seeds``, one at a time."""
    check_papers_code(directory, python)
    with tempfile.TemporaryDirectory(prefix="ppr-papers-code-") as tmp:
        edges = Path(tmp) / "edges.txt"
        write_edge_list(graph, edges)
        command = [
            python, str(DRIVER), "--code", str(directory), "--edges", str(edges),
            "--nodes", str(graph.n), "--seeds", ",".join(str(int(s)) for s in seeds),
            "--beta", repr(config.beta), "--steps", str(config.steps),
            "--eta", repr(config.eta), "--scale", repr(config.noise_scale),
            "--epsilon", repr(epsilon), "--delta", repr(delta),
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PapersCodeFailed(f"the papers' code did not finish in {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise PapersCodeFailed(f"the papers' code failed (status {done.returncode}): {last}")
    return parse_report(done.stdout, len(seeds))


def parse_report(text: str, seeds: int) -> PapersTimes:
    """The driver's JSON report, checked: one positive time per seed."""
    try:
        report: dict[str, Any] = json.loads(text)
        seconds = [float(s) for s in report["seconds"]]
        setup = float(report["setup_seconds"])
        environment = (
            f"Python {report['python']}, numpy {report['numpy']}, scipy {report['scipy']}, "
            f"pandas {report['pandas']}"
        )
    except (ValueError, KeyError, TypeError):
        raise PapersCodeFailed("the papers' code printed no report") from None
    if len(seconds) != seeds or not all(s > 0 for s in seconds):
        raise PapersCodeFailed(f"the papers' report has {len(seconds)} times for {seeds} seeds")
    return PapersTimes(seconds, setup, environment)
