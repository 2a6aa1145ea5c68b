"""Byte stores under the caches: in-process LRU, Redis, and Redis with an in-process fallback.

Every store maps ``str`` keys to ``bytes`` values. Nothing here knows what the bytes mean
(the typed caches encode them, :mod:`service.cache.codec`; never with pickle). Logs name
keys' kinds and errors only, never values.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)

#: Called as ``on_event(cache_name, event)`` with event in hit|miss|error|discarded.
EventHook = Callable[[str, str], None]

#: Every Redis key this service writes starts with this.
KEY_PREFIX = "ppr:"


@runtime_checkable
class ByteStore(Protocol):
    """A key/value store of bytes. Implementations are thread-safe."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl_seconds: int | None = None) -> None: ...

    def delete(self, key: str) -> None: ...

    def status(self) -> str: ...


def store_state(store: ByteStore) -> dict[str, Any]:
    """The readiness view of any store: ``{"backend", "status", "last_error"}``."""
    state = getattr(store, "state", None)
    if callable(state):
        result: dict[str, Any] = state()
        return result
    return {"backend": type(store).__name__, "status": store.status(), "last_error": None}


def emit(hook: EventHook | None, cache_name: str, event: str) -> None:
    """Call a metrics hook; a failing hook never breaks a cache call."""
    if hook is None:
        return
    try:
        hook(cache_name, event)
    except Exception:  # metrics are best effort
        log.debug("cache event hook failed", exc_info=True)


class MemoryStore:
    """Thread-safe in-process LRU bounded by total bytes (keys' and values' lengths).

    ``ttl_seconds`` on :meth:`set` (or ``default_ttl_seconds``) expires an entry; expired
    entries are dropped lazily. A value larger than the whole bound is not stored.
    """

    #: Seen by this process only: another worker's writes are not here.
    shared = False

    def __init__(
        self,
        max_bytes: int = 64 * 2**20,
        *,
        default_ttl_seconds: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.default_ttl_seconds = default_ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._data: OrderedDict[str, tuple[bytes, float | None]] = OrderedDict()
        self._bytes = 0
        self._counters = {"hits": 0, "misses": 0, "sets": 0, "evictions": 0, "expirations": 0}

    @staticmethod
    def _size(key: str, value: bytes) -> int:
        return len(key) + len(value)

    def _drop(self, key: str) -> None:
        entry = self._data.pop(key, None)
        if entry is not None:
            self._bytes -= self._size(key, entry[0])

    def get(self, key: str) -> bytes | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self._counters["misses"] += 1
                return None
            value, expires_at = entry
            if expires_at is not None and self._clock() >= expires_at:
                self._drop(key)
                self._counters["expirations"] += 1
                self._counters["misses"] += 1
                return None
            self._data.move_to_end(key)
            self._counters["hits"] += 1
            return value

    def set(self, key: str, value: bytes, ttl_seconds: int | None = None) -> None:
        value = bytes(value)
        ttl = self.default_ttl_seconds if ttl_seconds is None else ttl_seconds
        expires_at = None if ttl is None else self._clock() + ttl
        size = self._size(key, value)
        with self._lock:
            self._drop(key)
            if size > self.max_bytes:
                return
            self._data[key] = (value, expires_at)
            self._bytes += size
            self._counters["sets"] += 1
            while self._bytes > self.max_bytes:
                old_key, (old_value, _) = self._data.popitem(last=False)
                self._bytes -= self._size(old_key, old_value)
                self._counters["evictions"] += 1

    def delete(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def status(self) -> str:
        return "ok"

    def state(self) -> dict[str, Any]:
        return {"backend": "memory", "status": "ok", "last_error": None}

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {**self._counters, "entries": len(self._data), "bytes": self._bytes}

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes


class RedisStore:
    """Redis through redis-py with short timeouts and no client-side retries.

    Keys are namespaced as ``ppr:<namespace>:<key>`` (``ppr:<key>`` without a namespace).
    Errors propagate: wrap it in :class:`ResilientStore` to survive an outage.
    """

    #: One store for every worker and machine that uses this Redis.
    shared = True

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "",
        connect_timeout: float = 0.5,
        op_timeout: float = 0.5,
    ) -> None:
        import redis  # here: a deployment without Redis never loads the client (70 ms)
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.namespace = namespace
        self.prefix = f"{KEY_PREFIX}{namespace}:" if namespace else KEY_PREFIX
        self.client: redis.Redis = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout,
            socket_timeout=op_timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )

    def full_key(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str) -> bytes | None:
        value = self.client.get(self.full_key(key))
        if value is None:
            return None
        if not isinstance(value, bytes):
            raise TypeError(f"redis returned {type(value).__name__}, expected bytes")
        return value

    def set(self, key: str, value: bytes, ttl_seconds: int | None = None) -> None:
        if ttl_seconds is not None and ttl_seconds > 0:
            self.client.set(self.full_key(key), value, ex=ttl_seconds)
        else:
            self.client.set(self.full_key(key), value)

    def set_many(self, items: list[tuple[str, bytes]], ttl_seconds: int | None = None) -> None:
        """Several SETs in one round trip (a pipeline, not a transaction)."""
        pipe = self.client.pipeline(transaction=False)
        for key, value in items:
            if ttl_seconds is not None and ttl_seconds > 0:
                pipe.set(self.full_key(key), value, ex=ttl_seconds)
            else:
                pipe.set(self.full_key(key), value)
        pipe.execute()

    def delete(self, key: str) -> None:
        self.client.delete(self.full_key(key))

    def ping(self) -> None:
        self.client.ping()

    def status(self) -> str:
        try:
            self.ping()
        except Exception:
            return "down"
        return "ok"

    def keys(self) -> list[str]:
        """Keys of this namespace (without the prefix). For tests and admin views."""
        prefix = self.prefix
        return [
            k.decode()[len(prefix) :] if isinstance(k, bytes) else str(k)[len(prefix) :]
            for k in self.client.scan_iter(match=_glob_escape(prefix) + "*", count=500)
        ]

    def clear_namespace(self) -> int:
        """Delete every key of this namespace; returns how many. Refuses the bare prefix."""
        if not self.namespace:
            raise ValueError("refusing to clear the whole ppr: prefix; use a namespace")
        keys = list(self.client.scan_iter(match=_glob_escape(self.prefix) + "*", count=500))
        deleted = 0
        for start in range(0, len(keys), 500):
            deleted += int(self.client.delete(*keys[start : start + 500]))
        return deleted

    def close(self) -> None:
        self.client.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _describe(exc: BaseException) -> str:
    """An error's type and message, bounded; redis-py messages carry no cached values."""
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class _Health:
    """Outage state shared by the resilient views of one Redis."""

    def __init__(self, retry_after_seconds: float, clock: Callable[[], float]) -> None:
        self.retry_after_seconds = retry_after_seconds
        self.clock = clock
        self.lock = threading.Lock()
        self.degraded = False
        self.retry_at = 0.0
        self.last_error: str | None = None
        self.outages = 0
        self.errors = 0

    def should_try(self) -> bool:
        """True if Redis may be used now; while degraded, one caller per backoff period."""
        with self.lock:
            if not self.degraded:
                return True
            now = self.clock()
            if now < self.retry_at:
                return False
            self.retry_at = now + self.retry_after_seconds  # others keep using the fallback
            return True

    def failed(self, exc: BaseException, op: str) -> None:
        with self.lock:
            self.errors += 1
            self.last_error = _describe(exc)
            self.retry_at = self.clock() + self.retry_after_seconds
            if self.degraded:
                return
            self.degraded = True
            self.outages += 1
        log.warning(
            "redis cache unavailable (%s during %s); serving from the in-process fallback, "
            "retrying every %.1f s",
            self.last_error, op, self.retry_after_seconds,
        )  # fmt: skip

    def succeeded(self) -> None:
        if not self.degraded:  # fast path, no lock
            return
        with self.lock:
            if not self.degraded:
                return
            self.degraded = False
        log.warning("redis cache reachable again; leaving degraded mode")


class ResilientStore:
    """Redis first, an in-process store when Redis fails: never raises a Redis error.

    Any error from Redis logs one warning per outage, marks the store ``degraded``, and the
    call is served by ``fallback`` (``None``: a miss, and writes are dropped). While degraded,
    Redis is retried after ``retry_after_seconds``. Writes also go to the fallback while Redis
    is healthy, so it is warm when an outage starts. Deletes go to both.
    """

    def __init__(
        self,
        primary: RedisStore,
        fallback: ByteStore | None,
        *,
        retry_after_seconds: float = 5.0,
        on_event: EventHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        _health: _Health | None = None,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.on_event = on_event
        self._health = _health or _Health(retry_after_seconds, clock)

    @property
    def shared(self) -> bool:
        """True while Redis is used (every worker's writes are seen); False while degraded,
        when lookups are served by this process's fallback."""
        return not self._health.degraded

    def sibling(self, fallback: ByteStore | None) -> ResilientStore:
        """Another view of the same Redis (same outage state) with its own fallback."""
        return ResilientStore(self.primary, fallback, on_event=self.on_event, _health=self._health)

    @property
    def retry_after_seconds(self) -> float:
        return self._health.retry_after_seconds

    def _failed(self, exc: BaseException, op: str) -> None:
        self._health.failed(exc, op)
        emit(self.on_event, "redis", "error")

    def get(self, key: str) -> bytes | None:
        if self._health.should_try():
            try:
                value = self.primary.get(key)
            except Exception as exc:
                self._failed(exc, "get")
            else:
                self._health.succeeded()
                return value
        return None if self.fallback is None else self.fallback.get(key)

    def set(self, key: str, value: bytes, ttl_seconds: int | None = None) -> None:
        if self.fallback is not None:
            self.fallback.set(key, value, ttl_seconds)
        if self._health.should_try():
            try:
                self.primary.set(key, value, ttl_seconds)
            except Exception as exc:
                self._failed(exc, "set")
            else:
                self._health.succeeded()

    def set_many(self, items: list[tuple[str, bytes]], ttl_seconds: int | None = None) -> None:
        """As :meth:`set` for each item, with one Redis round trip."""
        if self.fallback is not None:
            for key, value in items:
                self.fallback.set(key, value, ttl_seconds)
        if self._health.should_try():
            try:
                self.primary.set_many(items, ttl_seconds)
            except Exception as exc:
                self._failed(exc, "set")
            else:
                self._health.succeeded()

    def delete(self, key: str) -> None:
        if self.fallback is not None:
            self.fallback.delete(key)
        if self._health.should_try():
            try:
                self.primary.delete(key)
            except Exception as exc:
                self._failed(exc, "delete")
            else:
                self._health.succeeded()

    def probe(self) -> str:
        """Ping Redis now (unless in backoff) and update the state; returns :meth:`status`."""
        if self._health.should_try():
            try:
                self.primary.ping()
            except Exception as exc:
                self._failed(exc, "ping")
            else:
                self._health.succeeded()
        return self.status()

    def status(self) -> str:
        """``"ok"`` or ``"degraded"``; once the backoff has passed, pings Redis to recover."""
        health = self._health
        if health.degraded and health.clock() >= health.retry_at:
            self.probe()
        return "degraded" if health.degraded else "ok"

    def state(self) -> dict[str, Any]:
        status = self.status()
        return {"backend": "redis", "status": status, "last_error": self._health.last_error}

    def counters(self) -> dict[str, int]:
        return {"errors": self._health.errors, "outages": self._health.outages}

    def close(self) -> None:
        self.primary.close()
