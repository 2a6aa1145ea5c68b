"""The store stage: a release is stored, and its charge marked released, before its answer
may leave the process; a group's in one transaction (:meth:`Storer.store_many`); a group of
one group-committed with the lone releases stored at the same time (``ledger_group_max`` > 1).

If storing fails the answer is discarded and the client gets 503 ``ledger_unavailable``:
nothing was released, the charge stays admitted and is refunded by reconciliation. The replay
cache is written after the ledger (the database is the truth; a miss reads it there).
"""

from __future__ import annotations

import logging

from service.cache.caches import ReplayCache
from service.ledger.ledger import Ledger, LedgerUnavailable
from service.ledger.records import ChargeSettled, StoredRelease
from service.serving.group_commit import GroupCommitter
from service.serving.schemas import QueryRequest

log = logging.getLogger(__name__)


class Storer:
    """Writes releases to the ledger, then to the replay cache."""

    def __init__(self, ledger: Ledger, replays: ReplayCache | None, group_max: int) -> None:
        self.ledger = ledger
        self.replays = replays
        # Group commit (group_max > 1): concurrent release stores share one transaction.
        self._storing: GroupCommitter[tuple[StoredRelease, str | None, int], None] | None = None
        if group_max > 1:
            self._storing = GroupCommitter(self._store_together, max_group=group_max)

    def store_many(
        self, items: list[tuple[QueryRequest, StoredRelease]]
    ) -> list[BaseException | None]:
        """Store the releases in one transaction and cache them (:meth:`_store_together`,
        before any is answered); per item None or the error that discards its answer.

        If storing fails the answer is discarded and the client gets 503
        ``ledger_unavailable``: nothing was released, the charge stays admitted and is
        refunded by reconciliation."""
        if not items:
            return []
        if len(items) == 1 and self._storing is not None:
            return [self._store_one(*items[0], self._storing)]
        try:
            settled = self._store_together(
                [(stored, req.idempotency_key, req.principal.account_id) for req, stored in items]
            )
        except LedgerUnavailable as exc:
            log.warning("storing a group of releases failed; their answers were discarded")
            return [exc] * len(items)
        return [
            None if outcome is None else settled_before_stored(stored, req)
            for (req, stored), outcome in zip(items, settled, strict=True)
        ]

    def _store_one(
        self,
        req: QueryRequest,
        stored: StoredRelease,
        storing: GroupCommitter[tuple[StoredRelease, str | None, int], None],
    ) -> BaseException | None:
        """A lone release, in one transaction with those stored concurrently."""
        try:
            storing.submit((stored, req.idempotency_key, req.principal.account_id))
        except LedgerUnavailable as exc:
            log.warning(
                "storing a release failed; the answer was discarded",
                extra={"request_id": req.request_id, "charge_id": stored.charge_id},
            )
            return exc
        except ChargeSettled:
            return settled_before_stored(stored, req)
        return None

    def _store_together(
        self, items: list[tuple[StoredRelease, str | None, int]]
    ) -> list[ChargeSettled | None]:
        """One group of concurrent release stores, in one transaction (a lone one: the
        single-release transaction), then the stored ones into the replay cache in one
        round trip."""
        outcomes: list[ChargeSettled | None]
        if len(items) == 1:
            stored, idempotency_key, principal = items[0]
            try:
                self.ledger.settlement.store_release(
                    stored, idempotency_key=idempotency_key, principal_account_id=principal
                )
                outcomes = [None]
            except ChargeSettled as exc:
                outcomes = [exc]
        else:
            outcomes = self.ledger.settlement.store_releases(items)
        if self.replays is not None:
            try:
                self.replays.put_many(
                    [
                        (stored, principal, idempotency_key)
                        for (stored, idempotency_key, principal), outcome in zip(
                            items, outcomes, strict=True
                        )
                        if outcome is None
                    ]
                )
            except Exception:  # stored: the ledger is the truth, replays read it on a miss
                log.warning("caching a group of stored releases failed", exc_info=True)
        return outcomes


def settled_before_stored(stored: StoredRelease, req: QueryRequest) -> LedgerUnavailable:
    """The error for a release whose charge was settled (reconciled) before it was stored:
    its answer is discarded, nothing was released."""
    log.warning(
        "the charge was settled before its release was stored; answer discarded",
        extra={"request_id": req.request_id, "charge_id": stored.charge_id},
    )
    return LedgerUnavailable(
        "this request took too long and its charge was reconciled; no answer was "
        "released and nothing was charged. Retry",
        details={"charge_id": stored.charge_id},
    )
