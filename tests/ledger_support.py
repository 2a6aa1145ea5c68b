"""Reads of a ledger's tables that only tests need (the service has no use for them)."""

from __future__ import annotations

from typing import Any

import dp_accounting
from dp_accounting import rdp as dp_rdp
from sqlalchemy import func, select

from service.ledger.admission import DEFAULT_STALE_AFTER_SECONDS
from service.ledger.ledger import Ledger
from service.ledger.records import Admission, ChargeReceipt, GraphCap
from service.ledger.tables import Charge, GraphVersion
from service.privacy.curves import laplace_curve
from service.privacy.orders import ORDERS


def count_charges(ledger: Ledger, account_id: int | None = None) -> int:
    """How many charges (any state) the ledger holds, or holds against ``account_id``."""
    stmt = select(func.count(Charge.id))
    if account_id is not None:
        stmt = stmt.where(Charge.charged_account_id == account_id)
    with ledger.engine.connect() as conn:
        return int(conn.scalar(stmt) or 0)


def graph_fingerprint_of(ledger: Ledger, public_id: str) -> str | None:
    """The content fingerprint the ledger recorded for a public graph id."""
    with ledger.engine.connect() as conn:
        return conn.scalar(
            select(GraphVersion.fingerprint).where(GraphVersion.public_id == public_id)
        )


def admit_and_charge(
    ledger: Ledger,
    *,
    graph_cap: GraphCap | None = None,
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
    **fields: Any,
) -> ChargeReceipt:
    """``ledger.admission.admit_and_charge`` of the :class:`Admission` made of ``fields``."""
    return ledger.admission.admit_and_charge(
        Admission(**fields), graph_cap=graph_cap, stale_after_seconds=stale_after_seconds
    )


def charge_edge_query(ledger: Ledger, account: int, i: int) -> int:
    """The id of a new admitted charge of ``account`` for an edge-mode query of seed
    ``n{i}`` (Laplace curve at epsilon 0.1), as a store of its release needs."""
    receipt = admit_and_charge(
        ledger, charged_account_id=account, principal_account_id=account, seed=f"n{i}",
        mechanism="noisy_diffusion", mode="edge", params={}, query_curve=laplace_curve(0.1),
        query_epsilon=0.1, graph_version="g1", request_id=f"r{i}",
    )  # fmt: skip
    return int(receipt.charge_id)


def independent_laplace_epsilon(per_query: float, charges: int, delta: float) -> float:
    """``charges`` Laplace releases of pure epsilon ``per_query`` composed by dp_accounting (not
    the service's accountant) on the service's orders, converted at ``delta``; the pure figure
    (their sum) where it is smaller, as the service's conversion takes the better of the two."""
    accountant = dp_rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / per_query), charges)
    return min(float(accountant.get_epsilon(delta)), charges * per_query)
