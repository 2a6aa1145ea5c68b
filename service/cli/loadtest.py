"""``loadtest``: drive a running service (or one it starts) and print req/s and latencies.

Every run measures ``/healthz`` first, as the reference for what the framework alone can do
on this machine at this moment, then the chosen query phases with the same connections:
``fresh`` (new noise per request, random seeds, charged), ``replay`` (stored releases),
``mixed`` (``--replay-fraction`` of replays) and ``batch`` (``POST /v1/ppr/batch`` with
``--batch-size`` random seeds, ``--batch-concurrency`` calls in flight, each allowed
``--batch-timeout`` seconds; reported in seeds/s, counting the calls that finished within the
phase). The load runs against a service account made for the run in
the ledger at ``--database-url``, with a cap no run reaches; a ``--key`` of your own needs a
cap as large (a run charges thousands of queries: ``accounts create --type service --cap 1000``).
``--mechanism`` names the ranking every request asks for (default: the server's); the
count rankings and ``blended`` exist in ``--mode personalized`` only, where each answer is
charged to the seed user's account: with ``--start`` and no ``--key`` the run's account may
create those accounts (its server is started with ``PPR_CREATE_SEED_ACCOUNTS=true``).
After the table it prints each phase's answers by status (and error code); a refused key
(401, 403, 429) is named with its code, and any error makes the exit status 1. With ``--start``
the run first waits (at most ``--table-timeout`` seconds, saying so) while the server builds
its prefix table, so fresh queries are measured in the steady state.

Examples::

    python -m service loadtest --start --graph edges.txt.gz
    python -m service loadtest --start --workers 2 --port 8601 \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/ppr \\
        --redis-url redis://127.0.0.1:6379/0 --graph edges.txt.gz
    python -m service loadtest --start --graph edges.txt.gz --mode personalized \\
        --mechanism blended --phases healthz,fresh
    python -m service loadtest --url http://127.0.0.1:8000 --key ppr_... --phases healthz,fresh
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from service.cli.arg_types import open_unit_float, positive_float, positive_int
from service.mechanisms.registry import RankingMechanism


def _phases(text: str) -> tuple[str, ...]:
    from service.loadtest.workload import PHASES

    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(PHASES)}; got {text!r}"
        )
    return names


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "loadtest",
        help="HTTP load test: req/s and p50/p90/p99 against /healthz in the same run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = parser.add_argument_group("target")
    target.add_argument("--url", help="base URL of a running service (default: --start)")
    target.add_argument("--start", action="store_true",
                        help="start `serve` on 127.0.0.1:PORT, stop it after")  # fmt: skip
    target.add_argument("--port", type=positive_int, default=8601, help="port for --start")
    target.add_argument("--workers", type=positive_int, default=2, help="workers for --start")
    target.add_argument("--graph", type=Path, metavar="FILE",
                        help="edge-list file the server loads (default: PPR_GRAPH_PATH, else "
                        "the demo graph); the seeds are drawn from it")  # fmt: skip
    target.add_argument("--database-url",
                        help="ledger URL (default: PPR_DATABASE_URL; with --start and none "
                        "given, a fresh SQLite file)")  # fmt: skip
    target.add_argument("--redis-url", help="Redis URL for --start (default: PPR_REDIS_URL)")
    target.add_argument("--key", help="API key of a service account (default: create one)")
    target.add_argument("--table-timeout", type=float, default=600.0,
                        help="with --start: longest wait for the server's prefix table while "
                        "it is built, before the phases (default 600 s; 0: no wait)")  # fmt: skip
    load = parser.add_argument_group("load")
    load.add_argument("--phases", type=_phases, default=("healthz", "fresh", "replay"),
                      help="comma-separated: healthz,fresh,replay,mixed,batch "
                      "(default healthz,fresh,replay)")  # fmt: skip
    load.add_argument("--concurrency", "-c", type=positive_int, default=32,
                      help="open connections (default 32)")  # fmt: skip
    load.add_argument("--duration", "-d", type=positive_float, default=10.0,
                      help="seconds per phase (default 10)")  # fmt: skip
    load.add_argument("--warmup", type=float, default=3.0,
                      help="unreported seconds before each query phase (default 3)")  # fmt: skip
    load.add_argument("--seeds", type=positive_int,
                      help="distinct random seeds fresh and batch requests draw from "
                      "(default: every node of the graph)")  # fmt: skip
    load.add_argument("--replay-seeds", type=positive_int, default=100,
                      help="stored releases replays draw from (default 100)")  # fmt: skip
    load.add_argument("--replay-fraction", type=open_unit_float, default=0.5,
                      help="share of replays in the mixed phase (default 0.5)")  # fmt: skip
    load.add_argument("--batch-size", type=positive_int, default=200,
                      help="seeds per batch call (default 200)")  # fmt: skip
    load.add_argument("--batch-concurrency", type=positive_int, default=4,
                      help="batch calls in flight at once in the batch phase (default 4: each "
                      "carries --batch-size seeds)")  # fmt: skip
    load.add_argument("--batch-timeout", type=positive_float, default=300.0,
                      help="seconds one batch call may take before it counts as a timeout "
                      "(default 300)")  # fmt: skip
    load.add_argument("--mode", choices=("edge", "personalized"), default="edge",
                      help="privacy model of the ranking requests (default edge); "
                      "personalized charges the seed users' accounts: with --start and no "
                      "--key the run's service account may create them and its server allows "
                      "it (PPR_CREATE_SEED_ACCOUNTS)")  # fmt: skip
    load.add_argument("--mechanism", choices=[m.value for m in RankingMechanism], default=None,
                      help="the ranking every fresh, replayed and batch request asks for (the "
                      "API's mechanism parameter): " + ", ".join(m.value for m in
                      RankingMechanism) + "; the last three in personalized mode only "
                      "(default: the server's PPR_DEFAULT_MECHANISM for the mode)")  # fmt: skip
    load.add_argument("--epsilon", type=positive_float, default=0.1)
    load.add_argument("--k", type=positive_int, default=20)
    load.add_argument("--driver", choices=("auto", "wrk", "httpx"), default="auto",
                      help="wrk (C, Lua-scripted; the default when installed) or an asyncio "
                      "httpx generator")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from service.config import MechanismSettings, Settings
    from service.errors import InvalidParameter
    from service.graph.configured import load_configured_graph
    from service.loadtest.cpu_share import describe
    from service.loadtest.report import (
        has_errors,
        reference_rps,
        refusals,
        status_breakdown,
        table,
    )
    from service.loadtest.run import RunPlan, run_phases, sample_seeds
    from service.loadtest.server import (
        admin_key,
        check_key,
        served,
        service_account_key,
        wait_for_prefix_table,
    )
    from service.loadtest.wrk_driver import wrk_available
    from service.mechanisms.registry import resolve_mechanism
    from service.privacy.modes import Mode

    if args.url is None and not args.start:
        raise InvalidParameter("url", "give --url of a running service, or --start")
    if args.url is not None and args.start:
        raise InvalidParameter("start", "--start and --url exclude each other")
    if args.key is None and args.mode != "edge" and not args.start:
        raise InvalidParameter(
            "mode", "personalized load on a running service needs --key of a scoped service account"
        )
    if args.mechanism is not None:  # 422 from every request otherwise: refused before the run
        resolve_mechanism(args.mechanism, Mode(args.mode), default=args.mechanism)
    settings = Settings()
    graph_path = args.graph if args.graph is not None else settings.graph_path
    if graph_path is not None and not Path(graph_path).is_file():
        raise InvalidParameter("graph", f"{graph_path} is not a readable file")
    driver = args.driver
    if driver == "auto":
        driver = "wrk" if wrk_available() else "httpx"
    graph = load_configured_graph(None if graph_path is None else Path(graph_path).resolve())
    rng = random.Random()
    all_ids = graph.external_ids(np.arange(graph.n))
    seeds = sample_seeds(all_ids, args.seeds, rng)
    replay_seeds = sample_seeds(list(seeds), args.replay_seeds, rng)
    plan = RunPlan(
        phases=args.phases,
        concurrency=args.concurrency,
        seconds=args.duration,
        warmup_seconds=max(0.0, args.warmup),
        seeds=seeds,
        replay_seeds=replay_seeds,
        mixed_replay_fraction=args.replay_fraction,
        mode=args.mode,
        mechanism=args.mechanism,
        epsilon=args.epsilon,
        k=args.k,
        batch_size=args.batch_size,
        driver=driver,
        batch_concurrency=args.batch_concurrency,
        batch_timeout_seconds=args.batch_timeout,
    )
    personalized = args.mode == "personalized" and args.key is None
    table_status = "not checked"  # a server the run did not start
    with ExitStack() as stack:
        database_url = args.database_url or settings.database_url
        if args.start:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ppr-load-")))
            if args.database_url is None and "PPR_DATABASE_URL" not in os.environ:
                database_url = f"sqlite:///{tmp / 'ledger.db'}"
            log_path = tmp / "server.log"
            print(f"starting serve --workers {args.workers} on :{args.port} ...", file=sys.stderr)
            base_url = stack.enter_context(
                served(
                    port=args.port,
                    workers=args.workers,
                    graph=None if graph_path is None else Path(graph_path).resolve(),
                    database_url=database_url,
                    redis_url=args.redis_url or settings.redis_url,
                    log_path=log_path,
                    # personalized load charges seed users: the run's key may create them
                    extra_env={"PPR_CREATE_SEED_ACCOUNTS": "true"} if personalized else None,
                )
            )
            if args.table_timeout > 0:
                table_status = wait_for_prefix_table(
                    base_url, admin_key(database_url), workers=args.workers,
                    timeout_s=args.table_timeout, say=lambda text: print(text, file=sys.stderr),
                )  # fmt: skip
        else:
            base_url = args.url.rstrip("/")
        key = args.key or service_account_key(
            database_url, delta=MechanismSettings().account_delta, personalized=personalized
        )

        if args.key is not None:
            check_key(base_url, key, say=lambda text: print(text, file=sys.stderr))

        def progress(result: Any) -> None:
            print(f"  {result.rps:,.1f} req/s; {status_breakdown(result)}", file=sys.stderr)

        results = run_phases(base_url, plan, key, on_result=progress)
    ref = reference_rps(results)
    if args.json:
        out = {
            "graph": {"nodes": graph.n, "edges": graph.m, "source": str(graph_path or "demo")},
            "driver": driver,
            "mode": args.mode,
            "mechanism": args.mechanism,
            "prefix_table": table_status,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "phases": [r.to_dict(ref) for r in results],
        }
        print(json.dumps(out, indent=2))
    else:
        print(
            f"graph: {graph.n:,} nodes, {graph.m:,} edges; driver {driver}; "
            f"{args.concurrency} connections; {args.duration:g} s per phase; mode {args.mode}, "
            f"mechanism {args.mechanism or 'default'}, epsilon {args.epsilon:g}, k {args.k}; "
            f"prefix table {table_status}"
        )
        print(table(results))
        print("answers by status:")
        for result in results:
            print(f"  {status_breakdown(result)}")
        print("CPU per request over each phase (from /proc):")
        for result in results:
            print(f"  {result.phase} phase: {describe(result.cpu_ms_per_request)}")
    for line in refusals(results, personalized=args.mode == "personalized"):
        print(f"error [key_refused]: {line}", file=sys.stderr)
    if has_errors(results):
        print(
            "loadtest: some requests failed (see the answers by status above, or the phases' "
            "statuses and error_codes in --json)",
            file=sys.stderr,
        )
        return 1
    return 0
