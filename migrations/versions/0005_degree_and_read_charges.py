"""Degree-release charges per account, and what each service account has read.

* ``uq_charges_degree_release_live``: an account pays for a graph version's DP degree release
  (a charge with mechanism ``degree_release``) at most once per version and scale; the
  database, not a worker, decides.
* ``service_reads``: every distinct release a service account received (a query's release,
  fresh or replayed, or a graph-wide release), each counted once per reader.
* ``read_totals``: a service account's read figure, the composition of its ``service_reads``.
* ``accounts.read_cap_epsilon``: an optional cap on that figure (NULL: the configured default).

Existing ledgers carry over unchanged: no account has paid a degree release yet, and no
service account has a read figure until its next answer.

Revision ID: 0005_degree_and_read_charges
Revises: 0004_graph_identity
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_degree_and_read_charges"
down_revision: str | None = "0004_graph_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
DEGREE_LIVE = "mechanism = 'degree_release' AND state <> 'refunded'"


def upgrade() -> None:
    op.add_column("accounts", sa.Column("read_cap_epsilon", sa.Double(), nullable=True))
    op.create_index(
        "uq_charges_degree_release_live",
        "charges",
        ["charged_account_id", "graph_version", "epsilon"],
        unique=True,
        sqlite_where=sa.text(DEGREE_LIVE),
        postgresql_where=sa.text(DEGREE_LIVE),
    )
    op.create_table(
        "service_reads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("reader_account_id", sa.Integer(), nullable=False),
        sa.Column("charge_id", sa.Integer(), nullable=True),
        sa.Column("graph_release_id", sa.Integer(), nullable=True),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("rdp", sa.Text(), nullable=False),
        sa.Column("pure_epsilon", sa.Double(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.CheckConstraint(
            "(charge_id IS NULL) <> (graph_release_id IS NULL)",
            name="ck_service_reads_one_release",
        ),
        sa.ForeignKeyConstraint(
            ["reader_account_id"], ["accounts.id"],
            name="fk_service_reads_reader_account_id_accounts",
        ),
        sa.ForeignKeyConstraint(
            ["charge_id"], ["charges.id"], name="fk_service_reads_charge_id_charges"
        ),
        sa.ForeignKeyConstraint(
            ["graph_release_id"], ["graph_releases.id"],
            name="fk_service_reads_graph_release_id_graph_releases",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_service_reads"),
    )  # fmt: skip
    op.create_index(
        "uq_service_reads_charge", "service_reads", ["reader_account_id", "charge_id"], unique=True
    )
    op.create_index(
        "uq_service_reads_graph_release",
        "service_reads",
        ["reader_account_id", "graph_release_id"],
        unique=True,
    )
    op.create_table(
        "read_totals",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("rdp", sa.Text(), nullable=False),
        sa.Column("pure_epsilon", sa.Double(), nullable=False),
        sa.Column("releases", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_read_totals_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("account_id", name="pk_read_totals"),
    )


def downgrade() -> None:
    op.drop_table("read_totals")
    op.drop_index("uq_service_reads_graph_release", table_name="service_reads")
    op.drop_index("uq_service_reads_charge", table_name="service_reads")
    op.drop_table("service_reads")
    op.drop_index("uq_charges_degree_release_live", table_name="charges")
    # A plain DROP COLUMN (SQLite >= 3.35): a batch copy of ``accounts`` would drop a table that
    # other tables' rows reference, which SQLite's foreign keys refuse on a ledger with data.
    op.drop_column("accounts", "read_cap_epsilon")
