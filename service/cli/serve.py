"""``serve``: run the HTTP service under uvicorn.

Flags override the ``PPR_*`` environment (they are passed to the workers through it). The
database must be migrated first (``python -m service db upgrade``) unless PPR_AUTO_MIGRATE is
set; ``make serve`` does both for the embedded default.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from service.cli.options import database_url, port, positive_int, redis_url


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="run the HTTP service", description=__doc__)
    parser.add_argument(
        "--graph", type=Path, metavar="FILE",
        help="edge-list file (default: PPR_GRAPH_PATH, else the demo graph)",
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


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from service.config import Settings, settings_error
    from service.errors import InvalidParameter
    from service.ledger.ledger import Ledger

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
    # Fail fast, with the command to run, before any worker starts.
    Ledger.from_url(settings.database_url, auto_migrate=settings.auto_migrate).dispose()
    metrics_dir: str | None = None
    if settings.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="ppr-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    # One path for every worker count: the graph is loaded (its snapshot written) and the
    # kernels compiled here, once, before uvicorn starts; so a file that is not a graph ends
    # the command with one line and exit 2, never a worker's traceback. With several workers
    # they are then forked from this process (each maps the snapshot).
    from service.api.forked_workers import fork_workers, prepare_supervisor

    prepare_supervisor(settings)
    app = "service.api.forked_workers:preloaded_app"
    if settings.workers > 1:
        fork_workers()  # else spawned: preloaded_app builds each worker's app itself
    try:
        uvicorn.run(
            app,
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level,
            access_log=False,
            proxy_headers=True,
        )
    finally:
        if metrics_dir is not None:  # the workers' metric files die with this run
            shutil.rmtree(metrics_dir, ignore_errors=True)
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    return 0
