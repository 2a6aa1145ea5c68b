"""Synthetic-release charges per account.

An account that receives an answer of a sandbox (a synthetic release served by ``serve``) pays
for that release once, like a graph version's degree release: a charge with mechanism
``synthetic_release`` whose new column ``graph_release_id`` names the release, and a partial
UNIQUE index (``uq_charges_synthetic_release_live``: account, release, among live charges of
that kind) lets the database refuse a second one, whatever the number of workers.

Existing ledgers carry over unchanged: no account has paid for a synthetic release yet (a
sandbox answered for nothing before). A ledger taken back below this revision keeps the
charges it holds (still folded into each account's spend: never understated; the code of
those revisions does not know them), and brought forward again each gets its release back
from the name its parameters record.

Revision ID: 0011_synthetic_release_charges
Revises: 0010_sampler_share
Create Date: 2026-11-28
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_synthetic_release_charges"
down_revision: str | None = "0010_sampler_share"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SYNTHETIC_LIVE = "mechanism = 'synthetic_release' AND state <> 'refunded'"


FOREIGN_KEY = "fk_charges_graph_release_id_graph_releases"


def _sqlite() -> bool:
    return bool(op.get_bind().dialect.name == "sqlite")


def upgrade() -> None:
    if _sqlite():
        # a plain ADD COLUMN: a batch rebuild of ``charges`` would drop the table other
        # tables' rows refer to (the foreign keys are enforced)
        op.execute(
            "ALTER TABLE charges ADD COLUMN graph_release_id INTEGER "
            f"CONSTRAINT {FOREIGN_KEY} REFERENCES graph_releases (id)"
        )
    else:
        op.add_column("charges", sa.Column("graph_release_id", sa.Integer(), nullable=True))
        op.create_foreign_key(
            FOREIGN_KEY, "charges", "graph_releases", ["graph_release_id"], ["id"]
        )
    conn = op.get_bind()
    kept = conn.execute(
        sa.text(
            "SELECT id, graph_version, params FROM charges "
            "WHERE mechanism = 'synthetic_release' AND graph_release_id IS NULL"
        )
    ).all()
    for charge_id, version, params in kept:  # charges kept through a downgrade
        name = json.loads(params).get("release")
        release_id = conn.execute(
            sa.text(
                "SELECT id FROM graph_releases WHERE graph_version = :v AND mechanism = :m "
                "AND state <> 'refunded'"
            ),
            {"v": version, "m": name},
        ).scalar()
        if release_id is not None:
            conn.execute(
                sa.text("UPDATE charges SET graph_release_id = :r WHERE id = :c"),
                {"r": release_id, "c": charge_id},
            )
    op.create_index(
        "uq_charges_synthetic_release_live",
        "charges",
        ["charged_account_id", "graph_release_id"],
        unique=True,
        sqlite_where=sa.text(SYNTHETIC_LIVE),
        postgresql_where=sa.text(SYNTHETIC_LIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_charges_synthetic_release_live", table_name="charges")
    if _sqlite():
        op.execute("ALTER TABLE charges DROP COLUMN graph_release_id")  # SQLite >= 3.35
    else:
        op.drop_constraint(FOREIGN_KEY, "charges", type_="foreignkey")
        op.drop_column("charges", "graph_release_id")
