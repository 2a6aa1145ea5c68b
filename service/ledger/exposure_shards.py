"""The exposure shards: each charge's and graph release's curve, against the graph-wide cap."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
from sqlalchemy.orm import Session

from service.ledger.budget_rule import curve_fits_under_cap
from service.ledger.ledger_rows import (
    add_to_shard,
    graph_exhausted,
    shard_total,
)
from service.ledger.locked_rows import (
    AdmissionWrites,
    LockedShard,
    lock_all_shards,
    other_shards,
)
from service.ledger.records import GraphCap
from service.ledger.tables import EXPOSURE_SHARDS
from service.ledger.transactions import LedgerPart
from service.privacy.accountant import RdpCurve


class NeedsExactCap(Exception):
    """Internal: the fast graph-cap check could not admit; retry locking every shard."""


class ExposureShards(LedgerPart):
    """Adds a curve to one exposure shard, checking the graph-wide cap (fast path or exact)."""

    def add_exposure(
        self,
        session: Session,
        curve: RdpCurve,
        cap: GraphCap | None,
        exact: bool,
        writes: AdmissionWrites,
    ) -> int:
        """Add ``curve`` to one exposure shard (returned), checking the graph-wide cap.

        Fast path: lock one shard, read all shards, admit if the total plus this curve plus
        ``EXPOSURE_SHARDS - 1`` copies of ``cap.max_charge`` (the most the other shards' lock
        holders can add concurrently, each having passed the same check) stays within the cap.
        Otherwise :class:`NeedsExactCap` rolls the transaction back and it is retried locking
        every shard in ascending order, which reads the exact total.
        """
        if cap is None:
            row = self._locked_shard(session, random.randrange(EXPOSURE_SHARDS))
        elif exact:
            rows = lock_all_shards(session)
            return add_within_graph_cap(rows, rows[random.randrange(len(rows))], curve, cap, writes)
        else:
            shard = random.randrange(EXPOSURE_SHARDS)
            row = self._locked_shard(session, shard)
            within = bool(np.all(curve.rdp <= cap.max_charge.rdp))
            if (
                not within
                or curve.pure > cap.max_charge.pure
                or curve.sampler_tv > cap.max_charge.sampler_tv
            ):
                raise NeedsExactCap()
            total = shard_total([row, *other_shards(session, shard)]) + curve
            margin = cap.max_charge * (EXPOSURE_SHARDS - 1)
            if not curve_fits_under_cap(total + margin, cap.delta, cap.cap_epsilon):
                raise NeedsExactCap()
        add_to_shard(row, curve)
        writes.changed_shard(row)
        return row.shard

    def group_exposure(
        self, session: Session, cap: GraphCap | None, writes: AdmissionWrites
    ) -> Callable[[RdpCurve], int]:
        """What a group's admissions add their curves with, in the group's transaction: one
        shard locked now (no cap), or every shard locked now, in ascending order, each curve
        checked against the exact graph-wide total (a cap)."""
        if cap is None:
            row = self._locked_shard(session, random.randrange(EXPOSURE_SHARDS))

            def add_exposure(curve: RdpCurve) -> int:
                add_to_shard(row, curve)
                writes.changed_shard(row)
                return row.shard

            return add_exposure
        rows = lock_all_shards(session)
        target = rows[random.randrange(len(rows))]
        return lambda curve: add_within_graph_cap(rows, target, curve, cap, writes)


def add_within_graph_cap(
    rows: list[LockedShard], target: LockedShard, curve: RdpCurve, cap: GraphCap,
    writes: AdmissionWrites,
) -> int:  # fmt: skip
    """Add ``curve`` to ``target``, one of ``rows`` (every shard, locked), or raise
    :class:`GraphBudgetExhausted` when the exact graph-wide total with it would pass the cap.
    The one check of the graph-wide cap on the exact total."""
    spent = shard_total(rows)
    if not curve_fits_under_cap(spent + curve, cap.delta, cap.cap_epsilon):
        raise graph_exhausted(cap, spent)
    add_to_shard(target, curve)
    writes.changed_shard(target)
    return target.shard
