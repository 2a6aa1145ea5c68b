"""Pieces shared by the engine commands: graph argument, mechanism arguments, JSON output.

Every command module is imported to build the parser (``python -m service --help`` included),
so the modules import only argparse and light modules at the top; what a command needs to run
(numpy, the engine, the ledger, the settings) is imported by its handler.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.cli.arg_types import open_unit_float, positive_float, positive_int
from service.privacy.modes import Mode

if TYPE_CHECKING:
    from service.graph.model import Graph
    from service.ledger.ledger import Ledger


def add_graph_argument(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--graph",
        type=Path,
        required=required,
        metavar="FILE",
        help="edge-list file (plain or gzip)" + ("" if required else "; default: the demo graph"),
    )


def add_mechanism_arguments(parser: argparse.ArgumentParser, *, eta: float = 1e-7) -> None:
    parser.add_argument("--beta", type=open_unit_float, default=0.8, help="diffusion weight")
    parser.add_argument("--steps", type=positive_int, default=100, help="diffusion steps K")
    parser.add_argument("--eta", type=positive_float, default=eta, help="threshold per degree")
    parser.add_argument(
        "--mode", type=Mode, choices=list(Mode), default=Mode.PERSONALIZED, help="privacy model"
    )


def load_graph(path: Path | None) -> Graph:
    """The graph at ``path``, or the built-in demo graph."""
    from service.graph.configured import load_configured_graph

    return load_configured_graph(path)


def served_graph_and_cap(path: Path, settings: Any, ledger: Ledger) -> tuple[Graph, Any]:
    """The graph a graph-wide release (``synthesize``, ``embeddings release``) is made from, as
    the service serves it: its node list, its public bounds and the public version id the ledger
    records, so the release composes with that version's other releases in the exposure; and
    the graph-wide cap it is admitted against (None when no cap is set)."""
    from service.graph.configured import load_configured_graph
    from service.ledger import GraphCap
    from service.serving.graph_identity import as_served

    graph = as_served(
        load_configured_graph(path, None, settings.nodes_path),
        ledger.graph_versions,
        max_degree_bound=settings.max_degree_bound,
        edge_count_bound=settings.edge_count_bound,
    )
    cap = None
    if settings.graph_cap_epsilon is not None:
        delta = settings.exposure_delta or ledger.reports.smallest_delta()
        cap = GraphCap(settings.graph_cap_epsilon, delta, max_charge=None)
    return graph, cap


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (as the API writes them: an
    epsilon no delta left to certify is infinite, and JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def print_json(payload: Any) -> None:
    json.dump(_finite(payload), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
