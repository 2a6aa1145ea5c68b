"""``evaluate --task synthetic``: the synthetic-graph generators on the PrivDPR paper's metrics.

Prints one row per (method, epsilon) with means and 95% t-interval half-widths over the runs
(service.evaluation.synthetic says how each metric is computed). Progress goes to stderr;
``--json`` prints the rows as a JSON list on stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from service.cli.common import print_json, print_table
from service.errors import InvalidParameter
from service.evaluation.options import SYNTHETIC_METHODS

if TYPE_CHECKING:
    import numpy as np

    from service.graph.model import Graph

_HEADERS = {
    "triangles_mre": "TC MRE",
    "wedges_mre": "WC MRE",
    "claws_mre": "CC MRE",
    "rede_mre": "REDE MRE",
    "cpl_mre": "CPL MRE",
    "diameter_mre": "diam MRE",
    "lcc_mre": "LCC MRE",
    "ks": "KS",
    "auc": "AUC",
    "micro_f1": "Micro-F1",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--task synthetic")
    group.add_argument("--runs", type=int, default=5, help="runs per cell (synthetic task)")
    group.add_argument("--methods", dest="synthetic_methods", nargs="+",
                       choices=SYNTHETIC_METHODS, default=list(SYNTHETIC_METHODS), metavar="M",
                       help=f"synthetic task: any of {', '.join(SYNTHETIC_METHODS)}")  # fmt: skip
    group.add_argument("--privdpr-epochs", type=int, default=None,
                       help="PrivDPR's epochs (default: the paper's 5)")  # fmt: skip


def read_labels(path: Path, graph: Graph) -> np.ndarray:
    """Integer class per node (-1 where the file has none)."""
    import numpy as np

    labels = np.full(graph.n, -1, dtype=np.int64)
    classes: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidParameter("labels", f"cannot read the labels file {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2:
            raise InvalidParameter("labels", f"{path}:{number}: expected 'node label'")
        if graph.has_node(fields[0]):
            labels[graph.index_of(fields[0])] = classes.setdefault(fields[1], len(classes))
    if np.count_nonzero(labels >= 0) < 10:
        raise InvalidParameter("labels", f"{path} labels fewer than 10 of the graph's nodes")
    return labels


def _cell(mean: float | None, half: float | None) -> str:
    if mean is None or math.isnan(mean):
        return "n/a"
    if half is None or math.isnan(half):
        return f"{mean:.4f}"
    return f"{mean:.4f} ± {half:.4f}"


def run_synthetic(args: argparse.Namespace, graph: Graph) -> int:
    import numpy as np

    from service.evaluation.synthetic import METRICS, SyntheticSettings, evaluate_synthetic

    if args.runs < 1:
        raise InvalidParameter("runs", "--runs must be >= 1")
    settings = SyntheticSettings()
    if args.privdpr_epochs is not None:
        if args.privdpr_epochs < 1:
            raise InvalidParameter("privdpr_epochs", "--privdpr-epochs must be >= 1")
        settings = replace(settings, privdpr=replace(settings.privdpr, epochs=args.privdpr_epochs))
    labels = read_labels(Path(args.labels), graph) if args.labels is not None else None
    u, v = graph.edge_arrays()
    cells = evaluate_synthetic(
        (u.astype(np.int64), v.astype(np.int64)),
        graph.n,
        args.epsilon,
        runs=args.runs,
        methods=args.synthetic_methods,
        settings=settings,
        rng=np.random.default_rng(args.sample_seed),
        labels=labels,
        progress=lambda text: print(f"[evaluate] {text}", file=sys.stderr, flush=True),
    )
    rows = [c.to_dict() for c in cells]
    if args.json:
        print_json(rows)
        return 0
    metrics = [m for m in METRICS if labels is not None or m != "micro_f1"]
    print_table(
        ["method", "unit", "eps", *(_HEADERS[m] for m in metrics), "runs"],
        [
            [
                r["method"],
                {"privdpr": "node", "real": "-"}.get(r["method"], "edge"),
                "-" if r["method"] == "real" else f"{r['epsilon']:g}",
                *(_cell(r[m], r[f"{m}_ci"]) for m in metrics),
                str(r["runs"]),
            ]
            for r in rows
        ],
    )
    print(
        "(mean ± half-width of the 95% t-interval over runs; unit: the privacy unit, node-level "
        "(eps, delta) DP for privdpr, edge-level pure eps-DP for the others; AUC: common "
        "neighbours in the synthetic graph, ties broken by the degree sum)"
    )
    return 0
