"""Idempotency-Key bindings: which charge's release answers ``(principal, key)``.

A key is bound in the transaction that decides its first answer: the admission that charges
the keyed query, the admission that joins it to an identical query's charge, (for a query
answered from a stored release before admission) :meth:`StoredReleases.bind_idempotency_keys`, or (a
``popular`` answer) the admission of its degree release, which binds the key to the account's
charge for that release with the query's node and mode. All four insert into
``idempotency_bindings``, whose partial UNIQUE index over bound keys is the one rule: of two
requests racing with one key, one binding commits and the other request reads it. A refund
frees the keys bound to the refunded charge (nothing was released under them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.ledger.tables import POPULAR_BINDING, Charge, IdempotencyBinding

BINDINGS = cast(Table, IdempotencyBinding.__table__)
CHARGES = cast(Table, Charge.__table__)

_FREE = (
    update(BINDINGS)
    .where(BINDINGS.c.charge_id == bindparam("b_charge_id"), BINDINGS.c.freed_at.is_(None))
    .values(freed_at=bindparam("b_now", type_=BINDINGS.c.freed_at.type))
)


@dataclass(frozen=True)
class EarlierCharge:
    """A charge made before this transaction, read for it: an in-flight twin, or the charge
    an Idempotency-Key is bound to."""

    id: int
    charged_account_id: int
    #: an in-flight twin's last sign of life (heartbeat, else admission), when read for one
    last_sign: datetime | None = None
    popular: bool = False  # a ``popular`` answer's binding: no other query may take the key


def bound_charges(
    session: Session, wanted: Iterable[tuple[int, str]]
) -> dict[tuple[int, str], EarlierCharge]:
    """The charge each ``(principal, key)`` of ``wanted`` is bound to (absent: the key is free)."""
    pairs = sorted(set(wanted))
    out: dict[tuple[int, str], EarlierCharge] = {}
    for start in range(0, len(pairs), 500):
        chunk = pairs[start : start + 500]
        rows = session.execute(
            select(
                BINDINGS.c.principal_account_id, BINDINGS.c.idempotency_key,
                BINDINGS.c.charge_id, CHARGES.c.charged_account_id, BINDINGS.c.kind,
            )
            .join(CHARGES, CHARGES.c.id == BINDINGS.c.charge_id)
            .where(
                tuple_(BINDINGS.c.principal_account_id, BINDINGS.c.idempotency_key).in_(chunk),
                BINDINGS.c.freed_at.is_(None),
            )
        )  # fmt: skip
        for row in rows:
            pair = (int(row.principal_account_id), str(row.idempotency_key))
            out[pair] = EarlierCharge(
                int(row.charge_id), int(row.charged_account_id),
                popular=row.kind == POPULAR_BINDING,
            )  # fmt: skip
    return out


def bound_charge(session: Session, principal: int, key: str) -> EarlierCharge | None:
    """The charge ``key`` of ``principal`` is bound to, if any."""
    return bound_charges(session, [(principal, key)]).get((principal, key))


def insert_unless_bound(is_sqlite: bool) -> Any:
    """``INSERT`` of bindings that skips a key already bound (``ON CONFLICT DO NOTHING``)."""
    dialect = sqlite if is_sqlite else postgresql
    return dialect.insert(BINDINGS).on_conflict_do_nothing()


def free_bindings(session: Session, charge_id: int, now: datetime) -> None:
    """Free every key bound to ``charge_id`` (it is being refunded: nothing was released)."""
    session.execute(_FREE, {"b_charge_id": charge_id, "b_now": now})


@dataclass(frozen=True)
class PopularQuery:
    """A ``popular`` query as a binding records it: the degree-release charge's account,
    graph version and epsilon, and the binding's node and mode."""

    charged_account_id: int
    graph_version: str
    epsilon: float
    seed: str
    mode: str


def bound_query(session: Session, principal: int, key: str) -> PopularQuery | EarlierCharge | None:
    """What ``key`` of ``principal`` is bound to: a ``popular`` query, another query's charge,
    or nothing."""
    row = session.execute(
        select(
            BINDINGS.c.kind, BINDINGS.c.seed, BINDINGS.c.mode, BINDINGS.c.charge_id,
            CHARGES.c.charged_account_id, CHARGES.c.graph_version, CHARGES.c.epsilon,
        )
        .join(CHARGES, CHARGES.c.id == BINDINGS.c.charge_id)
        .where(
            BINDINGS.c.principal_account_id == principal,
            BINDINGS.c.idempotency_key == key,
            BINDINGS.c.freed_at.is_(None),
        )
    ).one_or_none()  # fmt: skip
    if row is None:
        return None
    if row.kind != POPULAR_BINDING:
        return EarlierCharge(int(row.charge_id), int(row.charged_account_id))
    return PopularQuery(
        int(row.charged_account_id), str(row.graph_version), float(row.epsilon),
        str(row.seed), str(row.mode),
    )  # fmt: skip
