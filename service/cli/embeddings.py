"""``embeddings release``: edge-mode DP-IE of every node as ONE graph-wide release, with its
nearest-neighbour index (what ``GET /v1/embeddings/similar/{node}`` serves).

The run is admitted against the graph-wide cap (PPR_GRAPH_CAP_EPSILON) and charged once to the
graph-wide exposure: N nodes' embeddings at eps each compose to the N-fold sum of the Laplace
curve (pure N eps), recorded in the ledger with the method, parameters and privacy unit
(service.embeddings.all_node_release). Bad input (an epsilon, k, sigma or node list out of
range, an output directory that cannot be written, a cap the run would pass) is one line and
exit 2, with nothing charged and no file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from service.cli.arg_types import positive_float, positive_int
from service.cli.db import add_database_argument, database_url
from service.embeddings.parameters import DEFAULT_EMBEDDING_SIGMA, DEFAULT_K, EMBEDDING_ROUNDS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "embeddings",
        help="release private node embeddings for a backend (one graph-wide release)",
        description="Private node embeddings as graph-wide releases (docs/embeddings.md).",
    )
    commands = parser.add_subparsers(dest="embeddings_command", metavar="ACTION", required=True)
    release = commands.add_parser(
        "release",
        help="edge-mode DP-IE of every node, charged once to the graph-wide exposure",
        description="Compute edge-mode DP-IE embeddings of every node of the served graph "
        "version (or of --nodes), charge their composition once to the graph-wide exposure, "
        "record the release in the ledger, and write the vectors and their nearest-neighbour "
        "index into --out (the directory PPR_EMBEDDING_RELEASE_DIR names for the server).",
    )
    release.add_argument("--graph", type=Path, default=None, metavar="FILE",
                         help="edge-list file (default: PPR_GRAPH_PATH)")  # fmt: skip
    release.add_argument("--epsilon", type=positive_float, required=True,
                         help="epsilon of EACH node's embedding; the release costs the "
                         "composition over all nodes")  # fmt: skip
    release.add_argument("--k", type=positive_int, default=DEFAULT_K,
                         help=f"dimension (default {DEFAULT_K})")  # fmt: skip
    release.add_argument("--sigma", type=positive_float, default=DEFAULT_EMBEDDING_SIGMA,
                         help="PushFlowCap's sensitivity "
                         f"(default {DEFAULT_EMBEDDING_SIGMA:g})")  # fmt: skip
    release.add_argument("--rounds", type=positive_int, default=EMBEDDING_ROUNDS,
                         help=f"PushFlowCap's rounds R (default {EMBEDDING_ROUNDS})")  # fmt: skip
    release.add_argument("--nodes", type=Path, default=None, metavar="FILE",
                         help="only these nodes, one id a line (default: every node)")  # fmt: skip
    release.add_argument("--out", type=Path, required=True, metavar="DIR",
                         help="existing directory for the vectors, the index and "
                         "current.json")  # fmt: skip
    add_database_argument(release)
    release.add_argument("--no-progress", action="store_true", help="no progress bar")
    release.set_defaults(handler=run_release)


def _node_list(path: Path) -> list[str]:
    from service.errors import InvalidParameter

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameter("nodes", f"cannot read {path}: {exc}") from None
    return [line.strip() for line in lines if line.strip()]


def run_release(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from service.cli.common import served_graph_and_cap
    from service.config import Settings
    from service.embeddings.all_node_release import EmbeddingRequest, release_embeddings
    from service.embeddings.similar import POINTER, RECALL_TARGET
    from service.errors import InvalidParameter
    from service.ledger import Ledger
    from service.mechanisms.randomness import fresh_generator

    settings = Settings()
    request = EmbeddingRequest(
        epsilon=args.epsilon,
        k=args.k,
        sigma=args.sigma,
        rounds=args.rounds,
        nodes=None if args.nodes is None else _node_list(args.nodes),
    )
    path = args.graph if args.graph is not None else settings.graph_path
    if path is None:
        raise InvalidParameter("graph", "give --graph FILE or set PPR_GRAPH_PATH")
    ledger = Ledger.from_url(database_url(args), auto_migrate=False)
    try:
        graph, cap = served_graph_and_cap(path, settings, ledger)
        bar = tqdm(total=None, unit="node", desc="embeddings", disable=args.no_progress)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
            release = release_embeddings(
                ledger, graph, request, args.out, cap=cap, rng_factory=fresh_generator,
                progress=progress, search_ef=settings.similar_ef,
                heartbeat_seconds=settings.release_heartbeat_seconds,
            )  # fmt: skip
        finally:
            bar.close()
    finally:
        ledger.dispose()
    print(
        f"released edge-mode DP-IE of {release.nodes} nodes (k {request.k}, sigma "
        f"{request.sigma:g}, epsilon {release.epsilon_per_node:g} each) to {args.out}: "
        f"charged once to the graph-wide exposure, pure epsilon {release.epsilon:g} "
        f"({release.nodes}-fold composition); ledger release {release.release_name}"
    )
    index = json.loads((args.out / POINTER).read_text())["files"]["index"]
    how = "approximate (HNSW)" if index["recall_at_10"] >= RECALL_TARGET else "exact search"
    print(
        f"index: recall@10 {index['recall_at_10']:.3f} against exact search at ef {index['ef']}"
        f"; similar nodes will be answered by {how}"
    )
    return 0
