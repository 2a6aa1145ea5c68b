"""The replay cache: stored releases by :class:`ReleaseKey` and by (principal, idempotency
key), with a TTL, in front of the ledger's releases table (which stays the source of truth),
and the few releases each process keeps decoded (:class:`RecentReleases`)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from service.cache.byte_stores import ByteStore, EventHook
from service.cache.codec import CorruptValue, decode_release, encode_release, release_key_parts
from service.cache.counted import CountedCache
from service.ledger.records import ReleaseKey, StoredRelease

# the replay cache's log lines keep the name they have always had
log = logging.getLogger("service.cache.caches")


def _digest(parts: list[Any]) -> str:
    canonical = json.dumps(parts, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


class RecentReleases:
    """The releases this process read or wrote in the last ``seconds``, decoded, at most
    ``items`` of them (least recently used out first): a hot replay skips the store's round
    trip and the decoding of its 1000 results. Every entry is a stored release, so serving
    one is post-processing; another process's newer release for the same key is seen once the
    entry is ``seconds`` old."""

    def __init__(self, seconds: float, items: int) -> None:
        self.seconds = seconds
        self.items = items
        self._entries: OrderedDict[str, tuple[float, StoredRelease]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store_key: str) -> StoredRelease | None:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(store_key)
            if hit is None:
                return None
            if now - hit[0] > self.seconds:
                del self._entries[store_key]
                return None
            self._entries.move_to_end(store_key)
            return hit[1]

    def put(self, store_key: str, release: StoredRelease) -> None:
        now = time.monotonic()
        with self._lock:
            self._entries[store_key] = (now, release)
            self._entries.move_to_end(store_key)
            while len(self._entries) > self.items:
                self._entries.popitem(last=False)


class ReplayCache(CountedCache):
    """Stored releases by :class:`ReleaseKey` and by (principal, idempotency key), with a TTL.

    A cache in front of the ledger's releases table, which stays the source of truth:
    misses are normal and callers fall back to the database. With ``recent`` set, the
    releases this process read or wrote in the last seconds are also kept decoded in process
    (:class:`RecentReleases`).
    """

    name = "replay"

    def __init__(
        self,
        store: ByteStore,
        *,
        ttl_seconds: int,
        on_event: EventHook | None = None,
        recent: RecentReleases | None = None,
    ) -> None:
        super().__init__(on_event)
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.recent = recent

    @property
    def shared(self) -> bool:
        """True when every worker writes its releases here and reads them from here (Redis,
        reachable now): a release stored by any worker is found, unless evicted or expired."""
        return bool(getattr(self.store, "shared", False))

    def _remember(self, store_key: str, release: StoredRelease) -> None:
        if self.recent is not None:
            self.recent.put(store_key, release)

    @staticmethod
    def key(release_key: ReleaseKey) -> str:
        return "replay:v1:" + _digest(release_key_parts(release_key))

    @staticmethod
    def idempotency_key(principal_id: int, idem_key: str) -> str:
        return "idem:v1:" + _digest([int(principal_id), idem_key])

    def put(self, release: StoredRelease) -> None:
        key = self.key(release.key)
        self._remember(key, release)
        self._write(self.store, key, encode_release(release), self.ttl_seconds)

    def put_many(self, entries: list[tuple[StoredRelease, int, str | None]]) -> None:
        """Cache many releases, each with its (principal, idempotency key or None), in one
        round trip where the store can (Redis pipeline)."""
        items: list[tuple[str, bytes]] = []
        for release, principal, idem in entries:
            raw = encode_release(release)
            keys = [self.key(release.key)]
            if idem is not None:
                keys.append(self.idempotency_key(principal, idem))
            for key in keys:
                self._remember(key, release)
                items.append((key, raw))
        self._write_many(items)

    def _write_many(self, items: list[tuple[str, bytes]]) -> None:
        """Write every (key, encoded release), in one round trip where the store can."""
        set_many = getattr(self.store, "set_many", None)
        if set_many is None:
            for key, raw in items:
                self._write(self.store, key, raw, self.ttl_seconds)
            return
        try:
            set_many(items, self.ttl_seconds)
        except Exception as exc:
            self._store_failed(exc, "set")

    def get(self, key: ReleaseKey) -> StoredRelease | None:
        release = self._load(self.key(key))
        if release is not None and release_key_parts(release.key) != release_key_parts(key):
            log.warning("discarding a cached release stored under another key")
            self._event("discarded")
            return None
        if release is not None:
            self._event("hit")
        return release

    def put_for_idempotency(self, principal_id: int, idem_key: str, release: StoredRelease) -> None:
        key = self.idempotency_key(principal_id, idem_key)
        self._remember(key, release)
        self._write(self.store, key, encode_release(release), self.ttl_seconds)

    def put_many_for_idempotency(self, entries: list[tuple[int, str, StoredRelease]]) -> None:
        """Cache many releases each under its (principal, idempotency key) only (never under
        its :class:`ReleaseKey`, whose entry is the newest release), in one round trip where
        the store can. Only for keys the ledger has bound to those releases."""
        items: list[tuple[str, bytes]] = []
        for principal, idem, release in entries:
            key = self.idempotency_key(principal, idem)
            self._remember(key, release)
            items.append((key, encode_release(release)))
        self._write_many(items)

    def get_for_idempotency(self, principal_id: int, idem_key: str) -> StoredRelease | None:
        release = self._load(self.idempotency_key(principal_id, idem_key))
        if release is not None:
            self._event("hit")
        return release

    def _load(self, store_key: str) -> StoredRelease | None:
        if self.recent is not None:
            recent = self.recent.get(store_key)
            if recent is not None:
                return recent
        raw = self._read(self.store, store_key)
        if raw is None:
            self._event("miss")
            return None
        try:
            release = decode_release(raw)
        except CorruptValue as exc:
            log.warning("discarding a corrupt cached release (%s)", exc)
            self._event("discarded")
            return None
        self._remember(store_key, release)
        return release
