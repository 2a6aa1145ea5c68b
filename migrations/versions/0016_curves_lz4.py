"""PostgreSQL: the stored RDP curves compressed with LZ4 instead of pglz.

Every charge and every service account's read carries its RDP curve as JSON text (about 2.2 kB
for the 100 orders of a diffusion query), so a 200-seed batch writes 400 of them, each in a row
over PostgreSQL's 2 kB threshold: the server tries to compress every one. pglz's attempt took
about 21 us a curve, and then kept it uncompressed (it saved too little); LZ4 takes a fraction
of that and keeps it about 20% smaller. Measured on PostgreSQL 15, 200 rows of a charge's curve
inserted in one transaction: 6.8 ms with pglz, 2.6 ms uncompressed, 2.0 ms with LZ4 (2,210 B
and 1,768 B a curve). The running totals' curves (spend, exposure shards, read totals, graph
releases) are rewritten on every admission and change the same way. LZ4 applies to values
written from now on; those written before stay as they are and read as before (PostgreSQL
keeps the method with each value). Nothing changes on SQLite, or on a PostgreSQL built
without LZ4 (the columns keep pglz: only the speed of writing differs). Downgrade: pglz again
for new values.

Revision ID: 0016_curves_lz4
Revises: 0015_release_results_lz4
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016_curves_lz4"
down_revision: str | None = "0015_release_results_lz4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables whose ``rdp`` column holds a curve: each charge's, each service account's read,
#: and the running totals admission rewrites.
CURVE_TABLES = (
    "charges",
    "service_reads",
    "spend",
    "exposure_shards",
    "read_totals",
    "graph_releases",
)


def _compress_curves_with(method: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in CURVE_TABLES:
        # A server built without LZ4 refuses the method (feature_not_supported): keep pglz there.
        op.execute(
            "DO $$ BEGIN "
            f"ALTER TABLE {table} ALTER COLUMN rdp SET COMPRESSION {method}; "
            "EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN NULL; "
            "END $$"
        )


def upgrade() -> None:
    _compress_curves_with("lz4")


def downgrade() -> None:
    _compress_curves_with("pglz")
