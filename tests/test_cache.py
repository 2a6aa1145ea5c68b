"""The cache layer: byte stores, typed caches, and surviving a real Redis outage.

Tests marked ``redis`` use the server at PPR_TEST_REDIS_URL (default redis://127.0.0.1:6379/0),
each under its own key namespace, deleted afterwards. The recovery test runs its own
throwaway ``redis-server`` on a free port.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import redis

from service.cache import (
    Caches,
    CalibrationCache,
    CalibrationKey,
    DegreeCache,
    MemoryStore,
    PrefixCache,
    RecentReleases,
    RedisStore,
    ReplayCache,
    ResilientStore,
    build_caches,
    encode_array,
)
from service.config import Settings
from service.ledger.records import ReleaseKey, StoredRelease
from service.mechanisms.postprocess import RankedNode

REDIS_URL = os.environ.get("PPR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at PPR_TEST_REDIS_URL={REDIS_URL} does not answer: {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique key namespace, all of whose keys are deleted after the test."""
    ns = f"test-{uuid.uuid4().hex}"
    yield ns
    if "redis_url" in request.fixturenames:
        store = RedisStore(request.getfixturevalue("redis_url"), namespace=ns)
        try:
            store.clear_namespace()
        finally:
            store.close()


@pytest.fixture
def raw_redis(redis_url: str, namespace: str) -> Iterator[RedisStore]:
    store = RedisStore(redis_url, namespace=namespace)
    yield store
    store.close()


def _settings(redis_url: str | None, **overrides: Any) -> Settings:
    return Settings(redis_url=redis_url, **overrides)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def caches(request: pytest.FixtureRequest, namespace: str) -> Iterator[Caches]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    built = build_caches(_settings(url, allow_prefix_in_redis=True), namespace=namespace)
    yield built
    built.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def release(epsilon: float = 0.1, account: int = 7, node: str = "a:b") -> StoredRelease:
    return StoredRelease(
        key=ReleaseKey(account, node, "v-abc", "personalized", epsilon),
        charge_id=42,
        results=[RankedNode("x", 0.25), RankedNode("y", 1e-17), RankedNode("z", 0.0)],
        mechanism={"name": "noisy_diffusion", "epsilon": epsilon, "steps": 100, "eta": 1e-7},
        request_id="req-1",
    )


# -- round trips on memory and Redis -------------------------------------------------------


def test_degrees_round_trip(caches: Caches) -> None:
    degrees = np.array([0, 3, 1, 2**40], dtype=np.int64)
    assert caches.degrees.get("v1") is None
    caches.degrees.put("v1", degrees)
    caches.degrees.put("small", np.array([1, 2], dtype=np.int32))  # stored as int64
    got = caches.degrees.get("v1")
    assert got is not None
    assert got.dtype == np.int64 and not got.flags.writeable
    np.testing.assert_array_equal(got, degrees)
    assert caches.degrees.get("v2") is None
    small = caches.degrees.get("small")
    assert small is not None and small.dtype == np.int64 and small.tolist() == [1, 2]
    assert caches.degrees.stats() == {"hits": 2, "misses": 2, "errors": 0, "discarded": 0}


def test_calibration_round_trip(caches: Caches) -> None:
    key = CalibrationKey(mode="edge", beta=0.8, steps=100, epsilon=0.1, delta=1e-6, eta=1e-7)
    calls: list[int] = []

    def compute() -> float:
        calls.append(1)
        return 123.456789

    for _ in range(3):
        c = caches.calibration.get_or_compute(key, compute=compute, verify=lambda c: True)
        assert c == 123.456789
    assert len(calls) == 1
    other = CalibrationKey(mode="edge", beta=0.8, steps=100, epsilon=0.1000001, delta=1e-6)
    assert caches.calibration.get_or_compute(other, compute=lambda: 5.0, verify=bool) == 5.0
    assert caches.calibration.stats()["hits"] == 2


def test_calibration_infinite_c_round_trips(caches: Caches) -> None:
    key = CalibrationKey(mode="personalized", beta=0.8, steps=1, epsilon=0.1, delta=1e-6)
    caches.calibration.get_or_compute(key, compute=lambda: math.inf, verify=lambda c: True)
    got = caches.calibration.get_or_compute(key, compute=lambda: 1.0, verify=lambda c: True)
    assert got == math.inf


def test_replay_round_trip(caches: Caches) -> None:
    stored = release()
    assert caches.replay.get(stored.key) is None
    caches.replay.put(stored)
    assert caches.replay.get(stored.key) == stored
    # epsilon is part of the key at full precision
    next_eps = math.nextafter(0.1, 1.0)
    assert caches.replay.get(ReleaseKey(7, "a:b", "v-abc", "personalized", next_eps)) is None
    assert caches.replay.get(ReleaseKey(8, "a:b", "v-abc", "personalized", 0.1)) is None

    assert caches.replay.get_for_idempotency(3, "idem-1") is None
    caches.replay.put_for_idempotency(3, "idem-1", stored)
    assert caches.replay.get_for_idempotency(3, "idem-1") == stored
    assert caches.replay.get_for_idempotency(4, "idem-1") is None
    assert caches.replay.get_for_idempotency(3, "idem-2") is None

    # keys bound to an older release: cached under the keys only, the query's entry unchanged
    older = replace(stored, charge_id=stored.charge_id - 1, request_id="older")
    caches.replay.put_many_for_idempotency([(3, "idem-2", older), (4, "idem-1", older)])
    assert caches.replay.get_for_idempotency(3, "idem-2") == older
    assert caches.replay.get_for_idempotency(4, "idem-1") == older
    assert caches.replay.get(stored.key) == stored


@pytest.mark.redis
def test_recent_replays_are_served_decoded_in_process_until_they_age(
    raw_redis: RedisStore,
) -> None:
    recent = RecentReleases(seconds=0.3, items=2)
    replay = ReplayCache(raw_redis, ttl_seconds=60, recent=recent)
    first, second, third = release(node="n1"), release(node="n2"), release(node="n3")
    replay.put(first)
    raw_redis.delete(replay.key(first.key))  # gone from Redis: only this process has it
    assert replay.get(first.key) is first  # the decoded object, no round trip
    time.sleep(0.35)
    assert replay.get(first.key) is None, "older than PPR_REPLAY_RECENT_SECONDS: asks Redis"
    # a release read from Redis is remembered; the least recently used one goes first
    for stored in (first, second, third):
        replay.put(stored)
    assert replay.get(first.key) == first  # read back from Redis (evicted in process)
    raw_redis.delete(replay.key(first.key))
    assert replay.get(first.key) == first  # now remembered again
    raw_redis.delete(replay.key(second.key))
    assert replay.get(second.key) is None, "at most 2 kept: second was the oldest"
    # a newer release of the same query written by this process replaces the remembered one
    newer = StoredRelease(first.key, 43, [RankedNode("w", 0.5)], first.mechanism, "req-2")
    replay.put(newer)
    assert replay.get(first.key) is newer


def test_prefix_round_trip_is_read_only(caches: Caches) -> None:
    prefix = np.linspace(0.0, 1.0, 50)
    args = ("v1", 3, "edge", 0.8, 1e-7, 20)
    assert caches.prefixes.get(*args) is None
    caches.prefixes.put(*args, prefix)
    got = caches.prefixes.get(*args)
    assert got is not None and got.dtype == np.float64 and got.shape == (50,)
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0] = 1.0
    np.testing.assert_array_equal(got, prefix)
    assert caches.prefixes.get("v1", 3, "edge", 0.8, 1e-7, 21) is None


def test_state_reports_backend(caches: Caches, request: pytest.FixtureRequest) -> None:
    state = caches.state()
    backend = "redis" if "redis" in request.node.callspec.id else "memory"
    assert state["backend"] == backend
    assert state["status"] == "ok" and state["last_error"] is None
    assert set(caches.stats()) == {"degrees", "calibration", "replay", "prefix", "released_degrees"}


def test_events_reach_the_hook() -> None:
    events: list[tuple[str, str]] = []
    built = build_caches(_settings(None), on_event=lambda c, e: events.append((c, e)))
    built.degrees.get("v")
    built.degrees.put("v", np.arange(3))
    built.degrees.get("v")
    assert events == [("degrees", "miss"), ("degrees", "hit")]


def test_failing_hook_does_not_break_calls() -> None:
    def hook(cache: str, event: str) -> None:
        raise RuntimeError("metrics down")

    built = build_caches(_settings(None), on_event=hook)
    assert built.replay.get(release().key) is None


# -- memory store: bytes-bounded LRU and TTL -----------------------------------------------


def test_memory_store_lru_is_bounded_by_bytes() -> None:
    store = MemoryStore(max_bytes=3 * (1 + 100))  # three 1-char keys with 100-byte values
    for key in "abc":
        store.set(key, bytes(100))
    assert store.get("a") is not None  # a is now the most recently used
    store.set("d", bytes(100))
    assert store.get("b") is None  # least recently used went first
    assert {k for k in "acd" if store.get(k) is not None} == {"a", "c", "d"}
    store.set("e", bytes(250))  # needs room for 251 bytes: evicts more than one
    assert store.total_bytes <= store.max_bytes
    assert store.get("e") is not None
    assert store.counters()["evictions"] >= 3
    store.set("f", bytes(1000))  # larger than the whole bound: not stored
    assert store.get("f") is None
    assert store.get("e") is not None


def test_memory_store_replaces_and_deletes() -> None:
    store = MemoryStore(max_bytes=1000)
    store.set("k", b"one")
    store.set("k", b"two!")
    assert store.get("k") == b"two!" and store.total_bytes == 1 + 4
    store.delete("k")
    store.delete("missing")
    assert store.get("k") is None and store.total_bytes == 0


def test_memory_store_ttl() -> None:
    now = [1000.0]
    store = MemoryStore(max_bytes=1000, clock=lambda: now[0])
    store.set("short", b"x", ttl_seconds=10)
    store.set("forever", b"y")
    now[0] += 9.9
    assert store.get("short") == b"x"
    now[0] += 0.2
    assert store.get("short") is None
    assert store.get("forever") == b"y"
    assert store.counters()["expirations"] == 1


def test_replay_ttl_in_memory() -> None:
    now = [0.0]
    cache = ReplayCache(MemoryStore(clock=lambda: now[0]), ttl_seconds=60)
    cache.put(release())
    cache.put_for_idempotency(1, "k", release())
    now[0] = 59.0
    assert cache.get(release().key) is not None
    now[0] = 61.0
    assert cache.get(release().key) is None
    assert cache.get_for_idempotency(1, "k") is None


@pytest.mark.redis
def test_replay_ttl_in_redis(redis_url: str, namespace: str, raw_redis: RedisStore) -> None:
    built = build_caches(_settings(redis_url, replay_ttl_seconds=120), namespace=namespace)
    stored = release()
    built.replay.put(stored)
    built.replay.put_for_idempotency(1, "k", stored)
    built.degrees.put("v", np.arange(4))
    for key in (ReplayCache.key(stored.key), ReplayCache.idempotency_key(1, "k")):
        assert 110 <= raw_redis.client.ttl(raw_redis.full_key(key)) <= 120
    assert raw_redis.client.ttl(raw_redis.full_key(DegreeCache.key("v"))) == -1  # no TTL
    built.close()


@pytest.mark.redis
def test_redis_store_expires(raw_redis: RedisStore) -> None:
    raw_redis.set("k", b"v", ttl_seconds=1)
    raw_redis.client.pexpire(raw_redis.full_key("k"), 50)
    assert wait_until(lambda: raw_redis.get("k") is None, timeout=2.0)


# -- prefixes: sensitivity and validation --------------------------------------------------


@pytest.mark.redis
def test_prefix_never_reaches_redis_unless_allowed(
    redis_url: str, namespace: str, raw_redis: RedisStore
) -> None:
    built = build_caches(_settings(redis_url, allow_prefix_in_redis=False), namespace=namespace)
    built.prefixes.put("v1", 0, "edge", 0.8, 1e-7, 5, np.ones(10))
    built.degrees.put("v1", np.arange(10))
    assert built.prefixes.get("v1", 0, "edge", 0.8, 1e-7, 5) is not None  # in process
    keys = raw_redis.keys()
    assert DegreeCache.key("v1") in keys
    assert not [k for k in keys if k.startswith("prefix:")]
    assert built.state()["prefix_in_redis"] is False
    built.close()


@pytest.mark.redis
def test_prefix_shared_through_redis_when_allowed(redis_url: str, namespace: str) -> None:
    settings = _settings(redis_url, allow_prefix_in_redis=True)
    writer = build_caches(settings, namespace=namespace)
    reader = build_caches(settings, namespace=namespace)  # another worker: empty local store
    prefix = np.random.default_rng(0).random(100)
    writer.prefixes.put("v1", 4, "personalized", 0.8, 1e-7, 30, prefix)
    got = reader.prefixes.get("v1", 4, "personalized", 0.8, 1e-7, 30)
    assert got is not None and not got.flags.writeable
    np.testing.assert_array_equal(got, prefix)
    assert len(reader.prefixes.local) == 1  # promoted to the reader's in-process store
    writer.close()
    reader.close()


def test_prefix_local_store_respects_its_bound() -> None:
    built = build_caches(_settings(None, prefix_cache_bytes=2000))
    for seed in range(5):
        built.prefixes.put("v", seed, "edge", 0.8, 1e-7, 3, np.zeros(100))  # ~860 bytes each
    assert built.prefixes.local.total_bytes <= 2000
    assert built.prefixes.get("v", 4, "edge", 0.8, 1e-7, 3) is not None
    assert built.prefixes.get("v", 0, "edge", 0.8, 1e-7, 3) is None


CORRUPT_PREFIXES = {
    "garbage": b"\x80\x04garbage",
    "truncated": encode_array(np.ones(10))[:-8],
    "wrong dtype": encode_array(np.ones(10, dtype=np.int64)),
    "two dims": encode_array(np.ones((2, 5))),
    "bad header": b"PPRARR1\n{not json}\n" + bytes(80),
    "non-finite": encode_array(np.array([1.0, np.nan])),
}


@pytest.mark.redis
@pytest.mark.parametrize("corruption", sorted(CORRUPT_PREFIXES))
def test_corrupt_prefix_in_redis_is_a_miss(
    corruption: str, redis_url: str, namespace: str, raw_redis: RedisStore
) -> None:
    built = build_caches(_settings(redis_url, allow_prefix_in_redis=True), namespace=namespace)
    args = ("v1", 1, "edge", 0.8, 1e-7, 5)
    raw_redis.set(PrefixCache.key(*args), CORRUPT_PREFIXES[corruption])
    assert built.prefixes.get(*args) is None
    assert built.prefixes.stats()["discarded"] == 1
    assert len(built.prefixes.local) == 0  # not promoted
    built.close()


@pytest.mark.redis
@pytest.mark.parametrize(
    "raw",
    [
        b"nonsense",
        encode_array(np.ones(3)),  # float, not int
        encode_array(np.array([1, -2, 3])),  # negative degree
        encode_array(np.arange(10))[:-1],
    ],
)
def test_corrupt_degrees_in_redis_is_a_miss(
    raw: bytes, redis_url: str, namespace: str, raw_redis: RedisStore
) -> None:
    built = build_caches(_settings(redis_url), namespace=namespace)
    raw_redis.set(DegreeCache.key("v1"), raw)
    assert built.degrees.get("v1") is None
    assert built.degrees.stats()["discarded"] == 1
    built.degrees.put("v1", np.arange(3))
    assert built.degrees.get("v1") is not None
    built.close()


@pytest.mark.redis
def test_corrupt_replay_in_redis_is_a_miss(
    redis_url: str, namespace: str, raw_redis: RedisStore
) -> None:
    built = build_caches(_settings(redis_url), namespace=namespace)
    stored = release()
    raw_redis.set(ReplayCache.key(stored.key), b'{"v": 1, "key": [1]}')
    raw_redis.set(ReplayCache.idempotency_key(1, "k"), b"\xff")
    assert built.replay.get(stored.key) is None
    assert built.replay.get_for_idempotency(1, "k") is None
    assert built.replay.stats()["discarded"] == 2
    built.close()


# -- calibration: privacy first ------------------------------------------------------------

KEY = CalibrationKey(mode="edge", beta=0.8, steps=100, epsilon=0.1, delta=1e-6)
TRUE_C = 250.0


def _verify(c: float) -> bool:
    return c >= TRUE_C  # a smaller c would add less noise than the guarantee needs


@pytest.mark.parametrize("poison", [b"1.0", b"-250.0", b"nan", b"0", b"not a float", b"\xff"])
def test_poisoned_calibration_is_discarded(caches: Caches, poison: bytes) -> None:
    caches.store.set(KEY.encode(), poison)
    calls: list[int] = []

    def compute() -> float:
        calls.append(1)
        return TRUE_C

    assert caches.calibration.get_or_compute(KEY, compute=compute, verify=_verify) == TRUE_C
    assert calls == [1]
    assert caches.calibration.stats()["discarded"] == 1
    # the recomputed value replaced the poison
    assert caches.store.get(KEY.encode()) == repr(TRUE_C).encode()
    assert caches.calibration.get_or_compute(KEY, compute=compute, verify=_verify) == TRUE_C
    assert calls == [1]


def test_calibration_verify_that_raises_means_discard() -> None:
    cache = CalibrationCache(MemoryStore())
    cache.store.set(KEY.encode(), b"300.0")

    def verify(c: float) -> bool:
        raise ArithmeticError("cannot verify")

    assert cache.get_or_compute(KEY, compute=lambda: TRUE_C, verify=verify) == TRUE_C


def test_calibration_compute_errors_propagate() -> None:
    cache = CalibrationCache(MemoryStore())

    def compute() -> float:
        raise ValueError("bad parameters")

    with pytest.raises(ValueError, match="bad parameters"):
        cache.get_or_compute(KEY, compute=compute, verify=_verify)


def test_calibration_key_distinguishes_every_field() -> None:
    base = dict(mode="edge", beta=0.8, steps=100, epsilon=0.1, delta=1e-6, eta=1e-7)
    keys = {CalibrationKey(**base).encode()}  # type: ignore[arg-type]
    for field, value in [
        ("mode", "personalized"), ("beta", 0.8000000000000002), ("steps", 101),
        ("epsilon", 0.10000000000000002), ("delta", 1.0000000000000002e-06), ("eta", None),
    ]:  # fmt: skip
        keys.add(CalibrationKey(**{**base, field: value}).encode())  # type: ignore[arg-type]
    keys.add(CalibrationKey(**base, grid_version=2).encode())  # type: ignore[arg-type]
    assert len(keys) == 8


# -- fault tolerance: a real Redis that is not there, and one that dies and comes back -----


class _FailingStore:
    def get(self, key: str) -> bytes | None:
        raise OSError("disk on fire")

    def set(self, key: str, value: bytes, ttl_seconds: int | None = None) -> None:
        raise OSError("disk on fire")

    def delete(self, key: str) -> None:
        raise OSError("disk on fire")

    def status(self) -> str:
        return "down"


def test_store_errors_never_leave_a_cache() -> None:
    store = _FailingStore()
    events: list[tuple[str, str]] = []
    hook: Callable[[str, str], None] = lambda c, e: events.append((c, e))  # noqa: E731
    DegreeCache(store, on_event=hook).put("v", np.arange(3))
    assert DegreeCache(store, on_event=hook).get("v") is None
    assert ReplayCache(store, ttl_seconds=60, on_event=hook).get(release().key) is None
    calib = CalibrationCache(store, on_event=hook)
    assert calib.get_or_compute(KEY, compute=lambda: TRUE_C, verify=_verify) == TRUE_C
    assert ("degrees", "error") in events and ("calibration", "error") in events


def test_unreachable_redis_degrades_to_memory(caplog: pytest.LogCaptureFixture) -> None:
    events: list[tuple[str, str]] = []
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    built = build_caches(
        _settings(url, allow_prefix_in_redis=True),
        namespace="unreachable",
        retry_after_seconds=60.0,
        on_event=lambda c, e: events.append((c, e)),
    )
    secret = release()
    built.replay.put(secret)
    built.degrees.put("v", np.arange(5))
    built.prefixes.put("v", 0, "edge", 0.8, 1e-7, 2, np.ones(5))
    assert built.replay.get(secret.key) == secret
    np.testing.assert_array_equal(built.degrees.get("v"), np.arange(5))
    assert built.prefixes.get("v", 0, "edge", 0.8, 1e-7, 2) is not None
    c = built.calibration.get_or_compute(KEY, compute=lambda: TRUE_C, verify=_verify)
    assert c == TRUE_C
    state = built.state()
    assert state["backend"] == "redis" and state["status"] == "degraded"
    assert state["last_error"] and "ConnectionError" in state["last_error"]
    assert time.monotonic() - started < 2.0  # no retry storms, no long timeouts
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1  # once per outage
    assert "req-1" not in caplog.text and "noisy_diffusion" not in caplog.text
    assert ("redis", "error") in events
    built.close()


def _start_redis(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        if not wait_until(answers, timeout=5.0):
            proc.kill()
            proc.wait()
            pytest.fail(f"redis-server did not start on port {port}")
    finally:
        client.close()
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=5)


@pytest.mark.redis
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_recovers_after_redis_restarts() -> None:
    port = free_port()
    proc = _start_redis(port)
    store = ResilientStore(
        RedisStore(f"redis://127.0.0.1:{port}/0", namespace="recovery"),
        MemoryStore(),
        retry_after_seconds=0.3,
    )
    try:
        store.set("before", b"1")
        assert store.get("before") == b"1" and store.status() == "ok"

        _stop(proc)
        assert store.get("before") == b"1"  # the fallback was written through
        assert store.status() == "degraded"
        store.set("during", b"2")  # never raises
        assert store.get("during") == b"2"
        assert store.state()["last_error"] is not None

        proc = _start_redis(port)  # same port, empty server
        assert store.status() == "degraded"  # still in backoff
        assert wait_until(lambda: store.status() == "ok", timeout=3.0)
        store.set("after", b"3")
        direct = redis.Redis(port=port)
        assert direct.get("ppr:recovery:after") == b"3"  # really in Redis again
        direct.close()
        assert store.get("during") is None  # Redis is the source again: a plain miss
    finally:
        store.close()
        _stop(proc)
