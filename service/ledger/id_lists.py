""" "This column is one of these ids" in one short statement, whatever the number of ids.

SQLAlchemy writes ``column IN (...)`` with one parameter per id. psycopg parses a statement's
parameters on every execution once it has more than 50 of them (its cache of parsed statements
stops there), which made a group of 200 queries pay for parsing its long lists again in each of
its transactions. On PostgreSQL the list is one array parameter, ``column = ANY(:ids)``: the
statement text is the same for any number of ids, and psycopg parses it once. SQLite keeps
``IN`` (its driver parses in C).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Integer, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import QueryableAttribute, Session

__all__ = ["id_array", "is_postgresql", "one_of", "one_of_bound"]


def is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def id_array(name: str | None, ids: Sequence[int] | None = None) -> BindParameter[Any]:
    """A PostgreSQL integer-array parameter (for ``column == any_(id_array(...))``); no name:
    a name of its own in each statement."""
    array: Any = ARRAY(Integer)
    return bindparam(name, None if ids is None else list(ids), type_=array)


def one_of(
    session: Session, column: ColumnElement[Any] | QueryableAttribute[Any], ids: Sequence[int]
) -> ColumnElement[bool]:
    """``column`` is one of ``ids``: ``= ANY`` one array on PostgreSQL, ``IN`` elsewhere."""
    if is_postgresql(session):
        return column == any_(id_array(None, ids))
    return column.in_(list(ids))


def one_of_bound(
    column: ColumnElement[Any] | QueryableAttribute[Any], name: str
) -> dict[bool, ColumnElement[bool]]:
    """``column`` is one of the list bound as ``name`` when the statement runs, for statements
    built once: by "is the dialect PostgreSQL's", ``= ANY`` one array of the column's type
    (:func:`one_of`'s form), else an expanding ``IN``."""
    return {
        True: column == any_(bindparam(name, type_=ARRAY(column.type))),
        False: column.in_(bindparam(name, expanding=True)),
    }
