"""``one_of`` and ``one_of_bound`` (service/ledger/id_lists.py) on SQLite and PostgreSQL: they
select exactly the rows of the listed ids (or names: ``one_of_bound`` takes the column's own
type), for an empty list, one id and hundreds, and on PostgreSQL ``one_of``'s statement is one
text with one parameter whatever the number of ids (what psycopg parses once)."""

from __future__ import annotations

import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
    select,
)
from sqlalchemy.orm import Session

from service.ledger.id_lists import is_postgresql, one_of, one_of_bound

ROWS = Table("rows", MetaData(), Column("id", Integer, primary_key=True), Column("name", String))


@pytest.mark.parametrize("ids", [[], [7], [3, 3, 999_999], list(range(0, 600, 2))])
def test_one_of_selects_the_listed_rows(ledger_url: str, ids: list[int]) -> None:
    engine = create_engine(ledger_url)
    try:
        ROWS.create(engine)
        with Session(engine) as session:
            session.execute(insert(ROWS), [{"id": i, "name": f"r{i}"} for i in range(500)])
            where = one_of(session, ROWS.c.id, ids)
            found: list[int] = list(session.scalars(select(ROWS.c.id).where(where)))
            assert sorted(found) == sorted({i for i in ids if i < 500})
            by_id = select(ROWS.c.id).where(one_of_bound(ROWS.c.id, "ids")[is_postgresql(session)])
            assert sorted(session.scalars(by_id, {"ids": ids})) == sorted(found)
            names = select(ROWS.c.id).where(
                one_of_bound(ROWS.c.name, "names")[is_postgresql(session)]
            )
            named: list[int] = list(session.scalars(names, {"names": [f"r{i}" for i in ids]}))
            assert sorted(named) == sorted(found)
    finally:
        ROWS.drop(engine, checkfirst=True)
        engine.dispose()


@pytest.mark.postgres
def test_postgresql_sends_one_statement_text_with_one_parameter(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    sent: list[tuple[str, object]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def seen(conn: object, cursor: object, text: str, params: object, *args: object) -> None:
        sent.append((text, params))

    try:
        ROWS.create(engine)
        with Session(engine) as session:
            for ids in ([1], list(range(300))):
                session.execute(select(ROWS.c.id).where(one_of(session, ROWS.c.id, ids)))
        (first, one), (second, many) = sent[-2:]
        assert first == second and "ANY" in first
        assert isinstance(one, dict) and isinstance(many, dict) and len(one) == len(many) == 1
        assert list(many.values()) == [list(range(300))]
    finally:
        ROWS.drop(engine, checkfirst=True)
        engine.dispose()
