"""Limits in front of the engine: per-account rate limits and a bounded queue.

* :class:`RateLimiter`: a token bucket per account (``PPR_RATE_LIMIT_PER_SECOND`` refill,
  ``PPR_RATE_LIMIT_BURST`` capacity). With Redis, one bucket per account shared by every worker
  and machine, updated atomically by a Lua script on Redis's own clock; without Redis, or while
  Redis does not answer, a bucket per process. Past the limit: ``429 rate_limited`` with the
  seconds to wait.
* :class:`EngineGate`: at most ``PPR_ENGINE_CONCURRENCY`` queries computing per process and at
  most ``PPR_ENGINE_QUEUE`` waiting, each for at most ``PPR_ENGINE_QUEUE_TIMEOUT_SECONDS``.
  Past that: ``503 overloaded`` with ``Retry-After``, instead of latency without bound.

Both refuse before anything is charged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from service.errors import ServiceError

log = logging.getLogger(__name__)


class RateLimited(ServiceError):
    """The account's request rate is over its limit."""

    code = "rate_limited"
    status = 429

    def __init__(self, retry_after_seconds: float) -> None:
        wait = max(1, math.ceil(retry_after_seconds))
        super().__init__(
            f"too many requests for this account; retry in {wait} s",
            details={"retry_after_seconds": wait},
        )
        self.retry_after = wait


class Overloaded(ServiceError):
    """The engine's queue is full, or a request waited in it too long."""

    code = "overloaded"
    status = 503

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message, details={"retry_after_seconds": retry_after_seconds})
        self.retry_after = retry_after_seconds


# --- rate limits -------------------------------------------------------------------------------


class LocalBuckets:
    """Token buckets in this process, one per key, least recently used dropped past ``size``."""

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        size: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.size = size
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0.0 if a token was taken, else the seconds until one is available."""
        with self._lock:
            now = self.clock()
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > self.size:
                self._buckets.popitem(last=False)
            return wait


#: One atomic step of each key's token bucket, held in a Redis hash {tokens, at}, in the order of
#: KEYS (a key given twice takes twice), on Redis's clock read once for the call. Returns, per
#: key, {1, "0"} when a token was taken, else {0, "<seconds to wait>"}, flattened.
TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local ttl = math.ceil(burst / rate * 1000) + 1000
local out = {}
for i, key in ipairs(KEYS) do
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(state[1])
  local at = tonumber(state[2])
  if tokens == nil or at == nil then
    tokens = burst
    at = now
  end
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
  local allowed = 0
  local wait = 0
  if tokens >= 1 then
    tokens = tokens - 1
    allowed = 1
  else
    wait = (1 - tokens) / rate
  end
  redis.call('HSET', key, 'tokens', tostring(tokens), 'at', tostring(now))
  redis.call('PEXPIRE', key, ttl)
  out[2 * i - 1] = allowed
  out[2 * i] = tostring(wait)
end
return out
"""


class RedisBuckets:
    """Token buckets in Redis under ``ppr:<namespace>:rate:<key>``, updated by one atomic
    script call. Errors propagate (the :class:`RateLimiter` falls back to its local buckets).

    From the event loop (:meth:`take_async`), the takes that arrive while a call is in flight
    go together in the next call, one script step per take in arrival order: an idle worker's
    take is sent at once, and a busy worker pays one round trip (and redis-py's per-call
    work) for many requests instead of one each. Each key's step is the same atomic update
    as alone, so a bucket shared by workers and machines counts every take exactly once."""

    def __init__(self, url: str, rate: float, burst: float, *, namespace: str) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.rate = rate
        self.burst = burst
        self.prefix = f"ppr:{namespace}:rate:"
        self._async_client: Any = None
        self._async_script: Any = None
        self._waiting: list[tuple[str, asyncio.Future[float]]] = []
        self._sending: asyncio.Task[None] | None = None  # the task sending them (kept alive)
        self.calls = 0  # script calls sent from the event loop (read by the tests)
        self.client: Any = redis.Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
        self._script = self.client.register_script(TOKEN_BUCKET_LUA)

    def take(self, key: str) -> float:
        """0.0 if a token of ``key``'s bucket was taken, else the seconds until one is."""
        return _waits(self._script(keys=[self.prefix + key], args=[self.rate, self.burst]))[0]

    async def take_async(self, key: str) -> float:
        """:meth:`take` from an event loop, on an asyncio client of its own (made on first
        use, in the loop that uses it): no thread is held while Redis answers, and takes
        that wait for a call in flight are sent together."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, future))
        if self._sending is None:
            self._sending = asyncio.get_running_loop().create_task(self._send_waiting())
        return await future

    async def _send_waiting(self) -> None:
        """Send what waits, one call at a time, until nothing does."""
        try:
            while self._waiting:
                takes, self._waiting = self._waiting, []
                try:
                    waits = await self._call([self.prefix + key for key, _ in takes])
                except Exception as exc:
                    # every take of the call falls back, and so do those that waited behind
                    # it: they fall back at once instead of waiting out another timeout
                    takes, self._waiting = takes + self._waiting, []
                    for _, future in takes:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # cancelled (the loop is closing): no take hangs
                    for _, future in takes + self._waiting:
                        future.cancel()
                    self._waiting = []
                    raise
                for (_, future), wait in zip(takes, waits, strict=True):
                    if not future.done():
                        future.set_result(wait)
        finally:
            self._sending = None

    async def _call(self, keys: list[str]) -> list[float]:
        if self._async_script is None:
            import redis.asyncio
            from redis.asyncio.retry import Retry as AsyncRetry
            from redis.backoff import NoBackoff

            self._async_client = redis.asyncio.Redis.from_url(
                self.url, socket_connect_timeout=0.5, socket_timeout=0.5,
                retry=AsyncRetry(NoBackoff(), 0),
            )  # fmt: skip
            self._async_script = self._async_client.register_script(TOKEN_BUCKET_LUA)
        self.calls += 1
        reply = await self._async_script(keys=keys, args=[self.rate, self.burst])
        waits = _waits(reply)
        if len(waits) != len(keys):
            raise RuntimeError(f"the token bucket script answered {len(waits)} of {len(keys)}")
        return waits

    def close(self) -> None:
        self.client.close()
        # the asyncio client's connections close with its event loop


def _waits(reply: Any) -> list[float]:
    """The seconds to wait for each key, from the token bucket script's reply (0.0: a token
    was taken)."""
    return [
        0.0 if int(allowed) == 1 else float(wait)
        for allowed, wait in zip(reply[::2], reply[1::2], strict=True)
    ]


class RateLimiter:
    """Per-account token buckets: in Redis when configured (falling back to this process's own
    buckets for ``redis_retry_seconds`` after a Redis error), else in process. A rate of 0
    turns the limit off."""

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        redis_url: str | None = None,
        namespace: str = "",
        redis_retry_seconds: float = 5.0,
    ) -> None:
        self.enabled = rate > 0
        self.local = LocalBuckets(rate, burst) if self.enabled else None
        self.remote = (
            RedisBuckets(redis_url, rate, burst, namespace=namespace)
            if self.enabled and redis_url is not None
            else None
        )
        self.redis_retry_seconds = redis_retry_seconds
        self._remote_down_until = 0.0

    def check(self, account_id: int) -> None:
        """Take one token of ``account_id``'s bucket, or raise :class:`RateLimited`."""
        if self.local is None:
            return
        wait: float | None = None
        if self._remote_up():
            assert self.remote is not None
            try:
                wait = self.remote.take(str(account_id))
            except Exception as exc:
                self._remote_failed(exc)
        self._settle(account_id, wait)

    async def check_async(self, account_id: int) -> None:
        """:meth:`check` from the event loop (Redis through an asyncio client)."""
        if self.local is None:
            return
        wait: float | None = None
        if self._remote_up():
            assert self.remote is not None
            try:
                wait = await self.remote.take_async(str(account_id))
            except Exception as exc:
                self._remote_failed(exc)
        self._settle(account_id, wait)

    def _remote_up(self) -> bool:
        return self.remote is not None and time.monotonic() >= self._remote_down_until

    def _remote_failed(self, exc: Exception) -> None:
        self._remote_down_until = time.monotonic() + self.redis_retry_seconds
        log.warning("rate limiter: Redis failed, using in-process buckets: %s", exc)

    def _settle(self, account_id: int, wait: float | None) -> None:
        """Raise :class:`RateLimited` past the bucket (the in-process one without Redis)."""
        assert self.local is not None
        if wait is None:
            wait = self.local.take(str(account_id))
        if wait > 0.0:
            raise RateLimited(wait)

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()


# --- the engine's queue ------------------------------------------------------------------------


class EngineGate:
    """A bounded queue in front of the engine (per process, in the event loop)."""

    def __init__(self, concurrency: int, queue: int, timeout_seconds: float) -> None:
        self.concurrency = concurrency
        self.queue = queue
        self.timeout_seconds = timeout_seconds
        self._slots: asyncio.Semaphore | None = None
        self.waiting = 0
        self.running = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        slots = self._slots
        if slots.locked():
            if self.waiting >= self.queue:
                raise Overloaded(
                    f"the engine is busy ({self.running} running, {self.waiting} waiting); retry"
                )
            self.waiting += 1
            try:
                await asyncio.wait_for(slots.acquire(), self.timeout_seconds)
            except TimeoutError:
                raise Overloaded(
                    f"waited {self.timeout_seconds:g} s for the engine without a turn; retry"
                ) from None
            finally:
                self.waiting -= 1
        else:
            await slots.acquire()
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            slots.release()
