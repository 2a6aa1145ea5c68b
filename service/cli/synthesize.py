"""``synthesize``: publish a private synthetic graph as an edge list ``serve --graph`` loads.

Every run is ONE graph-wide release: admitted against the graph-wide cap (PPR_GRAPH_CAP_EPSILON),
charged once to the graph-wide exposure, and recorded in the ledger with its method, parameters,
privacy unit and the file's SHA-256 (service.synthetic.release). ``privdpr`` is node-level
(eps, delta)-DP; ``communities`` is edge-level pure eps-DP; ``chung_lu`` is post-processing of
the service's degree release and charges nothing of its own. Bad input (an epsilon or cap that
does not allow the run, parameters out of range, an output path that cannot be written) is one
line and exit 2, with nothing charged and no file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from service.cli.arg_types import open_unit_float, positive_float, positive_int
from service.cli.db import add_database_argument, database_url


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "synthesize",
        help="publish a private synthetic graph (one graph-wide release)",
        description="Write a differentially private synthetic edge list of the graph, charged "
        "once to the graph-wide exposure and recorded in the ledger (docs/synthetic.md).",
    )
    parser.add_argument("--graph", type=Path, default=None, metavar="FILE",
                        help="edge-list file (default: PPR_GRAPH_PATH)")  # fmt: skip
    parser.add_argument("--method", choices=("communities", "privdpr", "chung_lu"),
                        default="communities",
                        help="communities (edge-level DP, ours), privdpr (node-level DP), "
                        "chung_lu (free: the service's degree release)")  # fmt: skip
    parser.add_argument("--epsilon", type=positive_float, default=None,
                        help="the run's epsilon (not for chung_lu)")  # fmt: skip
    parser.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="edge list to write"
    )
    add_database_argument(parser)
    privdpr = parser.add_argument_group("privdpr")
    privdpr.add_argument("--delta", type=open_unit_float, default=1e-5, help="PrivDPR's delta")
    privdpr.add_argument("--epochs", type=positive_int, default=5, help="PrivDPR's epochs")
    privdpr.add_argument("--score-rounds", type=positive_int, default=5,
                         help="PrivDPR's score samplings (post-processing)")  # fmt: skip
    communities = parser.add_argument_group("communities")
    communities.add_argument("--groups", type=positive_int, default=6, help="number of groups")
    communities.add_argument("--rounds", type=positive_int, default=5, help="group-count rounds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from service.cli.common import served_graph_and_cap
    from service.config import Settings
    from service.errors import InvalidParameter
    from service.ledger import Ledger
    from service.mechanisms.randomness import fresh_generator
    from service.synthetic.release import synthesis_request, synthesize_release

    settings = Settings()
    request = synthesis_request(
        args.method, args.epsilon, popular_epsilon=settings.popular_epsilon, delta=args.delta,
        epochs=args.epochs, score_rounds=args.score_rounds, groups=args.groups,
        rounds=args.rounds, flags=True,
    )  # fmt: skip
    path = args.graph if args.graph is not None else settings.graph_path
    if path is None:
        raise InvalidParameter("graph", "give --graph FILE or set PPR_GRAPH_PATH")
    ledger = Ledger.from_url(database_url(args), auto_migrate=False)
    try:
        graph, cap = served_graph_and_cap(path, settings, ledger)

        def degrees() -> tuple[Any, str]:
            from service.serving.rankings import DegreeReleases, degree_release_name

            releases = DegreeReleases(ledger, settings.popular_epsilon)
            got = releases.get(graph, cap)
            return got.values, degree_release_name(releases.plan.scale)

        bar = tqdm(
            total=None,
            unit="step",
            desc=args.method,
            disable=args.no_progress or args.method != "privdpr",
        )

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
            release = synthesize_release(
                ledger,
                graph,
                request,
                args.out,
                cap=cap,
                degrees=degrees,
                progress=progress,
                rng_factory=fresh_generator,
                heartbeat_seconds=settings.release_heartbeat_seconds,
            )
        finally:
            bar.close()
    finally:
        ledger.dispose()
    print(
        f"wrote {release.edges} edges on {release.nodes} nodes to {args.out}: {release.method}, "
        f"{release.privacy_unit}-level DP, epsilon {release.epsilon:g}"
        + (f", delta {release.delta:g}" if release.delta else "")
        + f"; ledger release {release.release_name}, sha256 {release.sha256[:16]}"
        + (f" ({release.note})" if release.note else "")
    )
    return 0
