"""Migrated PostgreSQL ledgers kept for reuse, so that most tests' migrations send no DDL.

Replaying the first migration's statements (tests/migration_replay.py) still makes PostgreSQL
create every table, index and constraint of the ledger: about 0.1 CPU-s of the server's for
each of the few hundred databases a run migrates, and dropping them all again when the
database is recycled (tests/postgres_pool.py) another 0.02. Here, in the test processes only:

- when a test process first migrates an empty PostgreSQL ledger to head, :func:`remember`
  takes down what it made: a fingerprint of the schema (every table, column, default,
  constraint, index, sequence, trigger, type and function in ``public``), every row, and
  every sequence's position;
- when a database is recycled, :func:`set_aside` checks its ``public`` schema against that
  fingerprint; if it matches (the test wrote rows but changed no schema), every table is
  emptied, the remembered rows and sequence positions are put back (with a new ledger id,
  the one value the migrations draw at random) and the schema is renamed to
  :data:`SPARE_SCHEMA`, out of sight: the next test gets an empty ``public`` as before;
- when that test migrates the empty database to head, :func:`swap_in` drops the empty
  ``public`` and renames the spare to ``public`` (two catalog rows, inside the migration's
  transaction and locks) instead of replaying.

So the ledger a test gets holds the same schema, rows, sequence positions and revision as a
migrated one, with an id of its own; ``test_a_reused_ledger_matches_a_real_one``
(tests/test_migration_chain.py) checks that the two are the same. Anything that does not fit
(another schema change, a failed statement, a spare where ``public`` is not empty) falls back
to dropping and replaying as before.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

#: The schema a migrated, reset ledger waits in until a test migrates its database.
SPARE_SCHEMA = "ppr_test_spare_ledger"

#: Everything in ``public`` a migration makes or a test could change, one line per object,
#: sorted. Table and index definitions name the schema, so spares are checked as ``public``.
_FINGERPRINT = """
SELECT coalesce(string_agg(line, E'\\n' ORDER BY line), '') FROM (
  SELECT concat_ws(' ', 'rel', c.relname, c.relkind, c.relpersistence, c.relowner::regrole,
                   c.relacl, c.reloptions, c.relrowsecurity)
    FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'col', c.relname, a.attname, a.attnum,
                   format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attisdropped,
                   a.attidentity, a.attgenerated, a.attstorage, a.attcompression,
                   pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0
  UNION ALL
  SELECT concat_ws(' ', 'con', conrelid::regclass, conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'idx', pg_get_indexdef(i.indexrelid))
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'seq', c.relname, s.seqtypid, s.seqstart, s.seqincrement, s.seqmax,
                   s.seqmin, s.seqcache, s.seqcycle)
    FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
    WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'trg', c.relname, pg_get_triggerdef(t.oid))
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
  UNION ALL
  SELECT concat_ws(' ', 'rule', r.rulename, pg_get_ruledef(r.oid))
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
    WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'pol', p.polname) FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
    WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'typ', t.typname, t.typtype) FROM pg_type t
    WHERE t.typnamespace = 'public'::regnamespace AND t.typrelid = 0 AND t.typelem = 0
  UNION ALL
  SELECT concat_ws(' ', 'fn', p.oid::regprocedure) FROM pg_proc p
    WHERE p.pronamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'cmt', d.objoid::regclass, d.objsubid, d.description)
    FROM pg_description d JOIN pg_class c ON c.oid = d.objoid
    WHERE d.classoid = 'pg_class'::regclass AND c.relnamespace = 'public'::regnamespace
) AS lines(line)
"""


@dataclass(frozen=True)
class _FreshLedger:
    fingerprint: str
    ledger_id: str
    rows: dict[str, str]  # table -> its rows as a JSON array (non-empty tables only)
    sequences: dict[str, tuple[int, bool]]  # sequence -> (last_value, is_called)


_fresh: _FreshLedger | None = None


def _relations(conn: Connection, kinds: tuple[str, ...]) -> list[str]:
    """The names of ``public``'s relations of these ``relkind``s, sorted."""
    found = conn.exec_driver_sql(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
        "AND relkind = ANY(%(kinds)s) ORDER BY relname",
        {"kinds": list(kinds)},
    ).scalars()
    return [str(name) for name in found]


def _tables(conn: Connection) -> list[str]:
    return _relations(conn, ("r", "p"))


def _sequences(conn: Connection) -> list[str]:
    return _relations(conn, ("S",))


def remember(conn: Connection) -> None:
    """Take down the freshly migrated ledger on ``conn`` (once per process)."""
    global _fresh
    if _fresh is not None or conn.dialect.name != "postgresql":
        return
    rows = {}
    for table in _tables(conn):
        listed = conn.exec_driver_sql(
            f"SELECT coalesce(json_agg(t), '[]')::text FROM \"{table}\" AS t"
        ).scalar_one()
        if json.loads(listed):
            rows[table] = str(listed)
    sequences = {}
    for sequence in _sequences(conn):
        last, called = conn.exec_driver_sql(f'SELECT last_value, is_called FROM "{sequence}"').one()
        sequences[sequence] = (int(last), bool(called))
    ledger_id = conn.exec_driver_sql(
        "SELECT value FROM ledger_meta WHERE key = 'ledger_id'"
    ).scalar_one()
    fingerprint = str(conn.exec_driver_sql(_FINGERPRINT).scalar_one())
    _fresh = _FreshLedger(fingerprint, str(ledger_id), rows, sequences)


def set_aside(conn: Connection) -> bool:
    """On an AUTOCOMMIT connection to a database no one else uses: if ``public`` holds a
    ledger with the remembered schema, reset it to the remembered rows and sequences (a new
    ledger id) and rename it to SPARE_SCHEMA; whether it did. On False nothing was renamed
    (the caller drops what is there)."""
    fresh = _fresh
    if fresh is None:
        return False
    try:
        if str(conn.exec_driver_sql(_FINGERPRINT).scalar_one()) != fresh.fingerprint:
            return False
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{SPARE_SCHEMA}" CASCADE')
        # DELETE, not TRUNCATE: a few rows each, and TRUNCATE gives every table and index a new
        # file (three times the server's work). Foreign keys are not checked meanwhile (this
        # session's replica role), as every table is emptied.
        conn.exec_driver_sql("SET session_replication_role = replica")
        for table in _tables(conn):
            conn.exec_driver_sql(f'DELETE FROM "{table}"')
        new_id = uuid.uuid4().hex
        for table, rows in fresh.rows.items():
            conn.exec_driver_sql(
                f'INSERT INTO "{table}" OVERRIDING SYSTEM VALUE '
                f'SELECT * FROM json_populate_recordset(NULL::"{table}", %(rows)s::json)',
                {"rows": rows.replace(fresh.ledger_id, new_id)},
            )
        for sequence, (last, called) in fresh.sequences.items():
            conn.exec_driver_sql(
                "SELECT setval(%(name)s::regclass, %(last)s, %(called)s)",
                {"name": f'"{sequence}"', "last": last, "called": called},
            )
        conn.exec_driver_sql("SET session_replication_role = origin")
        conn.exec_driver_sql(f'ALTER SCHEMA public RENAME TO "{SPARE_SCHEMA}"')
    except DBAPIError:
        return False
    return True


def swap_in(conn: Connection) -> bool:
    """On the migration's connection to an empty database: the spare ledger in place of the
    empty ``public``, if there is one and ``public`` holds nothing; whether it did."""
    if conn.dialect.name != "postgresql":
        return False
    spare = conn.exec_driver_sql(
        "SELECT 1 FROM pg_namespace WHERE nspname = %(name)s", {"name": SPARE_SCHEMA}
    ).first()
    if spare is None:
        return False
    try:
        with conn.begin_nested():  # DROP SCHEMA refuses a public that holds anything
            conn.exec_driver_sql("DROP SCHEMA public")
            conn.exec_driver_sql(f'ALTER SCHEMA "{SPARE_SCHEMA}" RENAME TO public')
    except DBAPIError:
        return False
    return True
