"""Limits of the HTTP surface: body and header sizes, per-account rate limits (in process and
in Redis), the engine's bounded queue, request ids a client cannot forge, and public endpoints
that say little."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from service.serving.limits import EngineGate, Overloaded, RateLimited, RateLimiter, RedisBuckets
from tests.api_support import (
    Backend,
    bearer,
    free_port,
    ledger_of,
    running_app,
    user_with_key,
    uvicorn_server,
)
from tests.connection_support import new_connection_each
from tests.test_api import (  # fixtures by name
    REDIS_URL,
    Accounts,
    accounts,
    backend,
    client,
    forget_cached_keys,
    query,
    redis_answers,
)

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


@sqlite_only
def test_body_and_header_sizes_are_limited(backend: Backend) -> None:
    with running_app(backend, max_body_bytes=4096, max_header_bytes=8192) as client:
        accounts = Accounts(client)
        admin = bearer(accounts.admin_key)
        refused(client.request("GET", "/healthz", content=b"x" * 5_000_000), 413,
                "payload_too_large")  # fmt: skip

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b" " * 1000

        streamed = client.post(
            "/v1/admin/accounts",
            content=chunks(),
            headers={**admin, "Content-Type": "application/json"},
        )
        refused(streamed, 413, "payload_too_large")
        big_header = client.get("/healthz", headers={"X-Padding": "a" * 10_000})
        refused(big_header, 431, "headers_too_large")
        assert big_header.headers["X-Request-ID"]
        fits = client.post(
            "/v1/admin/accounts", json={"type": "service", "label": "a" * 100}, headers=admin
        )
        assert fits.status_code == 201


@sqlite_only
def test_rate_limit_in_process_is_per_account(backend: Backend) -> None:
    with running_app(backend, rate_limit_per_second=0.01, rate_limit_burst=3) as client:
        accounts = Accounts(client)
        _, first = accounts.service()
        _, second = accounts.service()
        answers = [client.get("/v1/me/budget", headers=bearer(first)) for _ in range(4)]
        assert [r.status_code for r in answers] == [200, 200, 200, 429]
        refused(answers[-1], 429, "rate_limited")
        assert 1 <= int(answers[-1].headers["Retry-After"]) <= 100
        assert client.get("/v1/me/budget", headers=bearer(second)).status_code == 200
        assert query(client, first, "5").status_code == 429  # nothing computed, nothing charged
        assert ledger_of(client).reports.list_charges(None, limit=10) == []


@pytest.fixture
def bucket_namespace() -> Iterator[str]:
    """A namespace of token buckets in the test Redis for one test, its keys removed after
    (skipped when Redis does not answer)."""
    if not redis_answers():
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    namespace = f"test-{uuid.uuid4().hex}"
    yield namespace
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = client.keys(f"ppr:{namespace}:*")
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.mark.redis
def test_redis_token_bucket_is_atomic_across_clients(bucket_namespace: str) -> None:
    buckets = [RedisBuckets(REDIS_URL, 0.001, 10, namespace=bucket_namespace) for _ in range(4)]
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            waits = list(pool.map(lambda i: buckets[i % 4].take("acct"), range(40)))
        assert sum(1 for w in waits if w == 0.0) == 10  # the burst, exactly, over 4 clients
        assert all(w > 100 for w in waits if w > 0.0)  # 1 token per 1000 s
        assert buckets[0].take("other") == 0.0  # buckets are per key
    finally:
        for b in buckets:
            b.close()


@pytest.mark.redis
def test_the_event_loop_check_shares_the_redis_bucket_and_falls_back_when_redis_is_down(
    bucket_namespace: str,
) -> None:
    limiter = RateLimiter(0.001, 3, redis_url=REDIS_URL, namespace=bucket_namespace)

    try:
        limiter.check(1)  # the thread path takes one token of the same Redis bucket
        assert asyncio.run(checks_of(limiter, 3)) == ["ok", "ok", "429"]
    finally:
        limiter.close()
    # Redis down (nothing listens): the process's own bucket answers, nothing raises but 429
    down = RateLimiter(0.001, 2, redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="x")
    assert asyncio.run(checks_of(down, 3)) == ["ok", "ok", "429"]
    down.close()


@pytest.mark.redis
def test_event_loop_takes_that_arrive_together_go_in_one_call_each_counted_once(
    bucket_namespace: str,
) -> None:
    """Takes from one event loop that wait together are one script call, one bucket step
    each in arrival order: the burst exactly, per key, and takes arriving while a call is in
    flight go in the next one."""
    buckets = RedisBuckets(REDIS_URL, 0.001, 10, namespace=bucket_namespace)

    async def main() -> None:
        keys = ["a"] * 12 + ["b"] * 3
        waits = await asyncio.gather(*(buckets.take_async(key) for key in keys))
        assert buckets.calls == 1
        assert waits[:10] == [0.0] * 10 and all(w > 100 for w in waits[10:12])  # a: burst
        assert waits[12:] == [0.0] * 3  # b: its own bucket
        first = asyncio.create_task(buckets.take_async("c"))
        while buckets.calls == 1:  # the first take's call is sent
            await asyncio.sleep(0)
        later = [asyncio.create_task(buckets.take_async("c")) for _ in range(12)]
        assert await first == 0.0
        later_waits = await asyncio.gather(*later)
        assert buckets.calls == 3  # the twelve went together, after the first
        assert later_waits[:9] == [0.0] * 9 and all(w > 100 for w in later_waits[9:])

    try:
        asyncio.run(main())
    finally:
        buckets.close()


@pytest.mark.redis
def test_a_cancelled_caller_does_not_lose_the_other_takes_of_its_call(
    bucket_namespace: str,
) -> None:
    buckets = RedisBuckets(REDIS_URL, 0.001, 2, namespace=bucket_namespace)

    async def main() -> None:
        gone = asyncio.create_task(buckets.take_async("a"))
        stays = asyncio.create_task(buckets.take_async("a"))
        await asyncio.sleep(0)
        gone.cancel()  # its client went away: its take is still made, as sent
        assert await stays == 0.0
        assert await buckets.take_async("a") > 100  # both tokens were taken

    try:
        asyncio.run(main())
    finally:
        buckets.close()


def test_takes_waiting_behind_a_call_that_fails_fall_back_with_it() -> None:
    """A Redis that accepts connections and never answers: the first call times out, and the
    takes that waited behind it fail with it (each falls back to the process's own bucket)
    instead of being sent in a second call that would wait out its own timeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections are queued by the kernel, never read
    port = silent.getsockname()[1]
    limiter = RateLimiter(1000, 2000, redis_url=f"redis://127.0.0.1:{port}/0", namespace="x")
    assert limiter.remote is not None
    remote = limiter.remote

    async def main() -> list[str]:
        first = asyncio.create_task(checks_of(limiter, 1))
        while remote.calls == 0:  # the first take's call is sent
            await asyncio.sleep(0)
        behind = [asyncio.create_task(checks_of(limiter, 1)) for _ in range(5)]
        return [answer for done in await asyncio.gather(first, *behind) for answer in done]

    try:
        assert asyncio.run(main()) == ["ok"] * 6  # the process's own bucket answered
        assert remote.calls == 1
    finally:
        limiter.close()
        silent.close()


async def checks_of(limiter: RateLimiter, count: int) -> list[str]:
    """``count`` checks of account 1 from the event loop: "ok" or "429" each."""
    out = []
    for _ in range(count):
        try:
            await limiter.check_async(1)
            out.append("ok")
        except RateLimited:
            out.append("429")
    return out


@pytest.mark.postgres
@pytest.mark.redis
def test_rate_limit_is_shared_by_processes_through_redis(postgres_url: str, tmp_path: Path) -> None:
    if not redis_answers():
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    from service.graph.generate import write_generated_edge_list
    from service.ledger import upgrade

    graph = tmp_path / "g.txt"
    write_generated_edge_list(graph, 100, 300, seed=1)
    upgrade(postgres_url)
    backend = Backend("postgres+redis", postgres_url, REDIS_URL, graph)
    _, key = user_with_key(postgres_url, "3")
    limits = {"rate_limit_per_second": 0.01, "rate_limit_burst": 4}
    with running_app(backend, **limits) as one, running_app(backend, **limits) as two:
        statuses = [
            (one if i % 2 else two).get("/v1/me/budget", headers=bearer(key)).status_code
            for i in range(6)
        ]
    assert statuses == [200, 200, 200, 200, 429, 429]
    forget_cached_keys(postgres_url, REDIS_URL)  # the bucket and the cached degrees


def test_engine_gate_bounds_the_queue() -> None:
    async def scenario() -> list[str]:
        gate = EngineGate(concurrency=1, queue=1, timeout_seconds=0.2)
        outcomes: list[str] = []
        release = asyncio.Event()

        async def hold() -> None:
            async with gate.slot():
                await release.wait()

        async def ask() -> None:
            try:
                async with gate.slot():
                    outcomes.append("ran")
            except Overloaded as exc:
                outcomes.append(f"503 after {exc.retry_after}")

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(ask())  # queued
        await asyncio.sleep(0)
        await ask()  # the queue (1) is full: refused at once
        await waiter  # times out after 0.2 s
        release.set()
        await holder
        await ask()  # free again
        return outcomes

    assert asyncio.run(scenario()) == ["503 after 1", "503 after 1", "ran"]


@sqlite_only
def test_overload_is_503_with_retry_after_and_nothing_charged(backend: Backend) -> None:
    _, key = user_with_key(backend.database_url, "9")
    env = {"PPR_ENGINE_CONCURRENCY": "1", "PPR_ENGINE_QUEUE": "0"}
    with uvicorn_server(backend, extra_env=env, forked=True) as server:

        def ask(i: int) -> httpx.Response:  # a new connection each
            return http.get("/v1/ppr/9", params={"fresh": "true", "k": 3}, headers=bearer(key))

        with new_connection_each(server.base_url) as http, ThreadPoolExecutor(30) as pool:
            responses = list(pool.map(ask, range(30)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 403, 503} and 503 in statuses
    for response in responses:
        if response.status_code == 503:
            refused(response, 503, "overloaded")
            assert response.headers["Retry-After"] == "1"
    from tests.api_support import open_ledger

    with open_ledger(backend.database_url) as ledger:
        charged = len(ledger.reports.list_charges(None, limit=100))
    assert charged == statuses.count(200)


def test_request_ids_are_fresh_and_keep_a_well_formed_client_prefix(
    client: TestClient, accounts: Accounts
) -> None:
    _, key = accounts.user("21")
    sent = {**bearer(key), "X-Request-ID": "trace-42"}
    first = client.get("/v1/ppr/21", params={"k": 3}, headers=sent)
    second = client.get("/v1/ppr/21", params={"k": 3, "fresh": "true"}, headers=sent)
    ids = [r.json()["request_id"] for r in (first, second)]
    assert all(i.startswith("trace-42.") and len(i) == len("trace-42.") + 32 for i in ids)
    assert ids[0] != ids[1] and [r.headers["X-Request-ID"] for r in (first, second)] == ids
    stored = {c.request_id for c in ledger_of(client).reports.list_charges(None, limit=10)}
    assert stored == set(ids)
    for bad in ("", "a" * 65, "has space", "semi;colon", ids[0]):
        answer = client.get("/v1/me/budget", headers={**bearer(key), "X-Request-ID": bad})
        rid = answer.headers["X-Request-ID"]
        assert rid not in ids and len(rid.rsplit(".", 1)[-1]) == 32


@sqlite_only
def test_public_endpoints_say_little(backend: Backend) -> None:
    with running_app(backend, metrics_token="s3cret-token") as client:
        accounts = Accounts(client)
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ok"}
        assert str(backend.graph_path) not in ready.text
        user = client.get("/readyz", headers=bearer(accounts.user("4")[1]))
        assert user.json() == {"status": "ok"}
        admin = client.get("/readyz", headers=bearer(accounts.admin_key)).json()
        assert admin["checks"]["graph"]["source"] == str(backend.graph_path)
        refused(client.get("/metrics"), 401, "unauthorized")
        refused(client.get("/metrics", headers=bearer("wrong-token")), 401, "unauthorized")
        scraped = client.get("/metrics", headers=bearer("s3cret-token"))
        assert scraped.status_code == 200 and "ppr_http_requests_total" in scraped.text
