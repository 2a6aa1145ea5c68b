"""Many rows in one statement (``service/ledger/array_writes.py``): the rows it writes are the
rows the per-row statements write, read back equal on SQLite and on PostgreSQL, whatever the
columns' types (integers, floats given as ints, JSON, timestamps, NULLs); on PostgreSQL it is
one statement per set of columns named, whatever the number of rows; an update touches only
the rows it names; a key listed twice is refused before anything is written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Connection,
    Double,
    Integer,
    MetaData,
    String,
    Table,
    event,
    insert,
    select,
)
from sqlalchemy.orm import Session

from service.ledger.array_writes import insert_rows, update_rows
from service.ledger.database import make_engine
from service.ledger.json_text import EncodedJson, JsonText, encode_json
from service.ledger.tables import Timestamp


def _table(name: str) -> Table:
    return Table(
        name,
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("count", Integer, nullable=True),
        Column("epsilon", Double, nullable=False),
        Column("label", String(16), nullable=True),
        Column("note", String, nullable=True),
        Column("curve", JsonText, nullable=True),
        Column("at", Timestamp, nullable=True),
        prefixes=["TEMPORARY"],
    )


ARRAYS, REFERENCE = _table("array_rows"), _table("reference_rows")
NOW = datetime(2026, 11, 30, 12, 0, 1, 123456, tzinfo=UTC)


def _rows(first_id: int = 1) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(7):
        curve: Any = {"orders": [2.0], "rdp": [i / 7]}
        if i % 2:  # as the ledger passes a curve shared by many rows: encoded once
            curve = EncodedJson(encode_json({"orders": [1.5, 2.0], "rdp": [0.1, 1 / 3]}))
        rows.append(
            {
                "id": first_id + i,
                "count": i if i % 3 else None,
                "epsilon": [1, 0.25, 1e-300][i % 3],  # an int among floats
                "label": None if i == 2 else f"l{i} é",
                "note": "x" * (i * 50),
                "curve": curve,
                "at": None if i == 3 else NOW + timedelta(microseconds=i),
            }
        )
    return rows


@pytest.fixture
def connection(ledger_url: str) -> Iterator[Connection]:
    engine = make_engine(ledger_url)
    with engine.connect() as conn:
        for table in (ARRAYS, REFERENCE):
            table.create(conn)
        yield conn
    engine.dispose()


def _read(conn: Connection, table: Table) -> list[dict[str, Any]]:
    found = [dict(row._mapping) for row in conn.execute(select(table).order_by(table.c.id))]
    for row in found:
        if row["at"] is not None and row["at"].tzinfo is None:  # SQLite keeps UTC naive
            row["at"] = row["at"].replace(tzinfo=UTC)
    return found


def _statements(conn: Connection) -> list[str]:
    seen: list[str] = []

    def on_statement(_c: Any, _cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(conn, "before_cursor_execute", on_statement)
    return seen


def test_inserted_rows_equal_the_per_row_statements(connection: Connection) -> None:
    with Session(bind=connection) as session:
        seen = _statements(connection)
        insert_rows(session, ARRAYS, _rows())
        wrote = len(seen)
        session.execute(insert(REFERENCE), _rows())
        session.commit()
    read = _read(connection, ARRAYS)
    assert read == _read(connection, REFERENCE)
    assert [row["epsilon"] for row in read[:3]] == [1.0, 0.25, 1e-300]
    assert read[0]["curve"] == {"orders": [2.0], "rdp": [0.0]}
    assert read[1]["curve"] == {"orders": [1.5, 2.0], "rdp": [0.1, 1 / 3]}
    assert read[3]["at"] is None and read[4]["at"] == NOW + timedelta(microseconds=4)
    if connection.dialect.name == "postgresql":
        assert wrote == 1  # seven rows, one statement


def test_rows_naming_different_columns_take_one_statement_per_set(
    connection: Connection,
) -> None:
    rows: list[dict[str, Any]] = [
        {"id": 1, "epsilon": 0.5},
        {"id": 2, "epsilon": 1, "label": "b"},
        {"id": 3, "epsilon": 2.5},
    ]
    with Session(bind=connection) as session:
        seen = _statements(connection)
        insert_rows(session, ARRAYS, rows)
        wrote = len(seen)
        session.commit()
    read = _read(connection, ARRAYS)
    assert [(r["id"], r["epsilon"], r["label"]) for r in read] == [
        (1, 0.5, None), (2, 1.0, "b"), (3, 2.5, None),
    ]  # fmt: skip
    if connection.dialect.name == "postgresql":
        assert wrote == 2


def test_an_update_sets_what_it_names_in_the_rows_it_names(connection: Connection) -> None:
    changes: list[dict[str, Any]] = [
        {"id": 2, "count": 40, "epsilon": 3, "curve": {"rdp": [2.0]}, "at": None},
        {"id": 5, "count": None, "epsilon": 0.125, "curve": None, "at": NOW},
        {"id": 6},  # nothing to set: left as it is
    ]
    with Session(bind=connection) as session:
        insert_rows(session, ARRAYS, _rows())
        session.execute(insert(REFERENCE), _rows())
        seen = _statements(connection)
        update_rows(session, ARRAYS, "id", changes)
        wrote = len(seen)
        for change in changes[:2]:
            session.execute(
                REFERENCE.update()
                .where(REFERENCE.c.id == change["id"])
                .values({k: v for k, v in change.items() if k != "id"})
            )
        session.commit()
    read = _read(connection, ARRAYS)
    assert read == _read(connection, REFERENCE)
    assert (read[1]["count"], read[1]["epsilon"], read[1]["curve"]) == (40, 3.0, {"rdp": [2.0]})
    assert read[4]["at"] == NOW and read[4]["curve"] is None
    assert read[0] == _read(connection, REFERENCE)[0]  # not named: unchanged
    if connection.dialect.name == "postgresql":
        assert wrote == 1


def test_a_key_listed_twice_is_refused_before_anything_is_written(
    connection: Connection,
) -> None:
    with Session(bind=connection) as session:
        insert_rows(session, ARRAYS, _rows())
        session.commit()
        before = _read(connection, ARRAYS)
        with pytest.raises(ValueError, match="listed twice"):
            update_rows(
                session, ARRAYS, "id", [{"id": 1, "epsilon": 9.0}, {"id": 1, "epsilon": 8.0}]
            )
        with pytest.raises(ValueError, match="key column"):
            update_rows(session, ARRAYS, "id", [{"epsilon": 9.0}])
        session.rollback()
    assert _read(connection, ARRAYS) == before


def test_no_rows_writes_nothing(connection: Connection) -> None:
    with Session(bind=connection) as session:
        seen = _statements(connection)
        insert_rows(session, ARRAYS, [])
        update_rows(session, ARRAYS, "id", [])
    assert seen == []
