"""Embedding salts: ``embedding_salts`` records each graph version's embedding hash salt.

The hash functions of node embeddings (h_k, h_sgn) are keyed by a 16-byte salt drawn from the
OS entropy source once per graph version (its public id). Recording it makes embeddings
comparable across workers, restarts and replicas. Nothing to backfill: a version gets its salt
the first time an embedding is made on it.

Revision ID: 0009_embedding_salts
Revises: 0008_popular_key_bindings
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_embedding_salts"
down_revision: str | None = "0008_popular_key_bindings"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "embedding_salts",
        sa.Column("graph_version", sa.String(length=64), nullable=False),
        sa.Column("salt", sa.String(length=128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("graph_version", name="pk_embedding_salts"),
    )


def downgrade() -> None:
    op.drop_table("embedding_salts")
