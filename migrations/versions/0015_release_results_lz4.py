"""PostgreSQL: a release's stored results compressed with LZ4 instead of pglz.

A release's ``results`` (about 17 kB of base64 for its top 1,000) is compressed when it is
written. With pglz that took about 0.4 ms of the server's time per release, most of the time of
storing a 200-seed batch (measured: 200 stored releases in 106 ms with pglz, 26 ms with LZ4,
25 ms uncompressed; stored 7.1 kB, 8.9 kB and 17.1 kB a release). LZ4 applies to values written
from now on; those written before stay pglz and read as before (PostgreSQL keeps the method
with each value). Nothing changes on SQLite, or on a PostgreSQL built without LZ4 (the column
keeps pglz: only the speed of storing differs). Downgrade: pglz again for new values.

Revision ID: 0015_release_results_lz4
Revises: 0014_quota_buckets
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015_release_results_lz4"
down_revision: str | None = "0014_quota_buckets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _compress_results_with(method: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # A server built without LZ4 refuses the method (feature_not_supported): keep pglz there.
    op.execute(
        "DO $$ BEGIN "
        f"ALTER TABLE releases ALTER COLUMN results SET COMPRESSION {method}; "
        "EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN NULL; "
        "END $$"
    )


def upgrade() -> None:
    _compress_results_with("lz4")


def downgrade() -> None:
    _compress_results_with("pglz")
