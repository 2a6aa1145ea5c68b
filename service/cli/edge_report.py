"""``ledger edge-report``: one edge's per-instance exposure (admin only, on the command line).

Imported only when the command runs (never by ``python -m service`` itself, the server or the
API): the figures are exact functions of the private edges. It prints what the admin asked
for to stdout and logs nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from service.cli.common import print_json, print_table
from service.cli.db import database_url
from service.config import Settings
from service.edge_report.report import edge_report
from service.errors import InvalidParameter
from service.graph.configured import load_configured_graph
from service.ledger.ledger import Ledger


def run(args: argparse.Namespace) -> int:
    u, v = (str(x) for x in args.edge)
    if u == v:
        raise InvalidParameter("--edge", f"an edge joins two distinct nodes, got {u!r} twice")
    if args.delta is not None and not 0 < args.delta < 1:
        raise InvalidParameter("--delta", f"must be in (0, 1), got {args.delta}")
    settings = Settings()
    path: Path | None = args.graph if args.graph is not None else settings.graph_path
    nodes = settings.nodes_path if args.graph is None else args.nodes
    graph = load_configured_graph(path, nodes_path=nodes)
    graph.index_of(u), graph.index_of(v)  # unknown nodes fail before the ledger is read
    ledger = Ledger.from_url(database_url(args), auto_migrate=False)
    try:
        report = edge_report(ledger, graph, u, v, account=args.account, delta=args.delta)
    finally:
        ledger.dispose()
    if args.json:
        print_json(report)
    else:
        _print(report)
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _print(report: dict[str, Any]) -> None:
    u, v = report["edge"]
    where = "in the graph" if report["edge_in_graph"] else "not in the graph (added)"
    scope = f"account {report['account']}" if "account" in report else "graph-wide"
    print(f"edge {u} {v} ({where}); {scope}; delta {report['delta']:.3g}")
    print("per-instance (pDP) figures: confidential, not a DP guarantee, never used to charge")
    rows = [["all", *_cells(report["total"])]]
    rows += [[mode, *_cells(row)] for mode, row in report["by_mode"].items()]
    print_table(["mode", "releases", "per-edge eps", "worst-case eps", "ratio"], rows)
    skipped = report["not_covered"]
    print(
        f"not covered: {skipped['other_mechanisms']} other-mechanism charges, "
        f"{skipped['other_graph_versions']} on other graph versions, "
        f"{skipped['seed_own_edge']} personalized releases to an endpoint (its own edge)"
    )


def _cells(row: dict[str, Any]) -> list[str]:
    return [
        str(row["releases"]), _fmt(row["per_edge_epsilon"]), _fmt(row["worst_case_epsilon"]),
        _fmt(row["ratio"]),
    ]  # fmt: skip
