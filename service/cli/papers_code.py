"""``bench --papers-code DIR``: the papers' own code, timed on bench's graph and seeds.

The papers' repository (Graph-COM/DP_GraphDiffusion) is not part of this project and none of it
is copied here: the person running the benchmark gives a checkout of it (a directory holding
its ``model.py``) and, optionally, a Python that has its requirements (pandas, their pinned
scipy; default: this interpreter). bench writes the graph it loaded (internal ids, each edge
once) to a temporary edge list and starts ``papers_driver.py`` by its path under that Python
with the same K, beta, eta and noise scale (:class:`PapersSession`). Then, seed by seed, it times
its own queries and asks the driver to time theirs right after, so that the machine's speed,
which can drift by a third within a minute on a shared machine, is the same for both sides.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidParameter, ServiceError

if TYPE_CHECKING:
    from service.graph.model import Graph
    from service.privacy.calibration import DiffusionConfig

DRIVER = Path(__file__).with_name("papers_driver.py")
#: Where the papers' code is published, for the messages that ask for a checkout of it.
PAPERS_REPOSITORY = "https://github.com/Graph-COM/DP_GraphDiffusion"
#: Seconds the papers' code may take to set up, or for one query (their query is ~0.1-1 s on
#: 10^4-10^5 nodes; the setup, once, is longer on large graphs).
PAPERS_TIMEOUT = 3600.0


class PapersCodeFailed(ServiceError):
    """The papers' code ran and failed, or printed no report, or did not answer in time."""

    code = "papers_code_failed"
    exit_code = 1


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


class PapersSession:
    """The papers' ``PrivatePageRankClip`` on ``graph``, built once in the driver's process;
    :meth:`time` runs one query there and returns its seconds. Use it as a context manager:
    leaving it ends the process and removes the edge list. The caller checks ``directory`` and
    ``python`` first (:func:`check_papers_code`: bench does, before it loads the graph)."""

    def __init__(
        self,
        graph: Graph,
        config: DiffusionConfig,
        *,
        epsilon: float,
        delta: float,
        directory: Path,
        python: str = sys.executable,
        timeout: float = PAPERS_TIMEOUT,
        setup_timeout: float = PAPERS_TIMEOUT,
    ) -> None:
        self.timeout = timeout  # a query's; the set-up (imports, their class) has its own
        self._stuck = False
        self._tmp = tempfile.TemporaryDirectory(prefix="ppr-papers-code-")
        tmp = Path(self._tmp.name)
        edges = tmp / "edges.txt"
        write_edge_list(graph, edges)
        command = [
            python, str(DRIVER), "--code", str(directory), "--edges", str(edges),
            "--nodes", str(graph.n), "--beta", repr(config.beta), "--steps", str(config.steps),
            "--eta", repr(config.eta), "--scale", repr(config.noise_scale),
            "--epsilon", repr(epsilon), "--delta", repr(delta),
        ]  # fmt: skip
        self._errors = open(tmp / "stderr.txt", "w+")  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors,
            text=True, bufsize=1,
        )  # fmt: skip
        try:
            ready = self._reply("set up", setup_timeout)
            self.setup_seconds = float(ready["setup_seconds"])
            self.environment = (
                f"Python {ready['python']}, numpy {ready['numpy']}, scipy {ready['scipy']}, "
                f"pandas {ready['pandas']}"
            )
        except (KeyError, TypeError, ValueError):
            self.close()
            raise PapersCodeFailed("the papers' code printed no report when set up") from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> PapersSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def time(self, seed: int) -> float:
        """Seconds the papers' code took for one query from ``seed``."""
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(f"{int(seed)}\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            raise self._failed("while a query was sent") from None
        reply = self._reply(f"a query from {int(seed)}", self.timeout)
        seconds = reply.get("seconds")
        if not isinstance(seconds, int | float) or not seconds > 0:
            raise PapersCodeFailed(f"the papers' code reported {seconds!r} seconds a query")
        return float(seconds)

    def close(self) -> None:
        """End the driver (its input closed, then terminated if it does not exit) and remove
        the edge list."""
        process = self._process
        if process.stdin is not None and not process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        try:
            process.wait(timeout=0 if self._stuck else 10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        self._errors.close()
        self._tmp.cleanup()

    def _reply(self, what: str, timeout: float) -> dict[str, Any]:
        """The driver's next line as JSON, within ``timeout`` seconds."""
        stdout = self._process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        if not ready:
            self._stuck = True  # close() kills it rather than wait for it
            raise PapersCodeFailed(f"the papers' code did not answer ({what}) in {timeout:.0f} s")
        line = stdout.readline()
        if not line:
            raise self._failed(what)
        try:
            reply = json.loads(line)
        except ValueError:
            raise PapersCodeFailed(f"the papers' code printed {line.strip()[:80]!r}") from None
        if not isinstance(reply, dict):
            raise PapersCodeFailed(f"the papers' code printed {line.strip()[:80]!r}")
        return reply

    def _failed(self, what: str) -> PapersCodeFailed:
        status = self._process.wait(timeout=10)
        self._errors.seek(0)
        last = (self._errors.read().strip().splitlines() or ["no message"])[-1]
        return PapersCodeFailed(f"the papers' code failed {what} (status {status}): {last}")
