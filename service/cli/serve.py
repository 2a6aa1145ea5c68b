"""``serve``: run the HTTP service under uvicorn.

Flags override the ``PPR_*`` environment (they are passed to the workers through it). The
database must be migrated first (``python -m service db upgrade``) unless PPR_AUTO_MIGRATE is
set; ``make serve`` does both for the embedded default.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from service.cli.options import positive_int


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="run the HTTP service", description=__doc__)
    parser.add_argument(
        "--graph", type=Path, metavar="FILE",
        help="edge-list file (default: PPR_GRAPH_PATH, else the demo graph)",
    )  # fmt: skip
    parser.add_argument("--host", help="bind address (default: PPR_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: PPR_PORT or 8000)")
    parser.add_argument("--workers", type=positive_int, help="worker processes (default 1)")
    parser.add_argument("--database-url", help="SQLAlchemy URL of the ledger")
    parser.add_argument("--redis-url", help="Redis URL (default: in-process caches)")
    parser.add_argument("--auto-migrate", action="store_true",
                        help="upgrade the ledger's schema at start-up")  # fmt: skip
    parser.set_defaults(handler=run)


def _export(args: argparse.Namespace) -> None:
    """Put flags into the environment so every worker process builds the same Settings."""
    flags = {
        "PPR_GRAPH_PATH": None if args.graph is None else str(args.graph.resolve()),
        "PPR_HOST": args.host,
        "PPR_PORT": None if args.port is None else str(args.port),
        "PPR_WORKERS": None if args.workers is None else str(args.workers),
        "PPR_DATABASE_URL": args.database_url,
        "PPR_REDIS_URL": args.redis_url,
        "PPR_AUTO_MIGRATE": "true" if args.auto_migrate else None,
    }
    for name, value in flags.items():
        if value is not None:
            os.environ[name] = value


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from service.config import Settings
    from service.errors import InvalidParameter
    from service.ledger.ledger import Ledger

    _export(args)
    try:
        settings = Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "PPR_" + "_".join(str(p) for p in first["loc"]).upper()
        raise InvalidParameter(name, str(first["msg"])) from None
    if settings.graph_path is not None and not settings.graph_path.is_file():
        raise InvalidParameter("graph", f"{settings.graph_path} is not a readable file")
    # Fail fast, with the command to run, before any worker starts.
    Ledger.from_url(settings.database_url, auto_migrate=settings.auto_migrate).dispose()
    if settings.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="ppr-metrics-")
    uvicorn.run(
        "service.api.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        access_log=False,
        proxy_headers=True,
    )
    return 0
