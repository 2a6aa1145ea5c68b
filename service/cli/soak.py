"""``soak``: minutes of steady load on ``serve --workers N``; errors, worker memory, ledger verify.

It starts ``serve`` on 127.0.0.1 with the ledger and Redis given, measures the throughput of
a mixed workload (fresh charged queries and replays, ``--replay-fraction``) with a closed
loop of ``--concurrency`` connections, then loads the service open-loop at
``--load-fraction`` of that throughput for ``--minutes``. Every ``--interval`` seconds it
prints the requests sent, errors, requests that could not start on time, p50/p99 and the RSS
of every worker. At the end the server is stopped and ``ledger verify`` runs on the ledger.
Exit status 1 if any request failed or the ledger does not verify. Not part of the test
suite (it runs for minutes); it sends traffic to 127.0.0.1 only and stops by itself.

Example (PostgreSQL + Redis, 2 workers)::

    createdb -h 127.0.0.1 -U postgres ppr_soak
    python -m service soak --minutes 10 --workers 2 \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/ppr_soak \\
        --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from service.cli import arg_types
from service.cli.arg_types import open_unit_float, positive_float, positive_int


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "soak",
        help="minutes of load at a fraction of measured throughput; memory per worker, verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=positive_float, default=10.0,
                        help="length of the steady load (default 10)")  # fmt: skip
    parser.add_argument("--load-fraction", type=open_unit_float, default=0.8,
                        help="share of the measured throughput to send (default 0.8)")  # fmt: skip
    parser.add_argument("--measure-seconds", type=positive_float, default=30.0,
                        help="closed-loop measurement before the soak (default 30)")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="closed-loop warm-up before the measurement (default 5)")  # fmt: skip
    parser.add_argument("--concurrency", type=positive_int, default=16,
                        help="connections of the throughput measurement (default 16)")  # fmt: skip
    parser.add_argument("--interval", type=positive_float, default=60.0,
                        help="seconds between report lines (default 60)")  # fmt: skip
    parser.add_argument("--workers", type=positive_int, default=2, help="serve --workers")
    parser.add_argument("--port", type=arg_types.port, default=8602, help="port on 127.0.0.1")
    parser.add_argument("--graph", type=Path, metavar="FILE",
                        help="edge list (default: PPR_GRAPH_PATH, else demo graph)")  # fmt: skip
    parser.add_argument("--database-url", type=arg_types.database_url,
                        help="ledger (default: PPR_DATABASE_URL); the soak is meant for "
                        "PostgreSQL")  # fmt: skip
    parser.add_argument("--redis-url", type=arg_types.redis_url,
                        help="Redis (default: PPR_REDIS_URL)")  # fmt: skip
    parser.add_argument("--replay-fraction", type=open_unit_float, default=0.5,
                        help="share of replays among the queries (default 0.5)")  # fmt: skip
    parser.add_argument("--epsilon", type=positive_float, default=0.1)
    parser.add_argument("--k", type=positive_int, default=20)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from service.config import MechanismSettings, Settings
    from service.errors import InvalidParameter
    from service.graph.configured import load_configured_graph
    from service.ledger.ledger import Ledger
    from service.loadtest.httpx_driver import run_httpx
    from service.loadtest.report import status_breakdown
    from service.loadtest.run import RunPlan, sample_seeds, store_replay_releases, workloads
    from service.loadtest.server import served_process, service_account_key
    from service.loadtest.soak import INTERVAL_HEADER, interval_line, run_soak, summary

    settings = Settings()
    graph_path = args.graph if args.graph is not None else settings.graph_path
    if graph_path is not None and not Path(graph_path).is_file():
        raise InvalidParameter("graph", f"{graph_path} is not a readable file")
    graph_path = None if graph_path is None else Path(graph_path).resolve()
    database_url = args.database_url or settings.database_url
    redis_url = args.redis_url or settings.redis_url
    graph = load_configured_graph(graph_path)
    rng = random.Random()
    seeds = sample_seeds(graph.external_ids(np.arange(graph.n)), None, rng)
    plan = RunPlan(
        phases=("mixed",), concurrency=args.concurrency, seconds=args.measure_seconds,
        warmup_seconds=0.0, seeds=seeds, replay_seeds=sample_seeds(list(seeds), 100, rng),
        mixed_replay_fraction=args.replay_fraction, mode="edge", epsilon=args.epsilon,
        k=args.k, batch_size=1, driver="httpx",
    )  # fmt: skip
    seconds = args.minutes * 60.0
    print(
        f"soak: serve --workers {args.workers} on 127.0.0.1:{args.port}, ledger "
        f"{_shown(database_url)}, redis {_shown(redis_url) if redis_url else 'none'}, graph "
        f"{graph.n:,} nodes / {graph.m:,} edges; {args.minutes:g} min at "
        f"{args.load_fraction:.0%} of measured throughput; in-process prefix cache up to "
        f"{settings.prefix_cache_bytes / 2**20:.0f} MiB for all workers together "
        f"(PPR_PREFIX_CACHE_BYTES: "
        f"it fills as new seeds are queried, so RSS grows by up to that much before any leak)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ppr-soak-") as tmp:
        log_path = Path(tmp) / "server.log"
        with served_process(
            port=args.port, workers=args.workers, graph=graph_path, database_url=database_url,
            redis_url=redis_url, log_path=log_path,
        ) as (base_url, proc):  # fmt: skip
            key = service_account_key(database_url, delta=MechanismSettings().account_delta)
            (workload,) = workloads(plan, key)
            store_replay_releases(base_url, workload)
            if args.warmup > 0:
                run_httpx(base_url, workload, concurrency=args.concurrency, seconds=args.warmup)
            measured = run_httpx(
                base_url, workload, concurrency=args.concurrency, seconds=args.measure_seconds
            )
            rate = args.load_fraction * measured.rps
            print(
                f"measured: {measured.rps:.1f} req/s with {args.concurrency} connections "
                f"(p50 {measured.p50_ms:.1f} ms, p99 {measured.p99_ms:.1f} ms, errors "
                f"{measured.errors}); soak at {rate:.1f} req/s"
                + (
                    f"\nthe measurement's errors: {status_breakdown(measured)}"
                    if measured.errors
                    else ""
                ),
                flush=True,
            )
            if rate <= 0:
                raise InvalidParameter("load_fraction", "the measured throughput is zero")
            print(INTERVAL_HEADER, flush=True)
            result = run_soak(
                base_url, workload, rate=rate, seconds=seconds, interval_s=args.interval,
                server_pid=proc.pid,
                on_interval=lambda interval, _: print(interval_line(interval), flush=True),
            )  # fmt: skip
        ledger = Ledger.from_url(database_url)
        try:
            report = ledger.reports.verify()
        finally:
            ledger.dispose()
    print(summary(result))
    admitted = report.admitted_without_release.get("count", 0)
    print(
        f"ledger verify: accounts {report.accounts_checked}, charges {report.charges_checked}, "
        f"mismatches {len(report.mismatches)}, admitted without release {admitted}: "
        f"{'ledger OK' if report.ok else 'ledger MISMATCH'}"
    )
    failed = result.errors > 0 or measured.errors > 0 or not report.ok
    if failed:
        print("soak FAILED", file=sys.stderr)
    return 1 if failed else 0


def _shown(url: str) -> str:
    from sqlalchemy import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]
