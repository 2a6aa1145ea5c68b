"""Parameter types shared by the routes, so every endpoint states and enforces the same bounds.

The bounds are part of the OpenAPI schema (``minimum``/``maximum``/``pattern``), and a value
outside them is a 422 ``invalid_parameter`` naming the parameter, never a database error:
ids fit the ledger's 32-bit integer columns on PostgreSQL and SQLite alike, offsets stay
below what either database accepts, and labels cannot hold control characters (PostgreSQL
refuses a NUL in text).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator, Field, StrictBool

from service.bounds import ID_MAX, LABEL_MAX, LIMIT_MAX, OFFSET_MAX, PRINTABLE
from service.budgets import CAP_EPSILON_MAX, CAP_EPSILON_MIN, DELTA_MAX, DELTA_MIN
from service.graph.loader import MAX_ID_BYTES

#: Longest node id: the loader accepts ids of at most this many bytes of UTF-8.
NODE_ID_MAX = MAX_ID_BYTES
#: Hard bounds of ``k`` and ``epsilon`` (the configured ranges lie inside; the schema served by
#: a running service states the configured ones).
K_LIMIT = 10_000


def _strict_query_bool(value: Any) -> Any:
    """Query-string booleans are ``true`` or ``false``; ``1``, ``yes`` or ``on`` are refused."""
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ValueError("must be true or false")
    return value


AccountIdPath = Annotated[int, Path(ge=1, le=ID_MAX, description="An account id.")]
KeyIdPath = Annotated[int, Path(ge=1, le=ID_MAX, description="An API key id.")]
AccountIdQuery = Annotated[
    int | None, Query(ge=1, le=ID_MAX, description="Only this charged account's rows.")
]
Limit = Annotated[int, Query(ge=1, le=LIMIT_MAX, description="Rows to return.")]
Offset = Annotated[int, Query(ge=0, le=OFFSET_MAX, description="Rows to skip.")]
QueryBool = Annotated[bool, BeforeValidator(_strict_query_bool)]
NodeIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NODE_ID_MAX,
        description="External node id, as in the edge list; percent-encode it (a `/` is `%2F`).",
    ),
]

# JSON body fields.
NodeIdField = Annotated[str, Field(min_length=1, max_length=NODE_ID_MAX, pattern=PRINTABLE)]
GraphFileField = Annotated[str, Field(min_length=1, max_length=1024, pattern=PRINTABLE)]
LabelField = Annotated[str, Field(max_length=LABEL_MAX, pattern=PRINTABLE)]
CapEpsilonField = Annotated[
    float,
    Field(
        strict=True,
        ge=CAP_EPSILON_MIN,
        le=CAP_EPSILON_MAX,
        description=f"Budget cap epsilon, in [{CAP_EPSILON_MIN:g}, {CAP_EPSILON_MAX:g}].",
    ),
]
DeltaField = Annotated[
    float,
    Field(
        strict=True,
        ge=DELTA_MIN,
        lt=DELTA_MAX,
        description=f"Budget delta, in [{DELTA_MIN:g}, {DELTA_MAX:g}).",
    ),
]
QuotaEpsilonField = Annotated[
    float,
    Field(
        strict=True,
        gt=0,
        le=CAP_EPSILON_MAX,
        description=f"Epsilon a service account may charge to other accounts per rolling 24 "
        f"hours, in (0, {CAP_EPSILON_MAX:g}].",
    ),
]
BoolField = StrictBool
