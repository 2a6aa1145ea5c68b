"""Synthesis runs as jobs, and heartbeats on graph-wide releases.

* ``graph_releases.heartbeat_at``: the drawing process's last sign of life. The reconciler
  refunds an ``admitted`` release only once it (or ``created_at`` where it is NULL, as on every
  release made before this revision) is older than its limit, so a long synthesis run that keeps
  beating is never refunded mid-run.
* ``synthesis_jobs``: one row per synthesis run (command line or ``POST /v1/admin/synthetic``)
  with its release, method, parameters, privacy unit, state and progress.
* Backfill: every synthesis run made before this revision (a ``graph_releases`` row named
  ``synthetic:<method>:<id>``) gets its job row, from its payload's header where it was
  released (``done``), else ``failed`` (refunded) or ``running`` (still admitted: the reconciler
  settles it), with ``source = 'cli'`` (the only way to run one before).

Revision ID: 0007_synthesis_jobs
Revises: 0006_idempotency_binding
Create Date: 2026-11-25
"""

from __future__ import annotations

import gzip
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0007_synthesis_jobs"
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


    _backfill()


_STATES = {"released": "done", "refunded": "failed", "admitted": "running"}


def _header(payload: bytes | None) -> dict[str, Any]:
    if payload is None:
        return {}
    try:
        head = gzip.decompress(bytes(payload)).partition(b"\n")[0]
        value = json.loads(head)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _backfill() -> None:
    bind = op.get_bind()
    releases = sa.table(
        "graph_releases",
        sa.column("id", sa.Integer()), sa.column("graph_version", sa.String()),
        sa.column("mechanism", sa.String()), sa.column("epsilon", sa.Double()),
        sa.column("state", sa.String()), sa.column("payload", sa.LargeBinary()),
        sa.column("created_at", TS), sa.column("settled_at", TS),
    )  # fmt: skip
    jobs = sa.table(
        "synthesis_jobs",
        *(sa.column(name) for name in (
            "id", "release_id", "graph_version", "method", "privacy_unit", "epsilon", "delta",
            "parameters", "source", "state", "progress", "nodes", "edges", "sha256", "note",
            "error_code", "error_message", "created_at", "heartbeat_at", "finished_at",
        )),
    )  # fmt: skip
    rows = bind.execute(
        sa.select(releases).where(releases.c.mechanism.like("synthetic:%")).order_by(releases.c.id)
    ).all()
    for row in rows:
        parts = row.mechanism.split(":")
        method = parts[1] if len(parts) > 1 else "unknown"
        job_id = parts[2] if len(parts) > 2 and re.fullmatch(r"[0-9a-f]{32}", parts[2]) else None
        header = _header(row.payload) if row.state == "released" else {}
        state = _STATES[row.state]
        bind.execute(
            jobs.insert().values(
                id=job_id or uuid.uuid4().hex,
                release_id=row.id,
                graph_version=row.graph_version,
                method=method[:32],
                privacy_unit=str(header.get("privacy_unit", "node" if method == "privdpr" else "edge")),
                epsilon=float(header.get("epsilon", row.epsilon)),
                delta=float(header.get("delta", 0.0)),
                parameters=json.dumps(header.get("parameters", {}), separators=(",", ":"),
                                      sort_keys=True),
                source="cli",
                state=state,
                progress=1.0 if state == "done" else 0.0,
                nodes=header.get("nodes"),
                edges=header.get("edges"),
                sha256=header.get("sha256"),
                note=header.get("note") or None,
                error_code="interrupted" if state == "failed" else None,
                error_message="refunded before this revision" if state == "failed" else None,
                created_at=row.created_at,
                heartbeat_at=row.created_at,
                finished_at=row.settled_at,
            )
        )  # fmt: skip


def downgrade() -> None:
    op.drop_table("synthesis_jobs")
    # A plain DROP COLUMN (SQLite >= 3.35), as in 0005: a batch copy of ``graph_releases``
    # would drop a table that ``service_reads`` rows reference, which SQLite's foreign keys
    # refuse once a service account has read a graph-wide release.
    op.drop_column("graph_releases", "heartbeat_at")
