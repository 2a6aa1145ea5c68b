"""The ledger's initial schema: accounts, keys, budgets, spend, charges, refunds, releases, audit.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.privacy.orders import GRID_VERSION, grid_fingerprint

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(), nullable=True),
        sa.Column("user_node_id", sa.String(), nullable=True),
        sa.Column("label", sa.String(), nullable=True),
        sa.Column("allow_create_seed_accounts", sa.Boolean(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.CheckConstraint("type IN ('user', 'service', 'admin')", name="ck_accounts_type"),
        sa.CheckConstraint(
            "(type = 'user' AND node_id IS NOT NULL AND user_node_id = node_id)"
            " OR (type <> 'user' AND node_id IS NULL AND user_node_id IS NULL)",
            name="ck_accounts_node_binding",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_accounts"),
        sa.UniqueConstraint("user_node_id", name="uq_accounts_user_node_id"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_api_keys_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_account_id", "api_keys", ["account_id"])
    op.create_table(
        "budgets",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("cap_epsilon", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.CheckConstraint("cap_epsilon > 0", name="ck_budgets_cap_positive"),
        sa.CheckConstraint("delta > 0 AND delta < 1", name="ck_budgets_delta_range"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_budgets_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("account_id", name="pk_budgets"),
    )
    op.create_table(
        "spend",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("rdp", sa.Text(), nullable=False),
        sa.Column("pure_epsilon", sa.Double(), nullable=False),
        sa.Column("grid_version", sa.Integer(), nullable=False),
        sa.Column("charges", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_spend_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("account_id", name="pk_spend"),
    )
    op.create_table(
        "charges",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("charged_account_id", sa.Integer(), nullable=False),
        sa.Column("principal_account_id", sa.Integer(), nullable=False),
        sa.Column("seed", sa.String(), nullable=False),
        sa.Column("mechanism", sa.String(), nullable=False),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("rdp", sa.Text(), nullable=False),
        sa.Column("pure_epsilon", sa.Double(), nullable=False),
        sa.Column("grid_version", sa.Integer(), nullable=False),
        sa.Column("graph_version", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(
            ["charged_account_id"], ["accounts.id"],
            name="fk_charges_charged_account_id_accounts",
        ),  # fmt: skip
        sa.ForeignKeyConstraint(
            ["principal_account_id"], ["accounts.id"],
            name="fk_charges_principal_account_id_accounts",
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("id", name="pk_charges"),
        sa.UniqueConstraint(
            "principal_account_id", "idempotency_key",
            name="uq_charges_principal_account_id_idempotency_key",
        ),  # fmt: skip
    )
    op.create_index("ix_charges_charged_account_id", "charges", ["charged_account_id"])
    op.create_table(
        "refunds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("charge_id", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["charge_id"], ["charges.id"], name="fk_refunds_charge_id_charges"),
        sa.PrimaryKeyConstraint("id", name="pk_refunds"),
        sa.UniqueConstraint("charge_id", name="uq_refunds_charge_id"),
    )
    op.create_table(
        "releases",
        sa.Column("charge_id", sa.Integer(), nullable=False),
        sa.Column("charged_account_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("graph_version", sa.String(), nullable=False),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("results", sa.Text(), nullable=False),
        sa.Column("mechanism", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("principal_account_id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["charge_id"], ["charges.id"], name="fk_releases_charge_id_charges"
        ),
        sa.ForeignKeyConstraint(
            ["charged_account_id"], ["accounts.id"],
            name="fk_releases_charged_account_id_accounts",
        ),  # fmt: skip
        sa.ForeignKeyConstraint(
            ["principal_account_id"], ["accounts.id"],
            name="fk_releases_principal_account_id_accounts",
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("charge_id", name="pk_releases"),
    )
    op.create_index(
        "ix_releases_key",
        "releases",
        ["charged_account_id", "node", "graph_version", "mode", "epsilon"],
    )
    op.create_index(
        "ix_releases_idempotency", "releases", ["principal_account_id", "idempotency_key"]
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("actor_account_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("target_account_id", sa.Integer(), nullable=True),
        sa.Column("details", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["actor_account_id"], ["accounts.id"],
            name="fk_audit_log_actor_account_id_accounts",
        ),  # fmt: skip
        sa.ForeignKeyConstraint(
            ["target_account_id"], ["accounts.id"],
            name="fk_audit_log_target_account_id_accounts",
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    meta = op.create_table(
        "ledger_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_ledger_meta"),
    )
    # The order grid every stored curve is evaluated on. Changing the grid means a new
    # migration that converts the stored curves and updates these two rows.
    op.bulk_insert(
        meta,
        [
            {"key": "grid_version", "value": str(GRID_VERSION)},
            {"key": "grid_fingerprint", "value": grid_fingerprint()},
            # Identifies this ledger (e.g. to namespace caches shared by several ledgers).
            {"key": "ledger_id", "value": uuid.uuid4().hex},
        ],
    )


def downgrade() -> None:
    # The ledger is the record of every user's privacy spend: dropping it would silently
    # reset budgets. Restore a backup instead.
    raise RuntimeError("the ledger schema cannot be downgraded: nothing in it is ever deleted")
