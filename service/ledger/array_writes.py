"""PostgreSQL: many rows inserted or updated by ONE statement, one array parameter per column.

A group's admission writes a row per query to ``charges``, to ``spend`` (personalized: each
query charges its own user) and, for a service account that reads what it is charged, to
``service_reads``. Sent as one prepared statement executed per row in a pipeline, each row was
a Bind and an Execute of its own: a group of 15 paid about 45 executions in the server and,
in the worker, SQLAlchemy's and psycopg's work per row. Here each table's rows are one
statement whose text depends only on the columns written, never on the number of rows, so
psycopg parses and prepares it once:

    INSERT INTO t (a, b) SELECT * FROM unnest(CAST(%(a)b AS integer[]), CAST(%(b)b AS text[]))
    UPDATE t SET b = r.b FROM unnest(...) AS r(a, b) WHERE t.a = r.a

The arrays travel in PostgreSQL's binary format (psycopg's ``%b``), as in
``service/ledger/release_rows.py``. Each value is first processed as SQLAlchemy would bind it
to its column (a JSON column's dictionary encoded, say), so the rows written are the rows the
per-row statements wrote. A statement is atomic: the rows are written together or not at all,
inside the caller's transaction and under its locks.

On SQLite (its driver executes many rows in C) the same calls run the per-row statements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Double, Float, Integer, Table, bindparam, insert, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from service.ledger.id_lists import is_postgresql

__all__ = ["insert_rows", "update_rows"]

Row = Mapping[str, Any]


def insert_rows(session: Session, table: Table, rows: Sequence[Row]) -> None:
    """Insert ``rows`` (column name -> value; rows may name different columns) into
    ``table``: on PostgreSQL one statement per set of columns named."""
    if not rows:
        return
    if not is_postgresql(session):  # executemany takes the first row's columns for all
        for same in _by_columns(rows).values():
            session.connection().execute(insert(table), same)
        return
    dialect = session.get_bind().dialect
    for columns, same in _by_columns(rows).items():
        sql = _insert_sql(table, columns, dialect)
        session.connection().exec_driver_sql(sql, _arrays(table, columns, same, dialect))


def update_rows(session: Session, table: Table, key: str, rows: Sequence[Row]) -> None:
    """Set, in each row of ``table`` whose ``key`` column equals a row's ``rows[i][key]``, the
    other columns that row names. Every key must be distinct (one row of ``rows`` per row of
    ``table``): on PostgreSQL one statement per set of columns named."""
    if not rows:
        return
    if any(key not in row for row in rows):
        raise ValueError(f"update_rows: every row must name the key column {key!r}")
    if len({row[key] for row in rows}) != len(rows):
        raise ValueError(f"update_rows: a {table.name}.{key} is listed twice")
    if not is_postgresql(session):
        for columns, same in _by_columns(rows, key).items():
            session.connection().execute(
                _update_statement(table, key, columns),
                [{f"w_{name}": row[name] for name in columns} for row in same],
            )
        return
    dialect = session.get_bind().dialect
    for columns, same in _by_columns(rows, key).items():
        sql = _update_sql(table, key, columns, dialect)
        session.connection().exec_driver_sql(sql, _arrays(table, columns, same, dialect))


def _by_columns(rows: Sequence[Row], key: str | None = None) -> dict[tuple[str, ...], list[Row]]:
    """The rows by the (sorted) columns they name, each set in the order first met; with a
    ``key``, rows that name nothing else (nothing to set) are left out."""
    groups: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        if key is not None and len(row) == 1:
            continue
        groups.setdefault(tuple(sorted(row)), []).append(row)
    return groups


def _arrays(
    table: Table, columns: tuple[str, ...], rows: Sequence[Row], dialect: Dialect
) -> dict[str, list[Any]]:
    """One list per column: each value as bound to its column, of one Python type per list
    (psycopg's binary arrays refuse a list of mixed ints and floats)."""
    arrays: dict[str, list[Any]] = {}
    for name in columns:
        bound = _bound(table, name, dialect)
        values = [row[name] for row in rows]
        arrays[name] = values if bound is None else [bound(value) for value in values]
    return arrays


@lru_cache(maxsize=256)
def _bound(table: Table, name: str, dialect: Dialect) -> Callable[[Any], Any] | None:
    """A value as the column binds it: its type's bind processing, then one Python type per
    number column (None stays None); None: the value itself (a text column)."""
    column_type = table.c[name].type
    process = column_type.bind_processor(dialect)
    kind: type | None = None
    if isinstance(column_type, Integer):
        kind = int
    elif isinstance(column_type, Float | Double):
        kind = float
    if process is None and kind is None:
        return None

    def bound(value: Any) -> Any:
        if process is not None:
            value = process(value)
        if value is None or kind is None or type(value) is kind:
            return value
        return kind(value)

    return bound


@lru_cache(maxsize=256)
def _array_types(table: Table, columns: tuple[str, ...], dialect: Dialect) -> list[str]:
    return [
        f"CAST(%({name})b AS {table.c[name].type.compile(dialect=dialect)}[])" for name in columns
    ]


@lru_cache(maxsize=256)
def _insert_sql(table: Table, columns: tuple[str, ...], dialect: Dialect) -> str:
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest("
        f"{', '.join(_array_types(table, columns, dialect))})"
    )


@lru_cache(maxsize=256)
def _update_sql(table: Table, key: str, columns: tuple[str, ...], dialect: Dialect) -> str:
    assignments = ", ".join(f"{name} = r.{name}" for name in columns if name != key)
    return (
        f"UPDATE {table.name} SET {assignments} FROM unnest("
        f"{', '.join(_array_types(table, columns, dialect))}) AS r({', '.join(columns)})"
        f" WHERE {table.name}.{key} = r.{key}"
    )


@lru_cache(maxsize=256)
def _update_statement(table: Table, key: str, columns: tuple[str, ...]) -> Any:
    return (
        update(table)
        .where(table.c[key] == bindparam(f"w_{key}", type_=table.c[key].type))
        .values(
            {
                name: bindparam(f"w_{name}", type_=table.c[name].type)
                for name in columns
                if name != key
            }
        )
    )
