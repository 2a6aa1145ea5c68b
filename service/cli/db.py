"""``db``: the ledger database's migrations (``upgrade``, ``current``, ``check``).

``db upgrade`` is the only command that changes the schema (besides the service's
PPR_AUTO_MIGRATE=true); everything else refuses an out-of-date database with the command to run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from service.cli import arg_types
from service.cli.common import print_json

if TYPE_CHECKING:
    from sqlalchemy import Engine

Handler = Callable[[argparse.Namespace], int]


def add_database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        type=arg_types.database_url,
        default=None,
        help="SQLAlchemy URL of the ledger; default: PPR_DATABASE_URL (sqlite:///./ppr-ledger.db)",
    )


def database_url(args: argparse.Namespace) -> str:
    if args.database_url:
        return str(args.database_url)
    from pydantic import ValidationError

    from service.config import Settings, settings_error

    try:
        return Settings().database_url
    except ValidationError as exc:
        raise settings_error(exc) from None


@contextmanager
def _engine(args: argparse.Namespace) -> Iterator[Engine]:
    from sqlalchemy.exc import OperationalError

    from service.ledger.database import make_engine
    from service.ledger.ledger import LedgerUnavailable

    engine = make_engine(database_url(args))
    try:
        yield engine
    except OperationalError as exc:
        where = engine.url.render_as_string(hide_password=True)
        raise LedgerUnavailable(
            f"cannot reach the ledger database {where}: {' '.join(str(exc.orig).split())}"
        ) from exc
    finally:
        engine.dispose()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "db",
        help="ledger database migrations",
        description="Migrate and inspect the ledger database (Alembic migrations shipped with "
        "the service).",
    )
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    commands: list[tuple[str, str, Handler]] = [
        ("upgrade", "migrate the ledger database to the newest schema", _upgrade),
        ("current", "show the database's revision and the code's", _current),
        ("check", "exit 0 if the database is at the newest schema on this code's grid", _check),
    ]
    for name, text, handler in commands:
        sub = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        add_database_argument(sub)
        if name != "upgrade":
            sub.add_argument("--json", action="store_true", help="print a JSON object")
        else:
            sub.add_argument(
                "--wait",
                metavar="SECONDS",
                type=arg_types.seconds,
                default=0.0,
                help="retry for up to SECONDS while the database does not answer (a container "
                "starting beside it); default 0: fail at once",
            )
        sub.set_defaults(handler=handler)


#: Pause between attempts of ``db upgrade --wait``.
_RETRY_SECONDS = 1.0


def _create_sqlite_directory(url: str) -> None:
    """A SQLite file in a directory that does not exist yet: create the directory (the file is
    created by the migration), saying so; one that cannot be created is a one-line error."""
    from pathlib import Path

    from sqlalchemy import make_url

    from service.ledger.ledger import LedgerUnavailable

    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return
    if database.startswith("file:"):
        return
    folder = Path(database).expanduser().parent
    if folder.is_dir():
        return
    try:
        folder.mkdir(parents=True, mode=0o700)
    except OSError as exc:
        raise LedgerUnavailable(
            f"the directory {folder} of the ledger database {database} does not exist and "
            f"cannot be created ({exc.strerror}): create it, or choose another "
            "PPR_DATABASE_URL / --database-url"
        ) from exc
    print(f"created the directory {folder} for the ledger database", file=sys.stderr)


def _upgrade(args: argparse.Namespace) -> int:
    from service.ledger.database import check_migrated, describe_status, upgrade_engine
    from service.ledger.ledger import LedgerUnavailable

    _create_sqlite_directory(database_url(args))
    deadline = time.monotonic() + args.wait
    while True:
        try:
            with _engine(args) as engine:
                upgrade_engine(engine)
                check_migrated(engine)
                status = describe_status(engine)
            break
        except LedgerUnavailable as exc:
            if time.monotonic() + _RETRY_SECONDS > deadline:
                raise
            print(f"waiting for the ledger database: {exc}", file=sys.stderr, flush=True)
            time.sleep(_RETRY_SECONDS)
    print(f"ledger {status['database']} is at revision {', '.join(status['current'])} (head)")
    return 0


def _current(args: argparse.Namespace) -> int:
    from service.ledger.database import describe_status

    with _engine(args) as engine:
        status = describe_status(engine)
    if args.json:
        print_json(status)
    else:
        current = ", ".join(status["current"]) or "none (empty database)"
        state = "at head" if status["at_head"] else f"head is {', '.join(status['head'])}"
        print(f"{status['database']}: revision {current} ({state})")
    return 0


def _check(args: argparse.Namespace) -> int:
    from service.ledger.database import check_migrated, describe_status

    with _engine(args) as engine:
        check_migrated(engine)
        status = describe_status(engine)
    if args.json:
        print_json(status)
    else:
        print(
            f"ok: {status['database']} is at revision {', '.join(status['current'])} on order "
            f"grid version {status['grid_version']}"
        )
    return 0
