"""Typed caches over a :class:`~service.cache.byte_stores.ByteStore`, and how the service
builds them.

No pickle anywhere: arrays are raw little-endian bytes behind a small JSON header (dtype and
shape, checked on every read), records are JSON, calibration constants are float reprs
(:mod:`service.cache.codec`). Every value read back is validated; a value that fails is a
miss (counted ``discarded``). A cache call never raises because of its store: store errors
count as ``error`` and a miss (:mod:`service.cache.counted`).

Here: the degree vectors, the degree releases, the calibrations, the noise-free prefixes,
the bundle of the service's caches and :func:`build_caches`. The replay cache is
:mod:`service.cache.replay_cache`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.cache.byte_stores import (
    ByteStore,
    EventHook,
    MemoryStore,
    RedisStore,
    ResilientStore,
    store_state,
)
from service.cache.codec import CorruptValue as CorruptValue
from service.cache.codec import decode_array as decode_array
from service.cache.codec import encode_array as encode_array
from service.cache.counted import CountedCache
from service.cache.replay_cache import RecentReleases as RecentReleases
from service.cache.replay_cache import ReplayCache as ReplayCache
from service.config import Settings
from service.privacy.orders import GRID_VERSION

log = logging.getLogger(__name__)

#: Bound of the in-process store of degrees, calibrations and replays (and Redis's fallback).
DEFAULT_MEMORY_BYTES = 64 * 2**20

# -- degrees -------------------------------------------------------------------------------


class DegreeCache(CountedCache):
    """The degree vector (int64) of each graph version; written at first load, no TTL."""

    name = "degrees"

    def __init__(self, store: ByteStore, *, on_event: EventHook | None = None) -> None:
        super().__init__(on_event)
        self.store = store

    @staticmethod
    def key(version: str) -> str:
        return f"degrees:v1:{version}"

    def put(self, version: str, degrees: np.ndarray) -> None:
        array = np.asarray(degrees)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ValueError("degrees must be a 1-D integer array")
        self._write(self.store, self.key(version), encode_array(array.astype(np.int64)))

    def get(self, version: str) -> np.ndarray | None:
        """The read-only degree vector, or None (a miss, or a corrupt value)."""
        raw = self._read(self.store, self.key(version))
        if raw is None:
            self._event("miss")
            return None
        try:
            degrees = decode_array(raw, dtype="<i8", ndim=1)
            if degrees.size and int(degrees.min()) < 0:
                raise CorruptValue("negative degree")
        except CorruptValue as exc:
            log.warning("discarding a corrupt cached degree vector (%s)", exc)
            self._event("discarded")
            return None
        self._event("hit")
        return degrees


class ReleasedDegreeCache(CountedCache):
    """The graph version's one DP degree release (float64, public once released), keyed by
    version and noise scale; no TTL. The ledger's stored bytes are the truth: this cache only
    saves workers a database read, and a value of the wrong length is discarded."""

    name = "released_degrees"

    def __init__(self, store: ByteStore, *, on_event: EventHook | None = None) -> None:
        super().__init__(on_event)
        self.store = store

    @staticmethod
    def key(version: str, scale: float) -> str:
        return f"released-degrees:v1:{version}:{scale!r}"

    def put(self, version: str, scale: float, released: np.ndarray) -> None:
        array = np.asarray(released, dtype=np.float64)
        if array.ndim != 1:
            raise ValueError("a degree release must be a 1-D vector")
        self._write(self.store, self.key(version, scale), encode_array(array))

    def get(self, version: str, scale: float, n: int) -> np.ndarray | None:
        """The read-only released vector of length ``n``, or None (a miss, or a bad value)."""
        raw = self._read(self.store, self.key(version, scale))
        if raw is None:
            self._event("miss")
            return None
        try:
            released = decode_array(raw, dtype="<f8", ndim=1)
            if released.shape != (n,) or not np.all(np.isfinite(released)):
                raise CorruptValue(f"expected {n} finite values")
        except CorruptValue as exc:
            log.warning("discarding a corrupt cached degree release (%s)", exc)
            self._event("discarded")
            return None
        self._event("hit")
        return released


# -- calibration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationKey:
    """What a calibrated c = b / eta depends on (see :func:`service.privacy.calibration.calibrate`).

    c is scale-free, so ``eta`` may be None to share one value across etas; give it to keep
    entries per eta. ``grid_version`` is the RDP order grid's version.
    """

    mode: str
    beta: float
    steps: int
    epsilon: float
    delta: float
    eta: float | None = None
    grid_version: int = GRID_VERSION

    def encode(self) -> str:
        eta = "-" if self.eta is None else repr(float(self.eta))
        return (
            f"calib:v1:{self.mode!s}:{float(self.beta)!r}:{int(self.steps)}:{eta}:"
            f"{float(self.epsilon)!r}:{float(self.delta)!r}:g{int(self.grid_version)}"
        )


class CalibrationCache(CountedCache):
    """Calibrated noise-scale ratios c shared across workers and replicas.

    Privacy first: a stored c is used only if ``verify(c)`` is True, so a corrupt or poisoned
    entry that would under-noise is discarded (logged, counted) and recomputed.
    """

    name = "calibration"

    def __init__(self, store: ByteStore, *, on_event: EventHook | None = None) -> None:
        super().__init__(on_event)
        self.store = store

    def get_or_compute(
        self,
        key: CalibrationKey,
        *,
        compute: Callable[[], float],
        verify: Callable[[float], bool],
    ) -> float:
        """The stored c if it verifies, else ``compute()`` (stored for others).

        Errors from ``compute`` propagate; errors from the store never do.
        """
        encoded = key.encode()
        raw = self._read(self.store, encoded)
        if raw is None:
            self._event("miss")
        else:
            c = self._verified(raw, verify, encoded)
            if c is not None:
                self._event("hit")
                return c
            self._event("discarded")
        c = float(compute())
        self._write(self.store, encoded, repr(c).encode("ascii"))
        return c

    @staticmethod
    def _verified(raw: bytes, verify: Callable[[float], bool], key: str) -> float | None:
        try:
            c = float(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            log.warning("discarding an unreadable cached calibration for %s", key)
            return None
        if math.isnan(c) or c <= 0:
            log.warning("discarding an invalid cached calibration for %s", key)
            return None
        try:
            ok = bool(verify(c))
        except Exception:
            log.warning("verifying a cached calibration for %s failed", key, exc_info=True)
            ok = False
        if not ok:
            log.warning("discarding a cached calibration for %s that fails verification", key)
            return None
        return c


# -- prefixes ------------------------------------------------------------------------------


class PrefixCache(CountedCache):
    """Noise-free diffusion prefixes (float64 vectors of length n) by
    (graph version, seed, mode, beta, eta, m).

    SENSITIVE: a noise-free prefix is a deterministic function of the graph's edges, as
    sensitive as the graph itself; it must never leave the trust boundary of the graph. It is
    always kept in process (``local``, bounded by this worker's share of the machine's
    ``prefix_cache_bytes``) and in Redis (``remote``) only when the deployment sets
    ``allow_prefix_in_redis``. Returned arrays are read-only; values read from Redis are
    validated (dtype, shape, finite) and promoted to the local store.
    """

    name = "prefix"

    def __init__(
        self,
        local: MemoryStore,
        remote: ByteStore | None = None,
        *,
        on_event: EventHook | None = None,
    ) -> None:
        super().__init__(on_event)
        self.local = local
        self.remote = remote

    @staticmethod
    def key(version: str, seed: int, mode: str, beta: float, eta: float, m: int) -> str:
        return f"prefix:v1:{version}:{int(seed)}:{mode!s}:{float(beta)!r}:{float(eta)!r}:{int(m)}"

    def get(
        self, version: str, seed: int, mode: str, beta: float, eta: float, m: int
    ) -> np.ndarray | None:
        key = self.key(version, seed, mode, beta, eta, m)
        raw = self.local.get(key)
        if raw is not None:
            try:
                array = decode_array(raw, dtype="<f8", ndim=1)
            except CorruptValue:  # pragma: no cover - only this class writes local
                self.local.delete(key)
            else:
                self._event("hit")
                return array
        if self.remote is not None:
            raw = self._read(self.remote, key)
            if raw is not None:
                try:
                    array = decode_array(raw, dtype="<f8", ndim=1)
                    if not np.all(np.isfinite(array)):
                        raise CorruptValue("non-finite entries")
                except CorruptValue as exc:
                    log.warning("discarding a corrupt cached prefix (%s)", exc)
                    self._event("discarded")
                    return None
                self.local.set(key, raw)
                self._event("hit")
                return array
        self._event("miss")
        return None

    def put(
        self,
        version: str,
        seed: int,
        mode: str,
        beta: float,
        eta: float,
        m: int,
        prefix: np.ndarray,
    ) -> None:
        array = np.asarray(prefix)
        if array.ndim != 1:
            raise ValueError("a prefix must be a 1-D vector")
        raw = encode_array(array.astype(np.float64, copy=False))
        key = self.key(version, seed, mode, beta, eta, m)
        self.local.set(key, raw)
        if self.remote is not None:
            self._write(self.remote, key, raw)


# -- the bundle ----------------------------------------------------------------------------


@dataclass
class Caches:
    """The service's four caches over one shared store (plus the prefixes' own local one)."""

    degrees: DegreeCache
    calibration: CalibrationCache
    replay: ReplayCache
    prefixes: PrefixCache
    store: ByteStore
    released_degrees: ReleasedDegreeCache | None = None

    def state(self) -> dict[str, Any]:
        """For /readyz: ``{"backend": "redis"|"memory", "status", "last_error"}`` and more."""
        state = store_state(self.store)
        state["prefix_in_redis"] = self.prefixes.remote is not None
        return state

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            c.name: c.stats()
            for c in (
                self.degrees,
                self.calibration,
                self.replay,
                self.prefixes,
                self.released_degrees,
            )
            if c is not None
        }

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if callable(close):
            close()


def build_caches(
    settings: Settings,
    *,
    namespace: str | None = None,
    on_event: EventHook | None = None,
    retry_after_seconds: float = 5.0,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> Caches:
    """In-process caches when ``settings.redis_url`` is None; else Redis (keys under
    ``ppr:<namespace>:``) with an in-process fallback. Noise-free prefixes go to Redis only
    if ``settings.allow_prefix_in_redis``."""
    prefix_local = MemoryStore(settings.prefix_cache_bytes_per_worker)
    store: ByteStore
    prefix_remote: ByteStore | None = None
    if settings.redis_url is None:
        store = MemoryStore(memory_bytes)
    else:
        resilient = ResilientStore(
            RedisStore(settings.redis_url, namespace=namespace or ""),
            MemoryStore(memory_bytes),
            retry_after_seconds=retry_after_seconds,
            on_event=on_event,
        )
        resilient.probe()
        store = resilient
        if settings.allow_prefix_in_redis:
            prefix_remote = resilient.sibling(None)  # the local store is the prefixes' fallback
    return Caches(
        degrees=DegreeCache(store, on_event=on_event),
        calibration=CalibrationCache(store, on_event=on_event),
        replay=ReplayCache(
            store,
            ttl_seconds=settings.replay_ttl_seconds,
            on_event=on_event,
            recent=(
                RecentReleases(settings.replay_recent_seconds, settings.replay_recent_items)
                if settings.replay_recent_seconds > 0 and settings.replay_recent_items > 0
                else None
            ),
        ),
        prefixes=PrefixCache(prefix_local, prefix_remote, on_event=on_event),
        store=store,
        released_degrees=ReleasedDegreeCache(store, on_event=on_event),
    )
