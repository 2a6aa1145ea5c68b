"""Admin dashboard: durable refusals, and indexes for the admin views.

* ``refusals``: every query the ledger refused (budget, service quota, graph-wide cap, mode),
  so refusals by reason survive restarts and add up over every worker.
* ``ix_spend_epsilon_account_id``: the accounts table sorted by spent eps, ties by id.
* ``ix_charges_created_at``: per-hour queries and eps over a recent window.
* ``ix_audit_log_target_account_id``, ``ix_audit_log_action``: the filterable audit log.

Revision ID: 0003_admin_dashboard
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_admin_dashboard"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "refusals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("charged_account_id", sa.Integer(), nullable=True),
        sa.Column("principal_account_id", sa.Integer(), nullable=True),
        sa.Column("mode", sa.String(length=32), nullable=True),
        sa.Column("epsilon", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["charged_account_id"],
            ["accounts.id"],
            name="fk_refusals_charged_account_id_accounts",
        ),
        sa.ForeignKeyConstraint(
            ["principal_account_id"],
            ["accounts.id"],
            name="fk_refusals_principal_account_id_accounts",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_refusals"),
    )
    op.create_index("ix_refusals_created_at", "refusals", ["created_at"])
    op.create_index("ix_charges_created_at", "charges", ["created_at"])
    op.create_index("ix_spend_epsilon_account_id", "spend", ["epsilon", "account_id"])
    op.create_index("ix_audit_log_target_account_id", "audit_log", ["target_account_id"])
    op.create_index("ix_audit_log_action", "audit_log", ["action"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_action", table_name="audit_log")
    op.drop_index("ix_audit_log_target_account_id", table_name="audit_log")
    op.drop_index("ix_spend_epsilon_account_id", table_name="spend")
    op.drop_index("ix_charges_created_at", table_name="charges")
    op.drop_index("ix_refusals_created_at", table_name="refusals")
    op.drop_table("refusals")
