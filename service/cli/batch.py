"""``batch``: precompute private recommendations for many users, on a process pool or Ray.

Every seed is admitted, charged and released on the API's own path, exactly once per run id
and graph version: a rerun with the same ``--run-id`` replays what was answered (free) and
answers the rest. Who is charged: in personalized mode each seed user's own account; in edge
mode the ``--service-account``. Who asks (the principal on each charge): the service account
when one is named (its modes, seed-account right and 24-hour quota apply), otherwise each seed
user itself, on the operator's authority, with the run id on every charge's request id and the
run in the audit log (``batch.start`` / ``batch.finish``).

What each seed gets and is charged for: the ranking ``--mechanism`` names, by default the one a
``GET /v1/ppr/{node}`` without ``mechanism`` gets (``PPR_DEFAULT_MECHANISM``:
``friends_of_friends`` unless set; in edge mode a personalized-only default becomes
``noisy_diffusion``). The summary's first line names it. With ``--output embeddings`` each seed
gets a DP-IE embedding instead (``dp_instant_embedding``, dimension ``--k``, ``--sigma``),
answered and charged exactly as ``GET /v1/embeddings/{node}``: a Parquet column ``embedding`` of
fixed-size lists, a Redis field ``embedding`` (JSON array) under ``ppr:emb:<user>``, or a
``float8[]`` column of table ``ppr_embeddings``, with the release's metadata on every row.

A Parquet output is written under a temporary name beside it, readable by its owner only, and
removed if the run stops (an error, Ctrl-C, SIGTERM, SIGHUP); a driver killed outright leaves
it, and the next run with the same ``--run-id`` removes it. Pool processes end with their driver.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from service.cli.arg_types import database_url, positive_float, positive_int, redis_url
from service.cli.common import print_json
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode


def _retries(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be in [0, 100], got {text}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="precompute private recommendations for many users",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    seeds = parser.add_mutually_exclusive_group(required=True)
    seeds.add_argument(
        "--accounts",
        type=Path,
        metavar="FILE",
        help="node ids, one per line ('#' comments allowed)",
    )
    seeds.add_argument("--all", action="store_true", help="every user account in the ledger")
    parser.add_argument(
        "--output",
        choices=("rankings", "embeddings"),
        default="rankings",
        help="what each seed gets: a ranking (default) or a DP-IE embedding",
    )
    parser.add_argument(
        "--k",
        type=positive_int,
        help="results per user (default PPR_DEFAULT_K); with --output embeddings the "
        "dimension (default PPR_EMBEDDING_DEFAULT_K)",
    )
    parser.add_argument(
        "--sigma",
        type=positive_float,
        help="--output embeddings: PushFlowCap's sigma (default PPR_EMBEDDING_DEFAULT_SIGMA)",
    )
    parser.add_argument(
        "--epsilon", type=positive_float, help="epsilon per user (default PPR_DEFAULT_EPSILON)"
    )
    parser.add_argument(
        "--mode",
        type=Mode,
        choices=list(Mode),
        default=Mode.PERSONALIZED,
        help="privacy model (default personalized)",
    )
    parser.add_argument(
        "--mechanism",
        choices=[m.value for m in RankingMechanism],
        metavar="NAME",
        help="one of " + ", ".join(m.value for m in RankingMechanism) + "; the ranking each "
        "seed gets and is charged for (default: what a GET without 'mechanism' gets: "
        "PPR_DEFAULT_MECHANISM, friends_of_friends unless set, noisy_diffusion in edge mode)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="SINK",
        help="FILE.parquet | redis://HOST:PORT/DB[?prefix=P&ttl=S] | "
        "postgresql+psycopg://USER@HOST/DB[?table=NAME]",
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="a process pool here (default) or Ray",
    )
    parser.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray: cluster to join ('auto': the one running here); default: start a local instance",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        help="local: processes; ray without --address: the local instance's "
        "CPUs (default: this machine's cores)",
    )
    parser.add_argument(
        "--block-size", type=positive_int, default=64, help="seeds per task (default 64)"
    )
    parser.add_argument(
        "--retries", type=_retries, default=3, help="attempts after a block fails (default 3)"
    )
    parser.add_argument(
        "--graph",
        type=Path,
        metavar="FILE",
        help="edge-list file (default PPR_GRAPH_PATH, else the demo graph)",
    )
    parser.add_argument(
        "--run-id",
        metavar="NAME",
        help="names the run; rerun with the same id to resume (default: new)",
    )
    parser.add_argument(
        "--service-account",
        type=positive_int,
        metavar="ID",
        help="the principal (required in edge mode, where it is charged)",
    )
    parser.add_argument(
        "--create-missing-accounts",
        action="store_true",
        help="create listed users' accounts with the default cap (audited)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="draw anew even where an identical release is stored (charges)",
    )
    parser.add_argument(
        "--refresh",
        default=None,
        metavar="POLICY",
        help="on_new_version (default: replay a seed's stored answer within a graph version), "
        "max_age:<n><s|m|h|d|w> (also draw once it is that old, e.g. max_age:7d) or always",
    )
    parser.add_argument(
        "--exclude-neighbors",
        action="store_true",
        help="drop each seed's neighbours (personalized mode only)",
    )
    parser.add_argument("--database-url", type=database_url, help="SQLAlchemy URL of the ledger")
    parser.add_argument(
        "--redis-url",
        type=redis_url,
        help="Redis URL of the service's caches (default PPR_REDIS_URL)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from service.batch.lifetime import unwind_on_termination
    from service.batch.run import BatchOptions, run_batch, summary_lines
    from service.config import Settings, settings_error
    from service.errors import InvalidParameter

    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    if args.redis_url:
        overrides["redis_url"] = args.redis_url
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise settings_error(exc) from None
    graph = args.graph if args.graph is not None else settings.graph_path
    if graph is not None and not graph.is_file():
        name = "--graph" if args.graph is not None else "PPR_GRAPH_PATH"
        raise InvalidParameter(name, f"{graph} is not a readable file")
    if args.address is not None and args.engine != "ray":
        raise InvalidParameter("--address", "joins a Ray cluster: use it with --engine ray")
    options = BatchOptions(
        sink=args.out,
        mode=args.mode,
        epsilon=args.epsilon,
        mechanism=args.mechanism,
        k=args.k,
        accounts_file=args.accounts,
        all_accounts=args.all,
        graph_path=graph,
        run_id=args.run_id,
        service_account_id=args.service_account,
        create_missing_accounts=args.create_missing_accounts,
        fresh=args.fresh,
        refresh=args.refresh,
        exclude_neighbors=args.exclude_neighbors,
        engine=args.engine,
        address=args.address,
        workers=args.workers,
        block_size=args.block_size,
        retries=args.retries,
        settings=settings,
        progress=False if args.no_progress else None,
        output=args.output,
        sigma=args.sigma,
    )
    with unwind_on_termination():  # SIGTERM/SIGHUP: temporary output removed, pool stopped
        summary = run_batch(options)
    if args.json:
        print_json(summary.to_dict())
    else:
        print("\n".join(summary_lines(summary)))
    return 1 if summary.failed else 0
