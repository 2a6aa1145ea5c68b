"""``ledger``: check and repair the budget ledger (``verify``, ``reconcile``, ``exposure``,
``edge-report``).

``verify`` recomputes every account's spend from its append-only charges and refunds and
checks charge states against the stored releases; it exits 1 on any mismatch. ``reconcile``
refunds admitted charges that never got a release (their worker died before storing it, so
nothing was released). ``exposure`` prints the graph-wide composed bound. ``edge-report``
prints one edge's per-instance exposure (admin only, :mod:`service.cli.edge_report`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.cli.arg_types import open_unit_float, positive_int
from service.cli.common import print_json, print_table
from service.cli.db import Handler, add_database_argument, database_url
from service.errors import InvalidParameter

if TYPE_CHECKING:
    from service.ledger.ledger import Ledger


@contextmanager
def _ledger(args: argparse.Namespace) -> Iterator[Ledger]:
    from service.ledger.ledger import Ledger

    ledger = Ledger.from_url(database_url(args), auto_migrate=False)
    try:
        yield ledger
    finally:
        ledger.dispose()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ledger",
        help="verify, reconcile and report on the budget ledger",
        description="Check the ledger against its append-only rows, settle charges whose "
        "worker died, and report the graph-wide exposure.",
    )
    actions = parser.add_subparsers(dest="ledger_action", metavar="ACTION", required=True)

    def action(name: str, text: str, handler: Handler) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
        add_database_argument(sub)
        sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(handler=handler)
        return sub

    action("verify", "recompute every spend and check charge states; exit 1 on a mismatch", _verify)
    reconcile = action(
        "reconcile", "refund admitted charges that have no stored release", _reconcile
    )
    reconcile.add_argument(
        "--older-than",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="only charges older than this; default PPR_RECONCILE_AFTER_SECONDS (60)",
    )
    exposure = action("exposure", "the graph-wide exposure of all accounts together", _exposure)
    exposure.add_argument(
        "--delta", type=open_unit_float, help="delta; default the smallest account delta"
    )
    report = action(
        "edge-report",
        "one edge's per-instance exposure over the noisy-diffusion releases, next to the "
        "worst case (admin only: confidential, not a DP guarantee)",
        _edge_report,
    )
    report.add_argument("--edge", nargs=2, required=True, metavar=("U", "V"), help="node ids")
    report.add_argument(
        "--graph", type=Path, metavar="FILE", help="edge-list file; default PPR_GRAPH_PATH"
    )
    report.add_argument(
        "--nodes", type=Path, metavar="FILE", help="node list the graph was served with"
    )
    report.add_argument(
        "--account", type=positive_int, metavar="ID", help="only this account's releases"
    )
    report.add_argument(
        "--delta",
        type=open_unit_float,
        help="delta; default the account's, or the smallest account delta graph-wide",
    )


def _edge_report(args: argparse.Namespace) -> int:
    # imported here, never by the module: the per-edge code stays off every serving path
    from service.cli.edge_report import run

    return run(args)


def _verify(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        report = ledger.reports.verify()
    if args.json:
        print_json(report.to_dict())
    else:
        admitted = report.admitted_without_release
        print(
            f"accounts checked: {report.accounts_checked}, charges checked: "
            f"{report.charges_checked}, mismatches: {len(report.mismatches)}"
        )
        by_age = ", ".join(f"{k} {v}" for k, v in admitted.get("by_age", {}).items())
        print(f"admitted without release: {admitted.get('count', 0)} ({by_age})")
        for item in report.mismatches[:50]:
            where = ", ".join(f"{k} {v}" for k, v in item.items() if k not in ("detail",))
            print(f"MISMATCH {where}: {item['detail']}")
        print("ledger OK" if report.ok else "ledger MISMATCH")
    return 0 if report.ok else 1


def _reconcile(args: argparse.Namespace) -> int:
    from service.config import Settings

    older_than = args.older_than
    if older_than is None:
        older_than = Settings().reconcile_after_seconds
    with _ledger(args) as ledger:
        refunded = ledger.settlement.reconcile(older_than_seconds=older_than)
    if args.json:
        print_json({"refunded": len(refunded), "charge_ids": refunded, "older_than": older_than})
    else:
        print(f"refunded {len(refunded)} admitted charge(s) older than {older_than:g} s")
    return 0


def _exposure(args: argparse.Namespace) -> int:
    from service.config import Settings

    settings = Settings()
    delta = args.delta if args.delta is not None else settings.exposure_delta
    if delta is not None and not 0 < delta < 1:
        raise InvalidParameter("--delta", f"must be in (0, 1), got {delta}")
    with _ledger(args) as ledger:
        report = ledger.reports.exposure(delta=delta, cap_epsilon=settings.graph_cap_epsilon)
    if args.json:
        print_json(report.to_dict())
        return 0
    cap = "none" if report.cap_epsilon is None else f"{report.cap_epsilon:g}"
    print(
        f"graph-wide exposure: epsilon {report.epsilon:.6g} at delta {report.delta:.3g} over "
        f"{report.charges} charges and {report.graph_releases} graph releases (cap {cap})"
    )
    print_table(
        ["mode", "epsilon", "charges"],
        [[m, f"{v['epsilon']:.6g}", str(v["charges"])] for m, v in report.by_mode.items()],
    )
    return 0
