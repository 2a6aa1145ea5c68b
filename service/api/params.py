"""Parameter types shared by the routes, so every endpoint states and enforces the same bounds.

The bounds are part of the OpenAPI schema (``minimum``/``maximum``/``pattern``), and a value
outside them is a 422 ``invalid_parameter`` naming the parameter, never a database error:
ids fit the ledger's 32-bit integer columns on PostgreSQL and SQLite alike, offsets stay
below what either database accepts, and labels cannot hold control characters (PostgreSQL
refuses a NUL in text).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Header, Path, Query
from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StrictInt
from starlette.convertors import Convertor, register_url_convertor

from service.bounds import (
    CAP_EPSILON_MAX,
    CAP_EPSILON_MIN,
    DELTA_MAX,
    DELTA_MIN,
    ID_MAX,
    LABEL_MAX,
    LIMIT_MAX,
    OFFSET_MAX,
    PRINTABLE,
)
from service.graph.loader import MAX_ID_BYTES

#: Longest node id: the loader accepts ids of at most this many bytes of UTF-8. The schema
#: states it as ``maxLength`` (characters); the bytes are checked too.
NODE_ID_MAX = MAX_ID_BYTES
#: What a node id may hold: anything but the loader's separators (space, tab, line ends,
#: vertical tab, form feed and comma), so no id can be trimmed or split into another one.
NODE_ID_PATTERN = r"^[^ \t\n\r\x0b\x0c,]+$"
#: A node id of a user account: the same, and no control characters (it is stored as text).
ACCOUNT_NODE_ID_PATTERN = r"^[^\x00-\x20\x7f,]+$"
#: Longest ``limit`` of the admin lists and the dashboard's pages (one bound for all).
LIST_LIMIT_MAX = LIMIT_MAX
#: Longest ``Idempotency-Key``, in characters (printable: no control characters).
IDEMPOTENCY_KEY_MAX = 200
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


def _node_id_bytes(value: str) -> str:
    if len(value.encode("utf-8", "surrogatepass")) > NODE_ID_MAX:
        raise ValueError(f"a node id is at most {NODE_ID_MAX} bytes of UTF-8")
    return value


class NodeConvertor(Convertor[str]):
    """``{name:node}``: the rest of the path, exactly. Starlette's ``path`` convertor stops
    before a final line feed (its route pattern ends in ``$``), so ``/v1/ppr/7%0A`` would
    name node ``7``; this one keeps every character (and the id is then refused for holding a
    separator). ``batch`` alone is not a node id here: it is ``POST /v1/ppr/batch``'s path."""

    regex = r"(?!batch\Z)(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("node", NodeConvertor())


class EmbeddingNodeConvertor(NodeConvertor):
    """``{name:embedding_node}``: as ``node``, but ``free`` and ``similar``, alone or followed
    by ``/``, and ``batch`` alone, are not node ids: those paths are the free embedding's,
    the similar-nodes and the batch endpoints (DP-IE cannot be asked for a node whose id is
    one of those words, as `batch` for rankings)."""

    regex = r"(?!(?:free|similar)(?:/|\Z)|batch\Z)(?s:.+)"


register_url_convertor("embedding_node", EmbeddingNodeConvertor())

AccountIdPath = Annotated[int, Path(ge=1, le=ID_MAX, description="An account id.")]
KeyIdPath = Annotated[int, Path(ge=1, le=ID_MAX, description="An API key id.")]
AccountIdQuery = Annotated[
    int | None, Query(ge=1, le=ID_MAX, description="Only this charged account's rows.")
]
Limit = Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX, description="Rows to return.")]
Offset = Annotated[int, Query(ge=0, le=OFFSET_MAX, description="Rows to skip.")]
QueryBool = Annotated[bool, BeforeValidator(_strict_query_bool)]
NodeIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NODE_ID_MAX,
        pattern=NODE_ID_PATTERN,
        description=f"External node id, exactly as in the edge list (at most {NODE_ID_MAX} "
        "bytes of UTF-8; no whitespace or commas); percent-encode it (a `/` is `%2F`).",
    ),
    AfterValidator(_node_id_bytes),
]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX,
        pattern=PRINTABLE,
        description=f"1..{IDEMPOTENCY_KEY_MAX} characters, no control characters.",
    ),
]

# JSON body fields.
#: A node id in a query body: the same rule as in a path.
QueryNodeIdField = Annotated[
    str,
    Field(
        strict=True,
        min_length=1,
        max_length=NODE_ID_MAX,
        pattern=NODE_ID_PATTERN,
        description=f"External node id, a JSON string exactly as in the edge list (at most "
        f"{NODE_ID_MAX} bytes of UTF-8; no whitespace or commas).",
    ),
    AfterValidator(_node_id_bytes),
]
NodeIdField = Annotated[
    str,
    Field(
        strict=True,
        min_length=1,
        max_length=NODE_ID_MAX,
        pattern=ACCOUNT_NODE_ID_PATTERN,
        description=f"The user's node id, as in the edge list (at most {NODE_ID_MAX} bytes of "
        "UTF-8; no whitespace, commas or control characters).",
    ),
    AfterValidator(_node_id_bytes),
]
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


def _integral_number(value: Any) -> Any:
    """A JSON number whose fraction is zero (``215.0``) is the integer it equals: JSON Schema,
    which the OpenAPI document's ``integer`` follows, counts it as one."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer in a JSON body: a JSON integer, or a number with a zero fraction (``215.0``);
#: never a string, a boolean or ``215.5``.
IntField = Annotated[StrictInt, BeforeValidator(_integral_number)]
