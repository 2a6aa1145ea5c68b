"""Idempotency-Keys of ``popular`` answers bind too.

A ``popular`` answer has no charge of its own: it ranks the graph version's degree release,
which the charged account pays for once per version. Its key now binds (kind ``popular``) to
that account's degree-release charge, with the query's ``seed`` and ``mode`` (the rest of the
query, the account, graph version and epsilon, are the charge's), under the same partial
UNIQUE index as every other binding. Nothing to backfill: popular keys were never recorded.

Revision ID: 0008_popular_key_bindings
Revises: 0007_synthesis_jobs
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_popular_key_bindings"
down_revision: str | None = "0007_synthesis_jobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS_BEFORE = "kind IN ('charged', 'joined', 'replayed')"
KINDS = "kind IN ('charged', 'joined', 'replayed', 'popular')"
#: The names the kind check may have (0006's went through the naming convention twice).
OLD_KIND_NAMES = (
    "ck_idempotency_bindings_ck_idempotency_bindings_kind",
    "ck_idempotency_bindings_kind",
)
POPULAR_SHAPE = "(kind = 'popular') = (seed IS NOT NULL AND mode IS NOT NULL)"


def _kind_checks() -> list[str]:
    """The names the kind check has in this database (0006 named it twice over)."""
    found = sa.inspect(op.get_bind()).get_check_constraints("idempotency_bindings")
    return [str(c["name"]) for c in found if c.get("name") in OLD_KIND_NAMES]


def upgrade() -> None:
    old = _kind_checks()
    with op.batch_alter_table("idempotency_bindings") as batch:
        batch.add_column(sa.Column("seed", sa.String(), nullable=True))
        batch.add_column(sa.Column("mode", sa.String(length=16), nullable=True))
        for name in old:
            batch.drop_constraint(op.f(name), type_="check")
        batch.create_check_constraint("kind", KINDS)
        batch.create_check_constraint("popular_query", POPULAR_SHAPE)


def downgrade() -> None:
    op.execute("DELETE FROM idempotency_bindings WHERE kind = 'popular'")
    with op.batch_alter_table("idempotency_bindings") as batch:
        batch.drop_constraint(op.f("ck_idempotency_bindings_popular_query"), type_="check")
        batch.drop_constraint(op.f("ck_idempotency_bindings_kind"), type_="check")
        batch.create_check_constraint(op.f(OLD_KIND_NAMES[0]), KINDS_BEFORE)
        batch.drop_column("mode")
        batch.drop_column("seed")
