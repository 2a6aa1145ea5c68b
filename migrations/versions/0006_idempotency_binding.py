"""Idempotency-Keys bind to the answer they first returned.

* ``idempotency_bindings``: the charge whose release answers ``(principal, Idempotency-Key)``,
  recorded in the transaction that decides the keyed answer (charged, joined to an identical
  query's charge, or replayed from a stored release), under one partial UNIQUE index over the
  keys still bound. Refunding a charge frees the keys bound to it.
* Backfill: every live (unrefunded) charge that carries a key binds it (``charged``). Keyed
  replays made before this revision recorded nothing, so they cannot be bound.

Revision ID: 0006_idempotency_binding
Revises: 0005_degree_and_read_charges
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_idempotency_binding"
down_revision: str | None = "0005_degree_and_read_charges"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
BOUND = "freed_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "idempotency_bindings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("principal_account_id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=False),
        sa.Column("charge_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("freed_at", TS, nullable=True),
        sa.CheckConstraint(
            "kind IN ('charged', 'joined', 'replayed')", name="ck_idempotency_bindings_kind"
        ),
        sa.ForeignKeyConstraint(
            ["principal_account_id"],
            ["accounts.id"],
            name="fk_idempotency_bindings_principal_account_id_accounts",
        ),
        sa.ForeignKeyConstraint(
            ["charge_id"], ["charges.id"], name="fk_idempotency_bindings_charge_id_charges"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_idempotency_bindings"),
    )
    op.create_index(
        "uq_idempotency_bindings_bound",
        "idempotency_bindings",
        ["principal_account_id", "idempotency_key"],
        unique=True,
        sqlite_where=sa.text(BOUND),
        postgresql_where=sa.text(BOUND),
    )
    op.create_index("ix_idempotency_bindings_charge_id", "idempotency_bindings", ["charge_id"])
    op.execute(
        "INSERT INTO idempotency_bindings"
        " (principal_account_id, idempotency_key, charge_id, kind, created_at)"
        " SELECT principal_account_id, idempotency_key, id, 'charged', created_at FROM charges"
        " WHERE idempotency_key IS NOT NULL AND state <> 'refunded' ORDER BY id"
    )


def downgrade() -> None:
    op.drop_index("ix_idempotency_bindings_charge_id", table_name="idempotency_bindings")
    op.drop_index("uq_idempotency_bindings_bound", table_name="idempotency_bindings")
    op.drop_table("idempotency_bindings")
