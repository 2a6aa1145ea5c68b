"""Public graph ids: ``graph_versions`` maps each content fingerprint to a random public id.

Callers see a graph version's public id only; its content fingerprint (a hash of the edges)
stays internal. Versions a ledger recorded before this revision (in charges, releases, graph
releases and the current-version record) were the fingerprint itself, already shown to
callers: each keeps that value as its public id, so stored answers, replays and budgets stay
as they were. A graph loaded from now on whose fingerprint is not recorded gets a random id.

Revision ID: 0004_graph_identity
Revises: 0003_admin_dashboard
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0004_graph_identity"
down_revision: str | None = "0003_admin_dashboard"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    graph_versions = op.create_table(
        "graph_versions",
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("public_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name="pk_graph_versions"),
        sa.UniqueConstraint("public_id", name="uq_graph_versions_public_id"),
    )
    conn = op.get_bind()
    recorded: set[str] = set()
    for table in ("charges", "releases", "graph_releases"):
        rows = conn.execute(sa.text(f"SELECT DISTINCT graph_version FROM {table}"))
        recorded.update(str(row[0]) for row in rows if row[0])
    current = conn.execute(
        sa.text("SELECT value FROM ledger_meta WHERE key = 'current_graph_version'")
    ).scalar()
    if current:
        recorded.add(str(current))
    now = datetime.now(UTC)
    if conn.dialect.name == "sqlite":  # naive UTC text, as the ledger's Timestamp type writes
        now = now.replace(tzinfo=None)
    if recorded:
        op.bulk_insert(
            graph_versions,
            [{"fingerprint": v, "public_id": v, "created_at": now} for v in sorted(recorded)],
        )


def downgrade() -> None:
    op.drop_table("graph_versions")
