"""What every typed cache shares: its hit/miss/error/discarded counters and metrics hook,
and store reads and writes that never raise (a failing store counts ``error`` and is a miss)."""

from __future__ import annotations

import logging
import threading

from service.cache.byte_stores import ByteStore, EventHook, emit

# the caches' log lines keep the name they have always had
log = logging.getLogger("service.cache.caches")


class CountedCache:
    """Hit/miss/error/discarded counters plus the optional metrics hook."""

    name = "cache"

    def __init__(self, on_event: EventHook | None) -> None:
        self._on_event = on_event
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "errors": 0, "discarded": 0}

    def _event(self, event: str) -> None:
        key = {"hit": "hits", "miss": "misses", "error": "errors", "discarded": "discarded"}[event]
        with self._lock:
            self._counts[key] += 1
        emit(self._on_event, self.name, event)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def _read(self, store: ByteStore, key: str) -> bytes | None:
        try:
            return store.get(key)
        except Exception as exc:
            self._store_failed(exc, "get")
            return None

    def _write(self, store: ByteStore, key: str, value: bytes, ttl: int | None = None) -> None:
        try:
            store.set(key, value, ttl)
        except Exception as exc:
            self._store_failed(exc, "set")

    def _store_failed(self, exc: Exception, op: str) -> None:
        log.warning("%s cache store %s failed: %s", self.name, op, type(exc).__name__)
        self._event("error")
