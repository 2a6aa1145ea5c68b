"""Charges in flight, kept alive: while a worker draws the releases of admitted charges, their
heartbeat in the ledger says so, and the reconciler refunds only charges whose process is gone.

A charge is ``admitted`` from its admission until its release is stored. The reconciler (and an
identical query finding it in flight) refunds an admitted charge once its last sign of life
(its heartbeat, else its admission) is older than ``PPR_RECONCILE_AFTER_SECONDS``, since a
charge without a release means nothing was released. A batch of hundreds of items, or a query
waiting behind one, can take longer than that on a healthy database; before, the reconciler
refunded the earliest items under it and they came back ``ledger_unavailable``.

So a query path holds its admitted charges here (:meth:`LiveCharges.holding`) from admission
until their releases are stored; one thread per worker wakes every ``heartbeat_seconds`` and
refreshes, in one ledger statement, the heartbeat of every charge held (or last beaten) at
least half that long ago. A charge is therefore never silent for more than 1.5 times
``heartbeat_seconds``, which the settings keep at most half the reconcile limit; a query
answered within half a heartbeat costs no write. A worker that dies stops beating, and its charges
are refunded after the limit, as before.

The database decides, never this memory (several workers and machines share the ledger): a
refund is a conditional UPDATE that a heartbeat or a release committed first defeats, and a
charge refunded anyway (its worker stalled, or the database was away for longer than the
limit) cannot be stored, so its answer is discarded, never sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

#: Refreshes the heartbeat of the given charges still admitted; returns those ids.
Beat = Callable[[Collection[int]], set[int]]


class LiveCharges:
    """The admitted charges this process is still answering, beating in the ledger."""

    def __init__(self, beat: Beat, *, heartbeat_seconds: float, thread: bool = True) -> None:
        """``thread=False``: no beating thread; :meth:`beat_due` is called by the owner."""
        self._beat = beat
        self._seconds = heartbeat_seconds
        self._threaded = thread
        self._lock = threading.Lock()
        #: charge id -> (how many holders, when it was first held or last beaten: monotonic)
        self._held: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def holding(self, charge_ids: Iterable[int]) -> Iterator[None]:
        """Keep ``charge_ids`` beating while the block runs (from after their admission to
        after their releases are stored)."""
        ids = list(charge_ids)
        if not ids:
            yield
            return
        now = time.monotonic()
        with self._lock:
            for charge_id in ids:
                count, since = self._held.get(charge_id, (0, now))
                self._held[charge_id] = (count + 1, since)
            self._start()
        try:
            yield
        finally:
            with self._lock:
                for charge_id in ids:
                    count, since = self._held.pop(charge_id, (1, now))
                    if count > 1:
                        self._held[charge_id] = (count - 1, since)

    def held(self) -> set[int]:
        with self._lock:
            return set(self._held)

    def beat_due(self, now: float | None = None) -> list[int]:
        """Beat (one ledger statement) every charge held, or last beaten, at least half of
        ``heartbeat_seconds`` ago; the ids beaten. A charge held for less is that young
        anyway: beating it would be a write for nothing."""
        now = time.monotonic() if now is None else now
        half = self._seconds / 2
        with self._lock:
            due = [cid for cid, (_, since) in self._held.items() if now - since >= half]
        if not due:
            return []
        alive = self._beat(due)
        with self._lock:
            for charge_id in due:
                if charge_id in self._held:
                    count, _ = self._held[charge_id]
                    self._held[charge_id] = (count, now)
        gone = len(due) - len(alive)
        if gone:
            log.warning(
                "charges in flight were settled under their worker; their answers will be "
                "discarded", extra={"charges": gone},
            )  # fmt: skip
        return due

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def _start(self) -> None:
        """Start the beating thread on first use (under the lock)."""
        if self._thread is not None or not self._threaded or self._stop.is_set():
            return
        self._thread = threading.Thread(target=self._loop, name="charge-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._seconds):
            try:
                self.beat_due()
            except Exception:  # a database hiccup: the next beat retries
                log.warning("charge heartbeat failed", exc_info=True)
