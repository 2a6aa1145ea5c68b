"""A soak run: steady load at a fraction of measured throughput for minutes, watching errors and
the memory of every worker, then a ledger verification.

The load is open-loop: requests are *started* on a fixed schedule (``rate`` per second),
whatever the latency, so a slowing server shows up as latency and a backlog rather than as a
quietly lower rate. At most ``max_in_flight`` requests are outstanding; a request that cannot
start on time because of that cap is counted as ``late`` (and sent as soon as it can).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from service.loadtest.report import percentiles_ms
from service.loadtest.workload import Workload

MIB = 2**20


def rss_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` (Linux ``/proc``), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def worker_pids(server_pid: int) -> list[int]:
    """The uvicorn worker processes of ``serve --workers N``: the server's children that are
    either forked from it (same command line: ``serve`` forks its workers after loading the
    graph) or spawned by multiprocessing (``spawn_main``); helpers such as multiprocessing's
    resource tracker are neither."""
    pids: list[int] = []
    try:
        children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
        own = Path(f"/proc/{server_pid}/cmdline").read_bytes()
    except OSError:
        return pids
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == own or b"spawn_main" in cmdline:
            pids.append(int(child))
    return sorted(pids)


@dataclass
class Interval:
    """What one reporting interval saw."""

    end_s: float
    sent: int
    statuses: Counter[int]
    socket_errors: int
    late: int
    latencies: list[float]
    rss: dict[int, int | None]
    #: What the errors were: "STATUS error_code" of refused answers, the exception's name of
    #: requests that got no answer (ConnectError, ReadTimeout, ...).
    error_kinds: Counter[str] = field(default_factory=Counter)

    @property
    def errors(self) -> int:
        bad = sum(n for status, n in self.statuses.items() if not 200 <= status < 400)
        return bad + self.socket_errors


@dataclass
class SoakResult:
    rate: float
    seconds: float
    intervals: list[Interval] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(i.sent for i in self.intervals)

    @property
    def errors(self) -> int:
        return sum(i.errors for i in self.intervals)

    @property
    def statuses(self) -> Counter[int]:
        total: Counter[int] = Counter()
        for interval in self.intervals:
            total.update(interval.statuses)
        return total

    @property
    def error_kinds(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for interval in self.intervals:
            total.update(interval.error_kinds)
        return total

    def memory_growth(self) -> dict[int, tuple[int, int, int]]:
        """Per worker pid: (RSS at the end of the first interval, at the end, peak), bytes.

        The first interval is the baseline: by then every worker has run queries and filled
        its caches to their working size, so what grows after it is what a leak would be."""
        growth: dict[int, tuple[int, int, int]] = {}
        if not self.intervals:
            return growth
        for pid, first in self.intervals[0].rss.items():
            seen = [i.rss.get(pid) for i in self.intervals]
            values = [v for v in seen if v is not None]
            if first is None or not values:
                continue
            growth[pid] = (first, values[-1], max(values))
        return growth


async def _soak(
    base_url: str,
    workload: Workload,
    *,
    rate: float,
    seconds: float,
    interval_s: float,
    server_pid: int | None,
    max_in_flight: int,
    timeout_s: float,
    on_interval: object,
) -> SoakResult:
    result = SoakResult(rate=rate, seconds=seconds)
    pids = worker_pids(server_pid) if server_pid is not None else []
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    headers = {**workload.headers, "Content-Type": "application/json"}
    rng = random.Random()  # load shape only; nothing private is drawn here
    gate = asyncio.Semaphore(max_in_flight)
    current = Interval(0.0, 0, Counter(), 0, 0, [], {})
    tasks: set[asyncio.Task[None]] = set()

    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=timeout_s
    ) as client:

        async def one(method: str, path: str, body: bytes | None) -> None:
            nonlocal current
            sent = time.perf_counter()
            try:
                response = await client.request(method, path, content=body)
            except httpx.HTTPError as exc:
                current.socket_errors += 1
                current.error_kinds[f"no answer: {type(exc).__name__}"] += 1
            else:
                current.latencies.append(time.perf_counter() - sent)
                current.statuses[response.status_code] += 1
                if not 200 <= response.status_code < 400:
                    current.error_kinds[describe_error(response)] += 1
            finally:
                gate.release()

        start = time.perf_counter()
        next_report = start + interval_s
        i = 0
        while True:
            due = start + i / rate
            if due >= start + seconds:
                break
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            if gate.locked():
                current.late += 1
            await gate.acquire()
            task = asyncio.create_task(one(*workload.next_request(rng)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            current.sent += 1
            i += 1
            if time.perf_counter() >= next_report:
                current.end_s = time.perf_counter() - start
                current.rss = {pid: rss_bytes(pid) for pid in pids}
                result.intervals.append(current)
                if callable(on_interval):
                    on_interval(current, result)
                current = Interval(0.0, 0, Counter(), 0, 0, [], {})
                next_report += interval_s
        if tasks:
            await asyncio.gather(*tasks)
        current.end_s = time.perf_counter() - start
        current.rss = {pid: rss_bytes(pid) for pid in pids}
        if current.sent:
            result.intervals.append(current)
            if callable(on_interval):
                on_interval(current, result)
    return result


def run_soak(
    base_url: str,
    workload: Workload,
    *,
    rate: float,
    seconds: float,
    interval_s: float = 60.0,
    server_pid: int | None = None,
    max_in_flight: int = 256,
    timeout_s: float = 60.0,
    on_interval: object = None,
) -> SoakResult:
    """Load ``base_url`` at ``rate`` requests per second for ``seconds``, sampling each
    interval's statuses, latencies and (given ``server_pid``) every worker's RSS."""
    return asyncio.run(
        _soak(
            base_url, workload, rate=rate, seconds=seconds, interval_s=interval_s,
            server_pid=server_pid, max_in_flight=max_in_flight, timeout_s=timeout_s,
            on_interval=on_interval,
        )
    )  # fmt: skip


def interval_line(interval: Interval) -> str:
    p50, _, p99 = percentiles_ms(interval.latencies)
    statuses = " ".join(f"{s}:{n}" for s, n in sorted(interval.statuses.items()))
    rss = " ".join(
        f"{(v or 0) / MIB:.0f}" for _, v in sorted(interval.rss.items())
    )  # fmt: skip
    return (
        f"| {interval.end_s:7.0f} | {interval.sent:7d} | {interval.errors:6d} | "
        f"{interval.late:5d} | {p50:8.1f} | {p99:8.1f} | {rss or '-':>14} | {statuses} |"
    )


INTERVAL_HEADER = (
    "| t (s) | sent | errors | late | p50 ms | p99 ms | RSS MiB/worker | statuses |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)


def describe_error(response: httpx.Response) -> str:
    """``503 ledger_unavailable``: the status and the envelope's error code ("-" if none)."""
    try:
        code = str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        code = "-"
    return f"{response.status_code} {code}"


def error_list(kinds: Counter[str]) -> str:
    """``2 x 503 ledger_unavailable, 1 x no answer: ReadTimeout``, most frequent first."""
    return ", ".join(f"{n} x {kind}" for kind, n in kinds.most_common())


def summary(result: SoakResult) -> str:
    kinds = result.error_kinds
    lines = [
        f"requests: {result.requests:,} in {result.seconds:.0f} s at a target of "
        f"{result.rate:.1f} req/s ({result.requests / max(result.seconds, 1e-9):.1f} sent/s); "
        f"errors: {result.errors} "
        f"({', '.join(f'{s}: {n}' for s, n in sorted(result.statuses.items()))})",
        *([f"the errors were: {error_list(kinds)}"] if kinds else []),
        "| worker pid | RSS after first interval MiB | RSS at end MiB | peak MiB | growth MiB |",
        "| --- | --- | --- | --- | --- |",
    ]
    for pid, (first, last, peak) in sorted(result.memory_growth().items()):
        lines.append(
            f"| {pid} | {first / MIB:.1f} | {last / MIB:.1f} | {peak / MIB:.1f} | "
            f"{(last - first) / MIB:+.1f} |"
        )
    return "\n".join(lines)
