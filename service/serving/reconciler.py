"""Periodic reconciliation: refund admitted charges whose release was never stored.

A worker that dies between a charge and its stored release leaves the charge ``admitted``:
nothing left the process, so the charge may be refunded once it is older than any live request
can be (``PPR_RECONCILE_AFTER_SECONDS``). Every worker runs this loop; concurrent reconcilers
are safe because each charge moves out of ``admitted`` exactly once, in the database.
"""

from __future__ import annotations

import logging
import random
import threading

from service.ledger.ledger import Ledger

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, ledger: Ledger, *, older_than_seconds: float, interval_seconds: float):
        self._ledger = ledger
        self._older_than = older_than_seconds
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[int]:
        refunded = self._ledger.settlement.reconcile(older_than_seconds=self._older_than)
        if refunded:
            log.info(
                "reconciled charges without a release",
                extra={"refunded": len(refunded), "charge_ids": refunded[:20]},
            )
        return refunded

    def start(self) -> None:
        if self._interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="ledger-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        # Spread the workers' passes over the interval.
        while not self._stop.wait(self._interval * random.uniform(0.5, 1.0)):
            try:
                self.run_once()
            except Exception:  # the next pass retries; a down database is not fatal here
                log.warning("reconciliation pass failed", exc_info=True)
