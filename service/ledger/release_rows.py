"""PostgreSQL: a group's releases stored, and their charges marked ``released``, in ONE statement.

:data:`STORE_RELEASES_SETTLED` is the group's form of the single release's
``STORE_RELEASE_SETTLED`` (service/ledger/locked_rows.py): a data-modifying CTE moves the
group's charges from ``admitted`` to ``released`` and inserts a release row for each charge it
moved, from one array per column. One statement is atomic, so committed on its own it is the
transaction it replaces (BEGIN, the UPDATE, a multi-row INSERT, COMMIT), in one round trip; its
text is the same for any number of releases, so psycopg parses it once; and the rows are built
as columns, without a parameter dictionary (or SQLAlchemy's processing of one) per release.

The arrays are sent in PostgreSQL's binary format (psycopg's ``%b`` placeholders; the statement
is the driver's text, run with ``exec_driver_sql``): each text is sent as its bytes with its
length. In the text format psycopg quotes and escapes every element of a text array in Python,
which took about 0.9 ms per release for the ~17 kB of a release's results (the binary format:
under 0.15 ms, the server's work included).

It returns the ids of the charges it moved: a charge it did not move was released before (a
no-op) or refunded (its answer must be discarded), which the caller reads afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from service.ledger.json_text import encode_json
from service.ledger.records import StoredRelease
from service.ledger.release_format import results_json

#: The columns of ``releases`` the statement fills from arrays, with each array's SQL type, in
#: the order of the statement (``charge_id`` first; ``created_at`` is one value for all rows).
ARRAY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("charge_id", "integer"),
    ("charged_account_id", "integer"),
    ("node", "text"),
    ("graph_version", "text"),
    ("mode", "text"),
    ("epsilon", "double precision"),
    ("mechanism_name", "text"),
    ("results", "text"),
    ("mechanism", "text"),
    ("request_id", "text"),
    ("principal_account_id", "integer"),
    ("idempotency_key", "text"),
)

#: Parameters: ``now`` (the charges' ``settled_at`` and the releases' ``created_at``) and one
#: list per name of :data:`ARRAY_COLUMNS` (:func:`release_columns`).
STORE_RELEASES_SETTLED = (
    "WITH settled AS ("
    " UPDATE charges SET state = 'released', settled_at = %(now)b"
    " WHERE id = ANY(CAST(%(charge_id)b AS integer[])) AND state = 'admitted' RETURNING id"
    ") INSERT INTO releases ("
    + ", ".join(name for name, _ in ARRAY_COLUMNS)
    + ", created_at) SELECT "
    + ", ".join(f"r.{name}" for name, _ in ARRAY_COLUMNS)
    + ", %(now)b FROM unnest("
    + ", ".join(f"CAST(%({name})b AS {kind}[])" for name, kind in ARRAY_COLUMNS)
    + ") AS r("
    + ", ".join(name for name, _ in ARRAY_COLUMNS)
    + ") JOIN settled ON settled.id = r.charge_id RETURNING releases.charge_id"
)


def release_columns(
    releases: Sequence[tuple[StoredRelease, str | None, int]], now: datetime
) -> dict[str, Any]:
    """The parameters of :data:`STORE_RELEASES_SETTLED` for ``releases`` (each with its
    Idempotency-Key and principal), in order: the same values as ``release_values`` gives
    each row, as one list per column. A charge listed twice must be listed once here (its
    first release: a release is stored once). A mechanism dictionary shared by many
    releases is encoded once."""
    columns: dict[str, list[Any]] = {name: [] for name, _ in ARRAY_COLUMNS}
    encoded: dict[int, tuple[object, str]] = {}  # id -> (the dict, kept alive; its JSON)
    for release, idempotency_key, principal in releases:
        key = release.key
        mechanism = release.mechanism
        hit = encoded.get(id(mechanism))
        if hit is None or hit[0] is not mechanism:
            hit = encoded[id(mechanism)] = (mechanism, encode_json(mechanism))
        columns["charge_id"].append(release.charge_id)
        columns["charged_account_id"].append(key.account_id)
        columns["node"].append(key.node)
        columns["graph_version"].append(key.graph_version)
        columns["mode"].append(str(key.mode))
        columns["epsilon"].append(float(key.epsilon))
        columns["mechanism_name"].append(key.mechanism)
        columns["results"].append(results_json(release.results))
        columns["mechanism"].append(hit[1])
        columns["request_id"].append(release.request_id)
        columns["principal_account_id"].append(principal)
        columns["idempotency_key"].append(idempotency_key)
    return {"now": now, **columns}
