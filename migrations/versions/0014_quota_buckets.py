"""Quota buckets: a service account's live charges to other accounts, summed by the minute.

The 24-hour quota reads these (at most 1,440 rows) and the charges of the one bucket its window
starts in, instead of every charge of the window (service/ledger/quota_buckets.py). Backfill:
every live charge to another account is added to its principal's bucket, the start of the
minute (from the Unix epoch, UTC) its ``created_at`` falls in.

Revision ID: 0014_quota_buckets
Revises: 0013_budget_periods
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0014_quota_buckets"
down_revision: str | None = "0013_budget_periods"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
#: The bucket width this revision fills the table with (quota_buckets.QUOTA_BUCKET).
BUCKET_SECONDS = 60


def _bucket_start(moment: datetime) -> datetime:
    at = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    width = BUCKET_SECONDS * 1_000_000
    elapsed = (at - epoch) // timedelta(microseconds=1)
    return epoch + timedelta(microseconds=elapsed - elapsed % width)


def upgrade() -> None:
    buckets = op.create_table(
        "quota_buckets",
        sa.Column("principal_account_id", sa.Integer(), nullable=False),
        sa.Column("bucket_start", TS, nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("charges", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["principal_account_id"], ["accounts.id"],
            name="fk_quota_buckets_principal_account_id_accounts",
        ),
        sa.PrimaryKeyConstraint("principal_account_id", "bucket_start", name="pk_quota_buckets"),
    )  # fmt: skip
    charges = sa.table(
        "charges",
        sa.column("principal_account_id", sa.Integer()),
        sa.column("charged_account_id", sa.Integer()),
        sa.column("created_at", TS),
        sa.column("epsilon", sa.Double()),
        sa.column("state", sa.String()),
    )
    live_to_others = (
        sa.select(charges.c.principal_account_id, charges.c.created_at, charges.c.epsilon)
        .where(charges.c.principal_account_id != charges.c.charged_account_id)
        .where(charges.c.state != "refunded")
    )
    totals: dict[tuple[int, datetime], tuple[float, int]] = {}
    for principal, created_at, epsilon in op.get_bind().execute(live_to_others):
        key = (int(principal), _bucket_start(created_at))
        eps, count = totals.get(key, (0.0, 0))
        totals[key] = (eps + float(epsilon), count + 1)
    rows = [
        {"principal_account_id": p, "bucket_start": start, "epsilon": eps, "charges": count}
        for (p, start), (eps, count) in sorted(totals.items())
    ]
    if rows:
        op.bulk_insert(buckets, rows)


def downgrade() -> None:
    op.drop_table("quota_buckets")
