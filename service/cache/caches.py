"""Typed caches over a :class:`~service.cache.store.ByteStore`, and how the service builds them.

No pickle anywhere: arrays are raw little-endian bytes behind a small JSON header (dtype and
shape, checked on every read), records are JSON, calibration constants are float reprs.
Every value read back is validated; a value that fails is a miss (counted ``discarded``).
A cache call never raises because of its store: store errors count as ``error`` and a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.cache.store import (
    ByteStore,
    EventHook,
    MemoryStore,
    RedisStore,
    ResilientStore,
    emit,
    store_state,
)
from service.config import Settings
from service.ledger.records import ReleaseKey, StoredRelease
from service.ledger.release_format import decode_results, results_json
from service.privacy.orders import GRID_VERSION

log = logging.getLogger(__name__)

#: Bound of the in-process store of degrees, calibrations and replays (and Redis's fallback).
DEFAULT_MEMORY_BYTES = 64 * 2**20

# -- array codec ---------------------------------------------------------------------------

_ARRAY_MAGIC = b"PPRARR1\n"
_ALLOWED_DTYPES = frozenset({"<f8", "<i8"})


class CorruptValue(ValueError):
    """A stored value that does not decode to what its cache holds."""


def encode_array(array: np.ndarray) -> bytes:
    """``magic + JSON header + newline + raw little-endian bytes`` (C order)."""
    data = np.ascontiguousarray(array)
    dtype = data.dtype.newbyteorder("<") if data.dtype.byteorder == ">" else data.dtype
    data = data.astype(dtype, copy=False)
    descr = dtype.str
    if descr not in _ALLOWED_DTYPES:
        raise ValueError(f"unsupported dtype {descr}")
    header = json.dumps({"dtype": descr, "shape": list(data.shape)}, separators=(",", ":"))
    return _ARRAY_MAGIC + header.encode() + b"\n" + data.tobytes()


def decode_array(raw: bytes, *, dtype: str, ndim: int) -> np.ndarray:
    """The array in ``raw``, read-only (a view of the bytes, no copy); :class:`CorruptValue`
    unless it has exactly the given dtype and number of dimensions and the right length."""
    if not isinstance(raw, bytes) or not raw.startswith(_ARRAY_MAGIC):
        raise CorruptValue("not an encoded array")
    end = raw.find(b"\n", len(_ARRAY_MAGIC))
    if end < 0 or end - len(_ARRAY_MAGIC) > 256:
        raise CorruptValue("array header missing")
    try:
        header = json.loads(raw[len(_ARRAY_MAGIC) : end])
        stored_dtype = header["dtype"]
        shape = tuple(header["shape"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptValue("array header unreadable") from exc
    if stored_dtype != dtype or len(shape) != ndim:
        raise CorruptValue(f"expected {dtype} with {ndim} dims")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise CorruptValue("bad shape")
    np_dtype = np.dtype(dtype)
    offset = end + 1
    count = math.prod(shape)
    if len(raw) - offset != count * np_dtype.itemsize:
        raise CorruptValue("array length does not match its header")
    array = np.frombuffer(raw, dtype=np_dtype, count=count, offset=offset).reshape(shape)
    array.flags.writeable = False  # already so (bytes are immutable); make it explicit
    return array


# -- shared counting -----------------------------------------------------------------------


class _Counted:
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


def _digest(parts: list[Any]) -> str:
    canonical = json.dumps(parts, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


# -- degrees -------------------------------------------------------------------------------


class DegreeCache(_Counted):
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


class ReleasedDegreeCache(_Counted):
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


class CalibrationCache(_Counted):
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


# -- replays -------------------------------------------------------------------------------


def _key_parts(key: ReleaseKey) -> list[Any]:
    parts: list[Any] = [
        key.account_id, key.node, key.graph_version, key.mode, repr(float(key.epsilon))
    ]  # fmt: skip
    if key.mechanism != "noisy_diffusion":  # the diffusion's keys are as before mechanisms
        parts.append(key.mechanism)
    return parts


def encode_release(release: StoredRelease) -> bytes:
    doc = {
        "v": 1,
        "key": _key_parts(release.key),
        "charge_id": release.charge_id,
        "mechanism": release.mechanism,
        "request_id": release.request_id,
    }
    head = json.dumps(doc, separators=(",", ":"))
    # the results' JSON text is the one the ledger row stores (encoded once per release)
    return f'{head[:-1]},"results":{results_json(release.results)}}}'.encode()


def decode_release(raw: bytes) -> StoredRelease:
    try:
        doc = json.loads(raw)
        if doc["v"] != 1:
            raise CorruptValue("unknown release version")
        parts = doc["key"]
        if len(parts) not in (5, 6):
            raise CorruptValue("a release key has 5 or 6 parts")
        account_id, node, graph_version, mode, epsilon = parts[:5]
        mechanism_name = str(parts[5]) if len(parts) == 6 else "noisy_diffusion"
        key = ReleaseKey(
            int(account_id), str(node), str(graph_version), str(mode), float(epsilon),
            mechanism_name,
        )  # fmt: skip
        results = decode_results(doc["results"])
        mechanism = doc["mechanism"]
        if not isinstance(mechanism, dict):
            raise CorruptValue("mechanism is not an object")
        return StoredRelease(
            key=key,
            charge_id=int(doc["charge_id"]),
            results=results,
            mechanism=mechanism,
            request_id=str(doc["request_id"]),
        )
    except CorruptValue:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptValue("unreadable release") from exc


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


class ReplayCache(_Counted):
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

    def _remember(self, store_key: str, release: StoredRelease) -> None:
        if self.recent is not None:
            self.recent.put(store_key, release)

    @staticmethod
    def key(release_key: ReleaseKey) -> str:
        return "replay:v1:" + _digest(_key_parts(release_key))

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
        if release is not None and _key_parts(release.key) != _key_parts(key):
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


# -- prefixes ------------------------------------------------------------------------------


class PrefixCache(_Counted):
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
