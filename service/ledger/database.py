"""Engines and migrations: one configured Engine per process, Alembic driven from code.

SQLite: WAL journal, 30 s busy timeout, foreign keys on, and SQLAlchemy (not the sqlite3
driver) emits BEGIN (the documented pysqlite recipe), so a write transaction can begin
``IMMEDIATE``: it takes the database's write lock first and waits for it (busy timeout) instead
of failing when two writers race. PostgreSQL: a pooled connection is pinged on checkout only
when it sat idle in the pool longer than ``ping_idle_seconds`` (a busy pool pays no round trip
per transaction; one idle across a database restart is replaced before use), and a connection
that fails mid-use invalidates the pool (SQLAlchemy's disconnect handling), so the request in
flight answers 503 and the next ones reconnect; admission locks the spend row with
``SELECT ... FOR UPDATE``.
"""

from __future__ import annotations

import ast
import functools
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, select, text
from sqlalchemy.exc import DisconnectionError, OperationalError, ProgrammingError

import service
from service.ledger.records import LedgerNotMigrated
from service.ledger.tables import META_GRID_FINGERPRINT, META_GRID_VERSION, LedgerMeta
from service.privacy.orders import GRID_VERSION, grid_fingerprint

if TYPE_CHECKING:
    from alembic.config import Config

#: Execution option naming how SQLAlchemy begins a SQLite transaction.
SQLITE_BEGIN = "sqlite_begin"
_SQLITE_BEGIN_MODES = ("DEFERRED", "IMMEDIATE", "EXCLUSIVE")
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0

UPGRADE_COMMAND = "python -m service db upgrade"
#: Alembic's version table (its default name; migrations/env.py does not change it).
VERSION_TABLE = "alembic_version"
_PG_MIGRATION_LOCK = 0x70707200  # advisory lock id serialising concurrent upgrades
_PROCESS_MIGRATION_LOCK = threading.Lock()


class LedgerGridMismatch(LedgerNotMigrated):
    """The stored curves are on another order grid than this code's."""

    code = "ledger_grid_mismatch"


def migrations_dir() -> Path:
    """The Alembic migrations: inside the installed package (a wheel ships them as
    ``service/migrations``), else the top-level ``migrations/`` of a source checkout."""
    package = Path(service.__file__).resolve().parent
    packaged = package / "migrations"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = package.parent / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise FileNotFoundError(
        f"the ledger's migrations are missing: neither {packaged} (an installed wheel) nor "
        f"{checkout} (a source checkout) holds env.py; reinstall the package"
    )


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


#: Default of ``make_engine``'s ``ping_idle_seconds`` (the setting PPR_LEDGER_PING_IDLE_SECONDS).
DEFAULT_PING_IDLE_SECONDS = 10.0


def make_engine(url: str, *, ping_idle_seconds: float = DEFAULT_PING_IDLE_SECONDS,
                **kwargs: Any) -> Engine:  # fmt: skip
    """An Engine configured for the ledger on SQLite or PostgreSQL.

    PostgreSQL: a connection that sat in the pool longer than ``ping_idle_seconds`` is pinged
    when checked out (0 pings on every checkout, like ``pool_pre_ping``).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
        engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        _install_sqlite_hooks(engine)
        return engine
    engine = create_engine(parsed, **kwargs)
    _install_idle_ping(engine, ping_idle_seconds)
    return engine


_CHECKED_IN_AT = "ppr_checked_in_at"


def _install_idle_ping(engine: Engine, idle_seconds: float) -> None:
    """Ping a pooled connection on checkout only if it was idle longer than ``idle_seconds``.

    A failed ping raises ``DisconnectionError``: the pool discards that connection and checks
    out (or opens) another, as SQLAlchemy's pessimistic-disconnect recipe does.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in = record.info.get(_CHECKED_IN_AT)
        if checked_in is None or time.monotonic() - checked_in <= idle_seconds:
            return  # new, or recently used: no round trip
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
            dbapi_connection.rollback()
        except Exception as exc:
            raise DisconnectionError(f"pooled connection failed its idle ping: {exc}") from exc


def _enable_wal(cursor: Any) -> None:
    """Put the database file in WAL mode (persistent: a no-op once any connection did it).

    Switching the journal mode needs the file's exclusive lock, and SQLite answers "database
    is locked" at once, without its busy handler, while another connection holds a lock (as
    when several workers open a fresh file together): retry until the busy timeout."""
    if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_SECONDS
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 driver; the "begin" hook emits BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if engine.url.database not in (None, "", ":memory:"):
                _enable_wal(cursor)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = str(conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")).upper()
        if mode not in _SQLITE_BEGIN_MODES:
            raise ValueError(f"unknown SQLite BEGIN mode {mode!r}")
        conn.exec_driver_sql(f"BEGIN {mode}")


def autocommit_engine(engine: Engine) -> Engine:
    """The same engine (same pool) with every statement committed on its own: on PostgreSQL
    in autocommit, so a statement costs its own round trip and no BEGIN or COMMIT. For the
    ledger's reads (at PostgreSQL's READ COMMITTED every statement of a transaction takes its
    own snapshot anyway, so a read sees what it saw inside a transaction; reads take no locks
    and write nothing) and for writes made in ONE statement, which is atomic on its own.
    SQLite keeps its transactions: its BEGIN costs no round trip."""
    if is_sqlite(engine):
        return engine
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def write_engine(engine: Engine) -> Engine:
    """The same engine (same pool), whose transactions begin IMMEDIATE on SQLite."""
    if is_sqlite(engine):
        return engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
    return engine


# --- Alembic ----------------------------------------------------------------------------------
#
# Alembic is imported only to migrate (and to name an unknown revision in an error): checking
# that a ledger is at head reads the version table with one query and the heads from the
# migration files' ``revision`` / ``down_revision`` lines, which spares every command and
# server start that opens a migrated ledger the import (about 0.2 s).


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for the repository's migrations; the URL never comes from a file."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revisions() -> set[str]:
    """The migrations' head revision(s) (read once per process: the scripts ship with the
    code; a worker forked by ``serve`` inherits what its supervisor read)."""
    return set(_heads())


@functools.cache
def _heads() -> frozenset[str]:
    """The revisions no migration names as its ``down_revision``, read from the scripts'
    module-level assignments (tests/unit/ledger/test_database.py checks them against
    Alembic's own ``ScriptDirectory.get_heads``)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in sorted((migrations_dir() / "versions").glob("*.py")):
        assigned = script_assignments(script, ("revision", "down_revision"))
        revision = assigned.get("revision")
        if not isinstance(revision, str):
            continue
        revisions.add(revision)
        down = assigned.get("down_revision")
        if isinstance(down, str):
            parents.add(down)
        elif isinstance(down, tuple | list):
            parents.update(str(parent) for parent in down)
    return frozenset(revisions - parents)


def script_assignments(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The literal values assigned to ``names`` at the top level of a Python file."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value = node.target.id, node.value
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            target, value = node.targets[0].id, node.value
        else:
            continue
        if target in names and value is not None:
            found[target] = ast.literal_eval(value)
    return found


def current_revisions(conn: Connection) -> set[str]:
    """The revisions stamped in the database's ``alembic_version`` table (none without it)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return set()
    return {str(row[0]) for row in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))}


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    """One transaction holding a lock that serialises concurrent upgrades of one database."""
    with write_engine(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        yield conn


def upgrade(url: str, revision: str = "head") -> None:
    """Run the migrations up to ``revision`` on the database at ``url`` (idempotent)."""
    engine = make_engine(url)
    try:
        upgrade_engine(engine, revision)
    finally:
        engine.dispose()


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    # Alembic's migration context is process-global: one upgrade at a time per process; the
    # database lock below serialises processes.
    with _PROCESS_MIGRATION_LOCK, _migration_lock(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def sqlite_file_missing(engine: Engine) -> bool:
    """A SQLite file URL whose file does not exist yet (connecting would create it)."""
    database = engine.url.database
    if not is_sqlite(engine) or not database or database == ":memory:":
        return False
    if database.startswith("file:"):
        return False
    return not Path(database).exists()


def check_migrated(engine: Engine) -> None:
    """Raise :class:`LedgerNotMigrated` unless the database is at head on this code's grid."""
    heads = head_revisions()
    if sqlite_file_missing(engine):
        folder = Path(str(engine.url.database)).parent
        missing = (
            ""
            if folder.is_dir()
            else f", nor does its directory {folder} ({UPGRADE_COMMAND} creates it)"
        )
        raise LedgerNotMigrated(
            f"the ledger database file {engine.url.database} does not exist{missing}: create "
            f"and migrate it with `{UPGRADE_COMMAND}` (with the same PPR_DATABASE_URL or "
            "--database-url), or start the service with PPR_AUTO_MIGRATE=true",
            details={"command": UPGRADE_COMMAND},
        )
    with engine.connect() as conn:
        current = current_revisions(conn)
    if current != heads:
        where = engine.url.render_as_string(hide_password=True)
        found = ", ".join(sorted(current)) or "empty, no migrations applied"
        unknown = sorted(rev for rev in current if not _known_revision(rev))
        if unknown:
            raise LedgerNotMigrated(
                f"the ledger database {where} is at revision {', '.join(unknown)}, which this "
                f"code does not know (head: {', '.join(sorted(heads))}): it was migrated by a "
                "newer version of the service; run that version",
                details={"current": sorted(current), "head": sorted(heads)},
            )
        raise LedgerNotMigrated(
            f"the ledger database {where} is not migrated (revision: {found}; this code needs "
            f"{', '.join(sorted(heads))}): run `{UPGRADE_COMMAND}` (with the same "
            "PPR_DATABASE_URL or --database-url), or start the service with "
            "PPR_AUTO_MIGRATE=true to migrate at start-up",
            details={"current": sorted(current), "head": sorted(heads), "command": UPGRADE_COMMAND},
        )
    check_grid(engine)


def _known_revision(revision: str) -> bool:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    try:
        return script.get_revision(revision) is not None
    except Exception:  # alembic raises its own ResolutionError / CommandError subclasses
        return False


def read_meta(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(select(LedgerMeta.key, LedgerMeta.value)).all()
    return {key: value for key, value in rows}


def check_grid(engine: Engine) -> None:
    """Refuse a ledger whose curves are stored on another order grid than this code's."""
    try:
        meta = read_meta(engine)
    except (OperationalError, ProgrammingError) as exc:
        if isinstance(exc, OperationalError) and not _missing_table(engine, exc):
            # the database stopped answering since the revision was read: an outage (the
            # caller's ledger_unavailable), not a ledger to migrate
            raise
        raise LedgerNotMigrated(
            f"the ledger database has no readable ledger_meta table ({exc.__class__.__name__}): "
            f"run `{UPGRADE_COMMAND}`"
        ) from exc
    stored = (meta.get(META_GRID_VERSION), meta.get(META_GRID_FINGERPRINT))
    expected = (str(GRID_VERSION), grid_fingerprint())
    if stored != expected:
        raise LedgerGridMismatch(
            f"the ledger stores RDP curves on order grid version {stored[0]} (fingerprint "
            f"{stored[1]}), this code uses version {expected[0]} (fingerprint {expected[1]}). "
            "A change of the order grid needs a migration that converts the stored curves; "
            "refusing to reinterpret them",
            details={"stored": list(stored), "expected": list(expected)},
        )


def _missing_table(engine: Engine, exc: OperationalError) -> bool:
    """Whether ``exc`` says a table does not exist (SQLite reports that as an OperationalError;
    PostgreSQL as a ProgrammingError), rather than that the database cannot be reached."""
    return engine.dialect.name == "sqlite" and "no such table" in str(exc.orig)


def describe_status(engine: Engine) -> dict[str, Any]:
    """Current and head revisions and the stored grid, for ``db current``."""
    current: set[str] = set()
    if not sqlite_file_missing(engine):
        with engine.connect() as conn:
            current = current_revisions(conn)
    meta: dict[str, str] = {}
    if current:
        try:
            meta = read_meta(engine)
        except (OperationalError, ProgrammingError):
            meta = {}
    heads = head_revisions()
    return {
        "database": engine.url.render_as_string(hide_password=True),
        "current": sorted(current),
        "head": sorted(heads),
        "at_head": current == heads,
        "grid_version": meta.get(META_GRID_VERSION),
        "grid_fingerprint": meta.get(META_GRID_FINGERPRINT),
    }


__all__ = [
    "UPGRADE_COMMAND",
    "VERSION_TABLE",
    "LedgerGridMismatch",
    "alembic_config",
    "check_grid",
    "check_migrated",
    "current_revisions",
    "describe_status",
    "head_revisions",
    "make_engine",
    "migrations_dir",
    "script_assignments",
    "upgrade",
    "upgrade_engine",
    "write_engine",
]
