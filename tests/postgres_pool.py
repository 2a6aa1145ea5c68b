"""Fresh PostgreSQL databases for the tests, without paying CREATE DATABASE for each one.

``CREATE DATABASE`` copies the template block by block (about 0.3 s on the test machines) and
the suite makes a few hundred. A database a test is done with is recycled instead, in this
process (one per xdist worker): every other session on it is ended, it is renamed to a new
unique name (so a straggler that reconnects to the old name fails as it would after a drop),
its database-level settings are reset, and every schema in it is dropped and ``public``
recreated as a new database has it (but a ledger the test left at head with its schema
unchanged: that one is reset and kept out of sight for the next migration, see
tests/spare_ledgers.py). What the next test gets is empty like a new database, under a name
never used before; anything that cannot be recycled that way (the database was renamed or
dropped by the test, a session does not end, an older server) is dropped as before.
The recycled databases are dropped when the session ends.
"""

from __future__ import annotations

import time
import uuid

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from tests import spare_ledgers

#: The prefix of every database the tests make (``ppr_test_<hex>``).
PREFIX = "ppr_test_"
#: How long a recycle waits for the sessions it ended to go away before dropping instead.
SESSIONS_GONE_SECONDS = 5.0
#: ``pg_database_owner`` (the owner of a new database's ``public``) exists from PostgreSQL 15.
RECYCLE_FROM_VERSION = 150000

#: A schema of the database's own (not PostgreSQL's catalogs, TOAST or temporary schemas).
_USER_SCHEMA = "{column} !~ '^pg_' AND {column} <> 'information_schema'"

_recycled: list[str] = []


def new_name() -> str:
    return f"{PREFIX}{uuid.uuid4().hex}"


def take(admin: Engine) -> str:
    """The name of an empty database of its own for one test: a recycled one, else new."""
    if _recycled:
        return _recycled.pop()
    name = new_name()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    return name


def give_back(admin: Engine, base: URL, name: str) -> None:
    """Recycle ``name`` for the next test, or drop it if it cannot be recycled."""
    fresh = _recycle(admin, base, name)
    if fresh is not None:
        _recycled.append(fresh)
        return
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_recycled(admin: Engine) -> None:
    """Drop every database waiting to be reused (at the end of the session)."""
    if not _recycled:
        return
    with admin.connect() as conn:
        while _recycled:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{_recycled.pop()}" WITH (FORCE)')


def _recycle(admin: Engine, base: URL, name: str) -> str | None:
    fresh = new_name()
    try:
        with admin.connect() as conn:
            version = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            exists = conn.exec_driver_sql(
                "SELECT 1 FROM pg_database WHERE datname = %(name)s", {"name": name}
            ).first()
            if version < RECYCLE_FROM_VERSION or exists is None:
                return None
            # a test may have closed it to connections, or set parameters on it
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" CONNECTION LIMIT -1')
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" RESET ALL')
            if not _renamed_once_alone(conn, name, fresh):
                return None
        engine = create_engine(
            base.set(database=fresh), isolation_level="AUTOCOMMIT", poolclass=NullPool
        )
        try:
            with engine.connect() as conn:
                spare_ledgers.set_aside(conn)
                emptied = _emptied(conn)
        finally:
            engine.dispose()
    except DBAPIError:
        emptied = False
    if not emptied:
        _drop_quietly(admin, fresh)
        return None
    return fresh


def _renamed_once_alone(conn: Connection, name: str, fresh: str) -> bool:
    """End every session on ``name``, then rename it (PostgreSQL renames a database only
    when nobody is connected to it)."""
    deadline = time.monotonic() + SESSIONS_GONE_SECONDS
    while True:
        conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %(name)s AND pid <> pg_backend_pid()",
            {"name": name},
        )
        try:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" RENAME TO "{fresh}"')
            return True
        except DBAPIError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _emptied(conn: Connection) -> bool:
    """Every schema but a spare ledger dropped (with all it holds) and ``public`` as a new
    database has it; whether nothing else is left."""
    schemas = conn.exec_driver_sql(
        f"SELECT nspname FROM pg_namespace WHERE {_USER_SCHEMA.format(column='nspname')}"
    ).scalars()
    for schema in list(schemas):
        if schema != spare_ledgers.SPARE_SCHEMA:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    conn.exec_driver_sql("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
    conn.exec_driver_sql("GRANT USAGE ON SCHEMA public TO PUBLIC")
    conn.exec_driver_sql("COMMENT ON SCHEMA public IS 'standard public schema'")
    left = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE {_USER_SCHEMA.format(column='n.nspname')} AND n.nspname <> %(spare)s",
        {"spare": spare_ledgers.SPARE_SCHEMA},
    ).scalar_one()
    return int(left) == 0


def _drop_quietly(admin: Engine, name: str) -> None:
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except DBAPIError:
        pass
