"""The ledger migrations, run for real once per test process and database kind, then replayed.

Most tests start from an empty ledger database that they migrate to head (``upgrade(url)``):
a few hundred times per run, at 0.3-0.6 s each (Alembic loads and runs every migration script
and talks to the database statement by statement), a quarter of the suite's time. In the
test processes (not in the servers, CLIs and workers they start, which run the migrations
as shipped), :func:`install` wraps ``alembic.command.upgrade``, which
``service.ledger.database.upgrade_engine`` calls inside its locks on an open connection:

- the first migration of an empty database to head, per database kind (SQLite, PostgreSQL),
  runs Alembic as usual and records every statement it sends, with its parameters;
- a later migration of an empty database to head sends the recorded statements on the same
  connection, in the same transaction and under the same locks, with a new ``ledger_id``
  (the one value the migrations draw at random);
- anything else (another revision, a database that is not empty, no connection) runs Alembic.

On PostgreSQL a later migration of an empty database to head first looks for a spare ledger
set aside when the database was recycled (tests/spare_ledgers.py) and renames it into place
instead of replaying (the replay's DDL is most of the server's work for a test's ledger).

So a replayed database holds the same schema, rows and revision as a migrated one (its
``ledger_meta`` differs only by the new id; the exposure shards' ``updated_at`` is the
recording's). ``test_a_replayed_migration_matches_a_real_one`` (tests/test_migration_chain.py)
checks that the two are the same.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from alembic import command
from sqlalchemy import Connection, event, inspect, text

from tests import spare_ledgers

_real_upgrade = command.upgrade
_lock = threading.Lock()


#: How a statement was sent to the driver's cursor: execute with parameters, executemany,
#: or execute without parameters (as SQLAlchemy sent it, so the driver reads it the same way).
_EXECUTE, _EXECUTEMANY, _NO_PARAMETERS = "execute", "executemany", "no_parameters"


@dataclass
class _Recording:
    ledger_id: str
    statements: list[tuple[str, str, Any]] = field(default_factory=list)


#: dialect name -> the statements of its first migration from empty to head
_recordings: dict[str, _Recording] = {}


def _empty(conn: Connection) -> bool:
    return not inspect(conn).get_table_names()


def _fresh(parameters: Any, old: str, new: str) -> Any:
    """``parameters`` (one set or a list of sets, as sent) with the value ``old`` replaced."""
    if isinstance(parameters, dict):
        return {k: new if v == old else v for k, v in parameters.items()}
    if isinstance(parameters, tuple):
        return tuple(new if v == old else v for v in parameters)
    if isinstance(parameters, list):
        return [_fresh(p, old, new) for p in parameters]
    return parameters


def _record(cfg: Any, revision: str, conn: Connection) -> None:
    sent: list[tuple[str, str, Any]] = []

    def execute(_cursor: Any, statement: str, parameters: Any, _context: Any) -> None:
        sent.append((_EXECUTE, statement, parameters))

    def executemany(_cursor: Any, statement: str, parameters: Any, _context: Any) -> None:
        sent.append((_EXECUTEMANY, statement, list(parameters)))

    def no_parameters(_cursor: Any, statement: str, _context: Any) -> None:
        sent.append((_NO_PARAMETERS, statement, None))

    listeners = [
        ("do_execute", execute),
        ("do_executemany", executemany),
        ("do_execute_no_params", no_parameters),
    ]
    for name, listener in listeners:
        event.listen(conn.engine, name, listener)
    try:
        _real_upgrade(cfg, revision)
    finally:
        for name, listener in listeners:
            event.remove(conn.engine, name, listener)
    ledger_id = conn.execute(text("SELECT value FROM ledger_meta WHERE key = 'ledger_id'"))
    _recordings[conn.dialect.name] = _Recording(str(ledger_id.scalar_one()), sent)


def _replay(recording: _Recording, conn: Connection) -> None:
    new = uuid.uuid4().hex
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for how, statement, parameters in recording.statements:
            if how == _NO_PARAMETERS:
                cursor.execute(statement)
            elif how == _EXECUTEMANY:
                cursor.executemany(statement, _fresh(parameters, recording.ledger_id, new))
            else:
                cursor.execute(statement, _fresh(parameters, recording.ledger_id, new))
    finally:
        cursor.close()


def upgrade(cfg: Any, revision: str, *args: Any, **kwargs: Any) -> None:
    conn = cfg.attributes.get("connection")
    if revision != "head" or args or kwargs or not isinstance(conn, Connection):
        _real_upgrade(cfg, revision, *args, **kwargs)
        return
    with _lock:
        if not _empty(conn):
            _real_upgrade(cfg, revision)
            return
        recording = _recordings.get(conn.dialect.name)
        if recording is None:
            _record(cfg, revision, conn)
        elif not spare_ledgers.swap_in(conn):
            _replay(recording, conn)
        spare_ledgers.remember(conn)


def install() -> None:
    """Wrap ``alembic.command.upgrade`` in this process (idempotent)."""
    command.upgrade = upgrade  # type: ignore[assignment]
