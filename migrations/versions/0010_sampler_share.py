"""The float sampler's share of delta, carried by the curves of count releases.

A count release (``common_neighbours``, ``friends_of_friends``, ``blended``'s counts, the DP
degree vector behind ``popular`` and ``blended``) drawn by the float64 sampler differs from its
exact-noise twin, on the coordinates one edge changes, with probability at most 2e-11
(``service.privacy.sampler.count_release_tv``). Its curve now carries that as ``sampler_tv``,
and the accountant converts an account's composed curve at
``delta - (1 + e^eps) * (sum of sampler_tv)`` (docs/privacy.md, section 5).

Charges written before carry the Laplace curve alone. This migration adds the share to every
count charge (any state), every degree release and every service read of one, and adds the
live ones' shares to the composed rows: each account's spend (and its epsilon, converted again
at the account's delta), each service account's read total and each exposure shard. So a ledger
written before accounts for its old count answers too, and ``ledger verify`` holds after it.

Revision ID: 0010_sampler_share
Revises: 0009_embedding_salts
Create Date: 2026-11-25
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from service.privacy.accountant import RdpCurve

revision: str = "0010_sampler_share"
down_revision: str | None = "0009_embedding_salts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: One count release's share (2 changed coordinates x 1e-11), fixed at this revision.
COUNT_RELEASE_TV = 2e-11
COUNT_CHARGES = ("common_neighbours", "friends_of_friends", "blended", "popular", "degree_release")
DEGREE_RELEASES = "popular_degrees:%"


def _encode(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _shifted(text: str, tv: float) -> str:
    """The stored curve ``text`` with ``tv`` added to its sampler share."""
    return _encode(RdpCurve.from_json(json.loads(text)).with_sampler_tv(tv).to_json())


def _mark_releases(conn: sa.Connection, table: str, where: str) -> set[int]:
    """Add the share to the stored curve of every matching row that has none; their ids."""
    marked: set[int] = set()
    for row_id, rdp in conn.execute(sa.text(f"SELECT id, rdp FROM {table} WHERE {where}")):
        if "sampler_tv" in json.loads(rdp):
            continue
        conn.execute(
            sa.text(f"UPDATE {table} SET rdp = :rdp WHERE id = :id"),
            {"rdp": _shifted(rdp, COUNT_RELEASE_TV), "id": row_id},
        )
        marked.add(int(row_id))
    return marked


def upgrade() -> None:
    conn = op.get_bind()
    names = ", ".join(f"'{name}'" for name in COUNT_CHARGES)
    charges = _mark_releases(conn, "charges", f"mechanism IN ({names})")
    releases = _mark_releases(conn, "graph_releases", f"mechanism LIKE '{DEGREE_RELEASES}'")
    if not charges and not releases:
        return
    # service reads copy their release's curve
    reads: Counter[int] = Counter()
    for read_id, reader, charge_id, release_id, rdp in conn.execute(
        sa.text("SELECT id, reader_account_id, charge_id, graph_release_id, rdp FROM service_reads")
    ):
        if charge_id in charges or release_id in releases:
            conn.execute(
                sa.text("UPDATE service_reads SET rdp = :rdp WHERE id = :id"),
                {"rdp": _shifted(rdp, COUNT_RELEASE_TV), "id": read_id},
            )
            reads[int(reader)] += 1
    # the composed rows: add the live releases' shares
    spends: Counter[int] = Counter()
    shards: Counter[int] = Counter()
    for charge_id, account_id, mechanism, shard, state in conn.execute(
        sa.text("SELECT id, charged_account_id, mechanism, exposure_shard, state FROM charges")
    ):
        if charge_id in charges and state != "refunded":
            spends[int(account_id)] += 1
            if mechanism != "degree_release":  # not in the shards: its graph release is
                shards[int(shard)] += 1
    for release_id, shard, state in conn.execute(
        sa.text("SELECT id, exposure_shard, state FROM graph_releases")
    ):
        if release_id in releases and state != "refunded":
            shards[int(shard)] += 1
    for account_id, count in spends.items():
        row = conn.execute(
            sa.text(
                "SELECT s.rdp, b.delta FROM spend s JOIN budgets b ON b.account_id = s.account_id"
                " WHERE s.account_id = :a"
            ),
            {"a": account_id},
        ).one()
        curve = RdpCurve.from_json(json.loads(row[0])).with_sampler_tv(count * COUNT_RELEASE_TV)
        conn.execute(
            sa.text("UPDATE spend SET rdp = :rdp, epsilon = :eps WHERE account_id = :a"),
            {"rdp": _encode(curve.to_json()), "eps": curve.epsilon(float(row[1])), "a": account_id},
        )
    for account_id, count in reads.items():
        for (rdp,) in conn.execute(
            sa.text("SELECT rdp FROM read_totals WHERE account_id = :a"), {"a": account_id}
        ):
            conn.execute(
                sa.text("UPDATE read_totals SET rdp = :rdp WHERE account_id = :a"),
                {"rdp": _shifted(rdp, count * COUNT_RELEASE_TV), "a": account_id},
            )
    for shard, count in shards.items():
        for (rdp,) in conn.execute(
            sa.text("SELECT rdp FROM exposure_shards WHERE shard = :s"), {"s": shard}
        ):
            conn.execute(
                sa.text("UPDATE exposure_shards SET rdp = :rdp WHERE shard = :s"),
                {"rdp": _shifted(rdp, count * COUNT_RELEASE_TV), "s": shard},
            )


def downgrade() -> None:
    """Drop the shares (the code before this revision reads curves without them)."""
    conn = op.get_bind()
    for table, key in (
        ("charges", "id"), ("graph_releases", "id"), ("service_reads", "id"),
        ("spend", "account_id"), ("read_totals", "account_id"), ("exposure_shards", "shard"),
    ):  # fmt: skip
        for row_key, rdp in conn.execute(sa.text(f"SELECT {key}, rdp FROM {table}")):
            data = json.loads(rdp)
            if data.pop("sampler_tv", None) is not None:
                conn.execute(
                    sa.text(f"UPDATE {table} SET rdp = :rdp WHERE {key} = :k"),
                    {"rdp": _encode(data), "k": row_key},
                )
    for account_id, rdp, delta in conn.execute(
        sa.text(
            "SELECT s.account_id, s.rdp, b.delta FROM spend s JOIN budgets b USING (account_id)"
        )
    ):
        spent = RdpCurve.from_json(json.loads(rdp)).epsilon(float(delta))
        conn.execute(
            sa.text("UPDATE spend SET epsilon = :eps WHERE account_id = :a"),
            {"eps": spent, "a": account_id},
        )
