"""Charge states, in-flight twins, service-account scopes, spend in SQL, graph-wide exposure.

* ``charges.state`` (admitted -> released | refunded), ``release_key``, ``exposure_shard``,
  ``settled_at``; the Idempotency-Key is unique among live (unrefunded) charges only, so a
  key whose request died can be retried once its charge is reconciled.
* ``accounts.allow_create_seed_accounts`` becomes ``may_create_seed_accounts``; service
  accounts gain ``modes`` (default ``edge`` only) and ``quota_epsilon``.
* ``spend.epsilon`` (the spend converted at the account's delta) and ``spend.last_charge_at``.
* ``releases.mechanism_name`` joins the release key.
* ``exposure_shards`` (the graph-wide composed curve, in 16 rows) and ``graph_releases``.

Existing rows are brought along: a charge with a refund is ``refunded``, one with a stored
release ``released``, any other ``admitted`` (``ledger reconcile`` settles those).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import sqlalchemy as sa
from alembic import op

from service.privacy.accountant import RdpCurve

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
SHARDS = 16
LIVE = "state <> 'refunded'"


def _dump(curve: RdpCurve) -> str:
    return json.dumps(curve.to_json(), separators=(",", ":"), sort_keys=True)


def upgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.alter_column("allow_create_seed_accounts", new_column_name="may_create_seed_accounts")
        batch.add_column(
            sa.Column("modes", sa.String(length=64), nullable=False, server_default="edge")
        )
        batch.add_column(sa.Column("quota_epsilon", sa.Double(), nullable=True))

    with op.batch_alter_table("spend") as batch:
        batch.add_column(sa.Column("epsilon", sa.Double(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("last_charge_at", TS, nullable=True))
        batch.create_index("ix_spend_epsilon", ["epsilon"])

    with op.batch_alter_table("charges") as batch:
        batch.drop_constraint("uq_charges_principal_account_id_idempotency_key", type_="unique")
        batch.add_column(
            sa.Column("state", sa.String(length=16), nullable=False, server_default="admitted")
        )
        batch.add_column(sa.Column("release_key", sa.String(length=64), nullable=True))
        batch.add_column(
            sa.Column("exposure_shard", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("settled_at", TS, nullable=True))
        batch.create_check_constraint(
            "state", "state IN ('admitted', 'released', 'refunded')"
        )

    conn = op.get_bind()
    conn.execute(
        sa.text(
            "UPDATE charges SET state = 'refunded' "
            "WHERE EXISTS (SELECT 1 FROM refunds WHERE refunds.charge_id = charges.id)"
        )
    )
    conn.execute(
        sa.text(
            "UPDATE charges SET state = 'released' WHERE state = 'admitted' "
            "AND EXISTS (SELECT 1 FROM releases WHERE releases.charge_id = charges.id)"
        )
    )
    conn.execute(sa.text(f"UPDATE charges SET exposure_shard = id % {SHARDS}"))
    op.create_index(
        "uq_charges_idempotency_live",
        "charges",
        ["principal_account_id", "idempotency_key"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )
    op.create_index("ix_charges_state_created_at", "charges", ["state", "created_at"])
    op.create_index("ix_charges_release_key", "charges", ["charged_account_id", "release_key"])
    op.create_index(
        "ix_charges_principal_created_at", "charges", ["principal_account_id", "created_at"]
    )

    with op.batch_alter_table("releases") as batch:
        batch.add_column(
            sa.Column(
                "mechanism_name", sa.String(), nullable=False, server_default="noisy_diffusion"
            )
        )
        batch.drop_index("ix_releases_key")
        batch.create_index(
            "ix_releases_key",
            ["charged_account_id", "node", "graph_version", "mode", "epsilon", "mechanism_name"],
        )

    shards = op.create_table(
        "exposure_shards",
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("rdp", sa.Text(), nullable=False),
        sa.Column("pure_epsilon", sa.Double(), nullable=False),
        sa.Column("charges", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("shard", name="pk_exposure_shards"),
    )
    op.create_table(
        "graph_releases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("graph_version", sa.String(), nullable=False),
        sa.Column("mechanism", sa.String(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("rdp", sa.Text(), nullable=False),
        sa.Column("pure_epsilon", sa.Double(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("exposure_shard", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("settled_at", TS, nullable=True),
        sa.CheckConstraint(
            "state IN ('admitted', 'released', 'refunded')", name="ck_graph_releases_state"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_graph_releases"),
    )
    op.create_index(
        "uq_graph_releases_live",
        "graph_releases",
        ["graph_version", "mechanism"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )

    # Bring the derived state along: each account's spend at its delta, its last charge, and
    # the graph-wide exposure of every live charge so far.
    now = datetime.now(UTC)
    totals = [RdpCurve.zero() for _ in range(SHARDS)]
    counts = [0] * SHARDS
    for shard, rdp in conn.execute(
        sa.text("SELECT exposure_shard, rdp FROM charges WHERE state <> 'refunded'")
    ):
        totals[shard] = totals[shard] + RdpCurve.from_json(json.loads(rdp))
        counts[shard] += 1
    op.bulk_insert(
        shards,
        [
            {
                "shard": i,
                "rdp": _dump(totals[i]),
                "pure_epsilon": totals[i].pure,
                "charges": counts[i],
                "updated_at": now,
            }
            for i in range(SHARDS)
        ],
    )
    rows = conn.execute(
        sa.text(
            "SELECT spend.account_id, spend.rdp, budgets.delta FROM spend "
            "JOIN budgets ON budgets.account_id = spend.account_id"
        )
    ).all()
    for account_id, rdp, delta in rows:
        epsilon = RdpCurve.from_json(json.loads(rdp)).epsilon(float(delta))
        conn.execute(
            sa.text(
                "UPDATE spend SET epsilon = :epsilon, last_charge_at = "
                "(SELECT max(created_at) FROM charges WHERE charged_account_id = :account_id) "
                "WHERE account_id = :account_id"
            ),
            {"epsilon": float(np.float64(epsilon)), "account_id": account_id},
        )


def downgrade() -> None:
    raise RuntimeError("the ledger schema cannot be downgraded: nothing in it is ever deleted")
