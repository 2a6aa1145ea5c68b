"""Synthesis runs as jobs, and heartbeats on graph-wide releases.

* ``graph_releases.heartbeat_at``: the drawing process's last sign of life. The reconciler
  refunds an ``admitted`` release only once it (or ``created_at`` where it is NULL, as on every
  release made before this revision) is older than its limit, so a long synthesis run that keeps
  beating is never refunded mid-run.
* ``synthesis_jobs``: one row per synthesis run (command line or ``POST /v1/admin/synthetic``)
  with its release, method, parameters, privacy unit, state and progress. Runs made before this
  revision have no row (their releases stay in ``graph_releases``).

Revision ID: 0011_synthesis_jobs
Revises: 0006_idempotency_binding
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_synthesis_jobs"
down_revision: str | None = "0006_idempotency_binding"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("graph_releases") as batch:
        batch.add_column(sa.Column("heartbeat_at", TS, nullable=True))
    op.create_table(
        "synthesis_jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("release_id", sa.Integer(), nullable=False),
        sa.Column("graph_version", sa.String(), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=False),
        sa.Column("privacy_unit", sa.String(length=8), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("parameters", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("actor_account_id", sa.Integer(), nullable=True),
        sa.Column("nodes", sa.Integer(), nullable=True),
        sa.Column("edges", sa.Integer(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("heartbeat_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.CheckConstraint(
            "state IN ('running', 'done', 'failed')", name="ck_synthesis_jobs_state"
        ),
        sa.CheckConstraint("source IN ('cli', 'api')", name="ck_synthesis_jobs_source"),
        sa.ForeignKeyConstraint(
            ["release_id"], ["graph_releases.id"], name="fk_synthesis_jobs_release_id_graph_releases"
        ),
        sa.ForeignKeyConstraint(
            ["actor_account_id"],
            ["accounts.id"],
            name="fk_synthesis_jobs_actor_account_id_accounts",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_synthesis_jobs"),
        sa.UniqueConstraint("release_id", name="uq_synthesis_jobs_release_id"),
    )


def downgrade() -> None:
    op.drop_table("synthesis_jobs")
    with op.batch_alter_table("graph_releases") as batch:
        batch.drop_column("heartbeat_at")
