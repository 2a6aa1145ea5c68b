"""Budget periods: ``budgets.period`` and ``period_cap_epsilon``, ``charges.period_start``.

An account may have a cap per UTC day, week or month on top of its lifetime cap (both
columns NULL: none, as every account before this migration). Every charge records the start
of the UTC day it was admitted on (the smallest period; a week or a month is a run of days),
so admission composes the charges of the current period from the ledger with one indexed
read. Backfill: every existing charge gets 00:00 UTC of its ``created_at``'s day (naive UTC
text on SQLite, as SQLAlchemy writes it).

Revision ID: 0013_budget_periods
Revises: 0012_charge_heartbeat
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_budget_periods"
down_revision: str | None = "0012_charge_heartbeat"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("budgets", sa.Column("period", sa.String(8), nullable=True))
    op.add_column("budgets", sa.Column("period_cap_epsilon", sa.Double(), nullable=True))
    op.add_column("charges", sa.Column("period_start", TS, nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "UPDATE charges SET period_start = substr(created_at, 1, 10) || ' 00:00:00.000000'"
        )
    else:
        op.execute(
            "UPDATE charges SET period_start = "
            "date_trunc('day', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        )
    op.create_index("ix_charges_period", "charges", ["charged_account_id", "period_start"])


def downgrade() -> None:
    op.drop_index("ix_charges_period", table_name="charges")
    op.drop_column("charges", "period_start")  # SQLite 3.35 and later drop a column in place
    op.drop_column("budgets", "period_cap_epsilon")
    op.drop_column("budgets", "period")
