"""Charge heartbeats: ``charges.heartbeat_at``, the answering process's last sign of life.

A charge stays ``admitted`` from its admission until its release is stored. A batch of many
items (or a query waiting behind one) can take longer than ``PPR_RECONCILE_AFTER_SECONDS``;
the process answering it now refreshes ``heartbeat_at`` of its admitted charges while it
works, and the reconciler (and an identical query finding the charge in flight) refunds an
admitted charge only once its last sign of life - ``heartbeat_at``, or ``created_at`` for a
charge that never beat - is older than the limit. Nothing to backfill: NULL reads as
``created_at``, which is what the reconciler used before.

Revision ID: 0012_charge_heartbeat
Revises: 0011_synthetic_release_charges
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_charge_heartbeat"
down_revision: str | None = "0011_synthetic_release_charges"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("charges", sa.Column("heartbeat_at", TS, nullable=True))


def downgrade() -> None:
    op.drop_column("charges", "heartbeat_at")  # SQLite 3.35 and later drop a column in place
