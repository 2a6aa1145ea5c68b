"""``serve``: run the HTTP service under uvicorn.

Flags override the ``PPR_*`` environment (they are passed to the workers through it). The
database must be migrated first (``python -m service db upgrade``) unless PPR_AUTO_MIGRATE is
set; ``make serve`` does both for the embedded default.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from service.cli.arg_types import database_url, port, positive_int, redis_url
from service.cli.quickstart import quick_start

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="run the HTTP service", description=__doc__)
    parser.add_argument(
        "--graph", type=Path, metavar="FILE",
        help="edge-list file (default: PPR_GRAPH_PATH, else the demo graph)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes", type=Path, metavar="FILE",
        help="node-list file, one id per line (default: PPR_NODES_PATH; unset: the node set "
        "is derived from the edges and is then public)",
    )  # fmt: skip
    parser.add_argument("--host", help="bind address (default: PPR_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=port, help="port (default: PPR_PORT or 8000)")
    parser.add_argument("--workers", type=positive_int, help="worker processes (default 1)")
    parser.add_argument("--database-url", type=database_url, help="SQLAlchemy URL of the ledger")
    parser.add_argument("--redis-url", type=redis_url,
                        help="Redis URL (default: in-process caches)")  # fmt: skip
    parser.add_argument("--auto-migrate", action="store_true",
                        help="upgrade the ledger's schema at start-up")  # fmt: skip
    parser.set_defaults(handler=run)


_FLAG_NAMES = {
    "PPR_GRAPH_PATH": "--graph",
    "PPR_NODES_PATH": "--nodes",
    "PPR_HOST": "--host",
    "PPR_PORT": "--port",
    "PPR_WORKERS": "--workers",
    "PPR_DATABASE_URL": "--database-url",
    "PPR_REDIS_URL": "--redis-url",
    "PPR_AUTO_MIGRATE": "--auto-migrate",
}


def _flags(args: argparse.Namespace) -> dict[str, str | None]:
    return {
        "PPR_GRAPH_PATH": None if args.graph is None else str(args.graph.resolve()),
        "PPR_NODES_PATH": None if args.nodes is None else str(args.nodes.resolve()),
        "PPR_HOST": args.host,
        "PPR_PORT": None if args.port is None else str(args.port),
        "PPR_WORKERS": None if args.workers is None else str(args.workers),
        "PPR_DATABASE_URL": args.database_url,
        "PPR_REDIS_URL": args.redis_url,
        "PPR_AUTO_MIGRATE": "true" if args.auto_migrate else None,
    }


def _export(args: argparse.Namespace) -> None:
    """Put flags into the environment so every worker process builds the same Settings."""
    for name, value in _flags(args).items():
        if value is not None:
            os.environ[name] = value


def check_graph_inputs(settings: Any) -> None:
    """Load the configured graph once before any worker starts, so that a node list that does
    not cover the edges, or a graph over a public bound, is one line and exit 2 here (a
    GraphLoadError) rather than a worker's failure. With snapshots on, the workers then map
    the snapshot this load wrote."""
    from service.graph.configured import load_configured_graph
    from service.graph.public_bounds import check_public_bounds

    graph = load_configured_graph(
        settings.graph_path, settings.snapshot_directory, settings.nodes_path
    )
    check_public_bounds(
        graph,
        max_degree_bound=settings.max_degree_bound,
        edge_count_bound=settings.edge_count_bound,
    )


def check_synthetic_release(settings: Any) -> bool:
    """Whether the graph file is a synthetic release the ledger recorded (then it is served as
    a sandbox). With PPR_GRAPH_IS_SYNTHETIC it must be: one line and exit 2 here otherwise.
    An unreachable or un-migrated ledger is left to the workers (which then refuse)."""
    from service.ledger.ledger import Ledger, LedgerUnavailable
    from service.ledger.records import LedgerNotMigrated
    from service.serving.sandbox import synthetic_release_of

    try:
        ledger = Ledger.from_url(settings.database_url, auto_migrate=False)
    except (LedgerUnavailable, LedgerNotMigrated):
        return False
    try:
        job = synthetic_release_of(
            settings.graph_path, ledger, required=settings.graph_is_synthetic
        )
    finally:
        ledger.dispose()
    return job is not None


def run(args: argparse.Namespace) -> int:
    with _collector_paused() as resume:
        return _run(args, resume)


@contextlib.contextmanager
def _collector_paused() -> Iterator[Callable[[], None]]:
    """The cyclic garbage collector off while the server starts; yields ``resume``, which
    turns it back on (if it was on) once the supervisor is prepared, and which runs on exit in
    any case. Start-up imports and builds about 220k objects and frees few, and the collector
    walked them about 500 times: 0.2 of the 1.6 CPU-s the imports took. The supervisor
    collects once before it forks (``prepare_supervisor``), so nothing is left uncollected."""
    was_on = gc.isenabled()
    gc.disable()

    def resume() -> None:
        if was_on:
            gc.enable()

    try:
        yield resume
    finally:
        resume()


def _run(args: argparse.Namespace, resume_collector: Callable[[], None]) -> int:
    from pydantic import ValidationError

    from service.config import Settings, settings_error
    from service.errors import InvalidParameter

    _export(args)
    try:
        settings = Settings()
    except ValidationError as exc:
        # Name the flag when the value came from one, else the environment variable.
        given = {env: _FLAG_NAMES[env] for env, v in _flags(args).items() if v is not None}
        raise settings_error(exc, flags=given) from None
    if settings.graph_path is not None and not settings.graph_path.is_file():
        name = "--graph" if args.graph is not None else "PPR_GRAPH_PATH"
        raise InvalidParameter(name, f"{settings.graph_path} is not a readable file")
    if settings.nodes_path is not None and not settings.nodes_path.is_file():
        name = "--nodes" if args.nodes is not None else "PPR_NODES_PATH"
        raise InvalidParameter(name, f"{settings.nodes_path} is not a readable file")
    check_graph_inputs(settings)
    if check_synthetic_release(settings) and not settings.graph_is_synthetic:
        os.environ["PPR_GRAPH_IS_SYNTHETIC"] = "true"  # a known synthetic release: a sandbox
        settings = Settings()
    # Before anything imports prometheus_client (the logs' module does): it decides at import
    # whether its counters live in this process or in files every worker writes.
    metrics_dir: str | None = None
    if settings.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="ppr-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return _run_configured(settings, resume_collector)
    finally:
        if metrics_dir is not None:  # the workers' metric files die with this run
            shutil.rmtree(metrics_dir, ignore_errors=True)
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def _run_configured(settings: Any, resume_collector: Callable[[], None]) -> int:
    """``run`` once the settings are read and the metrics' home is set."""
    from service.ledger.ledger import Ledger, LedgerUnavailable

    _configure_logs(settings)
    # a sandbox's node set is its release's: public with it
    derived = settings.nodes_path is None and settings.graph_path is not None
    if derived and not settings.graph_is_synthetic:
        from service.graph.node_set import node_count_warning

        log.warning(node_count_warning())  # once, before any worker starts
    # Fail fast, with the command to run, before any worker starts; a database that does not
    # answer is an outage, not a mistake: the workers start and answer 503 until it returns.
    empty = False
    try:
        ledger = Ledger.from_url(settings.database_url, auto_migrate=settings.auto_migrate)
        try:
            empty = not ledger.accounts.list_accounts(limit=1)
        finally:
            ledger.dispose()
    except LedgerUnavailable as exc:
        log.warning(
            "the ledger database does not answer (%s); starting anyway: workers answer 503 "
            "ledger_unavailable until it does", exc.details.get("error", exc),
        )  # fmt: skip
    from service.api.open_files import ensure_open_file_limit

    ensure_open_file_limit(settings)
    # One path for every worker count: the graph is loaded (its snapshot written) and the
    # kernels compiled here, once, before uvicorn starts; so a file that is not a graph ends
    # the command with one line and exit 2, never a worker's traceback. With several workers
    # they are then forked from this process (each maps the snapshot).
    from service.api.forked_workers import fork_workers, prepare_supervisor

    prepare_supervisor(settings)
    resume_collector()  # start-up is done: collected and frozen
    if empty:  # a fresh ledger, and a graph that loaded: what to do next (the README's quick start)
        print(quick_start(settings.host, settings.port), file=sys.stderr, flush=True)
    app = "service.api.forked_workers:preloaded_app"
    if settings.workers > 1:
        fork_workers()  # else spawned: preloaded_app builds each worker's app itself
    return _serve(app, settings)


def _configure_logs(settings: Any) -> None:
    from service.logs import configure_logging

    configure_logging(settings)


def _serve(app: str, settings: Any) -> int:
    """Run uvicorn (its supervisor with several workers); the exit status: 0 after a stop
    asked for (SIGTERM, SIGINT), non-zero when the server or a worker failed to start."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from service.api.http_protocol import GuardedHttpProtocol, configure

    configure(settings)
    config = uvicorn.Config(
        app,
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        access_log=False,
        proxy_headers=True,
        http=GuardedHttpProtocol,
        timeout_keep_alive=settings.http_keep_alive_seconds,
    )
    if settings.workers == 1:
        server = uvicorn.Server(config)
        with contextlib.suppress(KeyboardInterrupt):
            server.run()  # a failed start-up raises SystemExit(STARTUP_FAILURE)
        if not server.started:
            log.error("the server failed to start; see the log above")
            return STARTUP_FAILURE
        return 0
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    failed = [p.pid for p in supervisor.processes if p.exitcode == STARTUP_FAILURE]
    if failed:
        # uvicorn stops the whole server when a worker fails before serving (its app or
        # configuration is broken); a process manager must see that as a failure.
        log.error("worker %s failed to start; the server stopped", failed[0])
        return STARTUP_FAILURE
    return 0
