"""Times the papers' own noisy diffusion on a graph and seeds given to it: run as a script.

``bench --papers-code DIR`` runs this file, by its path, under the papers' Python
(``--papers-python``), so that their code runs with its own requirements (pandas, their pinned
scipy), and reads the JSON it prints. It imports only the standard library, numpy, pandas and
``DIR/model.py``, never the service. Nothing of the papers' code is in this repository: DIR is a
checkout the person running the benchmark provides (Wei, Chien and Li, *Differentially Private
Graph Diffusion with Applications in Personalized PageRanks*, repository
Graph-COM/DP_GraphDiffusion).

It calls their method as their ``main.py`` does for ``--method our``: ``PrivatePageRankClip``
built once on the edge list (untimed, like the service's graph load), then, for each seed bench
sends, ``propagate_selected(np.array([seed]), noise_type='Laplacian')`` (personalized, noise
from the first step on), timed with ``time.perf_counter``. ``sigma`` is ``b * sqrt(2)``: their
step adds two Laplace vectors of scale ``sigma / sqrt(2)`` each, so both sides draw the same
two Lap(b) vectors a noisy step.

Protocol (one JSON object a line, so that bench can time its own query and theirs for the same
seed one after the other): once set up, it prints ``setup_seconds`` and the versions of Python,
numpy, scipy and pandas it runs with; then for each line bench writes (a seed) it prints
``{"seconds": ...}``; it exits at the end of its input. What their code prints goes to stderr.
A failure prints one line to stderr and
exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, TextIO

#: The class and call of the papers' ``main.py`` for their own method.
PAPERS_CLASS = "PrivatePageRankClip"


class _Graph:
    """What their dataset classes give ``PrivatePageRankClip``: ``nodes`` and an ``edges``
    DataFrame of two integer columns, each edge once."""

    def __init__(self, nodes: int, edges: Any) -> None:
        self.nodes = nodes
        self.edges = edges


def _load_model(code: Path) -> Any:
    path = code / "model.py"
    spec = importlib.util.spec_from_file_location("papers_model", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, PAPERS_CLASS):
        raise RuntimeError(f"{path} has no class {PAPERS_CLASS}")
    return getattr(module, PAPERS_CLASS)


def serve(args: argparse.Namespace, requests: TextIO, replies: TextIO) -> None:
    import numpy as np
    import pandas as pd  # type: ignore[import-untyped]
    import scipy

    with contextlib.redirect_stdout(sys.stderr):  # what their code prints stays off the replies
        model = _load_model(args.code)
    edges = pd.read_csv(args.edges, sep=" ", header=None, names=["node1", "node2"])
    graph = _Graph(args.nodes, edges)
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        method = model(
            graph, epsilon=args.epsilon, delta=args.delta, eta=args.eta,
            sigma=args.scale * math.sqrt(2.0), beta=args.beta, max_iter=args.steps,
            sample=False,
        )  # fmt: skip
    ready = {
        "setup_seconds": time.perf_counter() - start,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pandas": pd.__version__,
    }
    print(json.dumps(ready), file=replies, flush=True)
    for line in requests:
        seed = int(line)
        with contextlib.redirect_stdout(sys.stderr):
            start = time.perf_counter()
            method.propagate_selected(np.array([seed]), noise_type="Laplacian")
            seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds}), file=replies, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, required=True, help="directory with model.py")
    parser.add_argument("--edges", type=Path, required=True, help="'u v' lines, 0-based")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--beta", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--eta", type=float, required=True)
    parser.add_argument("--scale", type=float, required=True, help="b, each Laplace's scale")
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--delta", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        serve(args, sys.stdin, sys.stdout)
    except Exception as exc:  # reported to bench, which says what to do about it
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
