"""The asyncio ``httpx`` driver: ``concurrency`` coroutines, each one request at a time."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx

from service.loadtest.report import PhaseResult, percentiles_ms
from service.loadtest.workload import Workload


async def _run(
    base_url: str, workload: Workload, concurrency: int, seconds: float, timeout_s: float
) -> PhaseResult:
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    socket_errors = 0
    item_errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {**workload.headers, "Content-Type": "application/json"}
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=timeout_s
    ) as client:
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            nonlocal socket_errors, item_errors
            rng = random.Random()  # load shape only; nothing private is drawn here
            while time.perf_counter() < deadline:
                method, path, body = workload.next_request(rng)
                sent = time.perf_counter()
                try:
                    response = await client.request(method, path, content=body)
                except httpx.HTTPError:
                    socket_errors += 1
                    continue
                latencies.append(time.perf_counter() - sent)
                statuses[str(response.status_code)] += 1
                if response.status_code >= 400:
                    codes[f"{response.status_code} {_error_code(response)}"] += 1
                if workload.kind == "batch" and response.status_code == 200:
                    items = response.json().get("items", [])
                    item_errors += sum(1 for item in items if "error" in item)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    p50, p90, p99 = percentiles_ms(latencies)
    bad = sum(n for code, n in statuses.items() if not code.startswith(("2", "3")))
    return PhaseResult(
        phase=workload.name,
        driver="httpx",
        concurrency=concurrency,
        seconds=elapsed,
        requests=len(latencies),
        errors=bad + socket_errors,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        items_per_request=workload.items_per_request,
        item_errors=item_errors,
        statuses=dict(statuses),
        error_codes=dict(codes),
        socket_errors=socket_errors,
    )


def _error_code(response: httpx.Response) -> str:
    """The envelope's ``error.code`` of a refused request, or "-"."""
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "-"
    return str(code) if isinstance(code, str) else "-"


def run_httpx(
    base_url: str, workload: Workload, *, concurrency: int, seconds: float, timeout_s: float = 30
) -> PhaseResult:
    return asyncio.run(_run(base_url, workload, concurrency, seconds, timeout_s))
