"""Half-sent requests: does a concurrent client still get answers?

Starts ``python -m service serve --workers N`` (``--workers``, default 2) from ``--checkout``
(a worktree; its own ``service`` package is imported) on a SQLite ledger and the built-in demo
graph, at default settings, with the server's soft open-file limit at ``--server-nofile`` (the
common 1024 by default; the hard limit is left as it is, and ``serve`` may raise the soft one
up to it). Then, for ``--seconds``, it keeps ``--half-sent`` connections open, each having
sent a request line and one header but never the blank line that ends the head, and opens a
new one whenever the server closes one (a persistent slow-header client), while a probe
client asks ``/healthz`` and a replayed query alternately, each on a new connection with a
``--probe-timeout`` s timeout. It prints the probe's answers by status, the probe requests
that got no HTTP answer at all (a reset, a close without a response, a timeout) by kind,
latency percentiles of the 200s, how the server answered the half-sent connections it
closed, and the machine's load average before and after.

    .venv/bin/python benchmarks/half_sent.py --checkout . --half-sent 10000
    .venv/bin/python benchmarks/half_sent.py --checkout /work/wt/main-ab

Sends traffic only to 127.0.0.1; everything it starts it stops. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

HALF_SENT = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(checkout: Path, *args: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-m", "service", *args], cwd=checkout, env=env,
                          check=True, text=True, capture_output=True).stdout  # fmt: skip


def start_server(
    checkout: Path, work: Path, nofile: int, workers: int = 2
) -> tuple[subprocess.Popen[bytes], str, str]:
    url = f"sqlite:///{work / 'ledger.db'}"
    env = {**os.environ, "PPR_DATABASE_URL": url, "PPR_LOG_LEVEL": "warning",
           "PPR_GRAPH_SNAPSHOT_DIR": str(work / "snapshots")}  # fmt: skip
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cli(checkout, "db", "upgrade", env=env)
    created = json.loads(cli(checkout, "accounts", "create", "--type", "user", "--node", "1",
                             "--cap", "10", "--json", env=env))  # fmt: skip
    key = created.get("api_key") or created["key"]
    port = free_port()

    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--workers", str(workers), "--port", str(port)],
        cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError((work / "server.log").read_text())
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("server not ready in 300 s")
        time.sleep(0.5)
    return proc, base, key


class Slow:
    """Keeps ``count`` half-sent requests open, reopening each one the server closes."""

    def __init__(self, host: str, port: int, count: int) -> None:
        self.host, self.port, self.count = host, port, count
        self.opened = 0
        self.closed_by_server = 0
        self.failed_to_open = 0
        self.open_now = 0
        self.answers: Counter[str] = Counter()
        self.stop = asyncio.Event()

    async def one(self) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), 10
                )
                writer.write(HALF_SENT)
                await writer.drain()
            except (TimeoutError, OSError):
                self.failed_to_open += 1
                await asyncio.sleep(0.5)
                continue
            self.opened += 1
            self.open_now += 1
            try:
                stop = asyncio.ensure_future(self.stop.wait())
                read = asyncio.ensure_future(reader.read(65536))
                done, _ = await asyncio.wait({stop, read}, return_when=asyncio.FIRST_COMPLETED)
                if read in done:
                    self.closed_by_server += 1
                    with contextlib.suppress(Exception):
                        head = read.result().split(b"\r\n", 1)[0].decode(errors="replace")
                        self.answers[head or "closed without an answer"] += 1
                for task in (stop, read):
                    task.cancel()
            except OSError:
                self.closed_by_server += 1
            finally:
                self.open_now -= 1
                writer.close()

    async def run(self) -> None:
        await asyncio.gather(*(self.one() for _ in range(self.count)))


async def probe(base: str, key: str, stop: asyncio.Event, timeout: float) -> dict[str, object]:
    latencies: dict[str, list[float]] = {"healthz": [], "query": []}
    errors: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    unanswered: Counter[str] = Counter()
    paths = [("healthz", "/healthz", {}), ("query", "/v1/ppr/1?k=5",
             {"Authorization": f"Bearer {key}"})]  # fmt: skip
    i = 0
    while not stop.is_set():
        name, path, headers = paths[i % 2]
        i += 1
        started = time.perf_counter()
        try:
            async with httpx.AsyncClient(base_url=base, timeout=timeout) as http:  # new connection
                response = await http.get(path, headers=headers)
            statuses[f"{name}: {response.status_code}"] += 1
            if response.status_code == 200:
                latencies[name].append(time.perf_counter() - started)
            else:
                errors[f"{name}: HTTP {response.status_code}"] += 1
        except httpx.HTTPError as exc:  # no HTTP answer at all
            errors[f"{name}: {type(exc).__name__}"] += 1
            unanswered[f"{name}: {type(exc).__name__}"] += 1
        await asyncio.sleep(0.05)
    out: dict[str, object] = {
        "statuses": dict(statuses),
        "without_an_http_answer": sum(unanswered.values()),
        "without_an_http_answer_by_kind": dict(unanswered),
        "errors": dict(errors),
    }
    for name, values in latencies.items():
        ms = np.array(values) * 1000
        out[name] = {
            "ok": len(values),
            **({f"p{q}": round(float(np.percentile(ms, q)), 1) for q in (50, 90, 99)}
               if len(values) else {}),
            "max": round(float(ms.max()), 1) if len(values) else None,
        }  # fmt: skip
    return out


def probe_process(base: str, key: str, seconds: float, timeout: float) -> dict[str, object]:
    """The probe in a process of its own, so its latencies are the server's, not this
    client's event loop's."""

    async def timed() -> dict[str, object]:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        return await probe(base, key, stop, timeout)

    return asyncio.run(timed())


async def measure(base: str, key: str, count: int, seconds: float, timeout: float) -> dict:
    host, port = base.removeprefix("http://").split(":")
    slow = Slow(host, int(port), count)
    slow_task = asyncio.ensure_future(slow.run())
    while slow.opened < count and slow.failed_to_open < count:  # all half-sent first
        await asyncio.sleep(0.2)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        probed = pool.apply_async(probe_process, (base, key, seconds, timeout))
        peak = 0
        while not probed.ready():
            await asyncio.sleep(1)
            peak = max(peak, slow.open_now)
        result = probed.get()
    slow.stop.set()
    await asyncio.wait_for(slow_task, 30)
    return {
        "half_sent_target": count,
        "half_sent_peak_open": peak,
        "half_sent_opened": slow.opened,
        "half_sent_closed_by_server": slow.closed_by_server,
        "half_sent_failed_to_open": slow.failed_to_open,
        "server_answers_to_half_sent": dict(slow.answers),
        "probe": result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="worktree to serve from")
    parser.add_argument("--half-sent", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2, help="serve --workers (default 2)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--probe-timeout", type=float, default=5.0)
    parser.add_argument("--server-nofile", type=int, default=1024,
                        help="the server's soft RLIMIT_NOFILE (default 1024)")  # fmt: skip
    args = parser.parse_args()
    need = args.half_sent + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:  # this client's own descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ppr-half-sent-") as tmp:
        proc, base, key = start_server(
            args.checkout.resolve(), Path(tmp), args.server_nofile, args.workers
        )
        try:
            httpx.get(f"{base}/v1/ppr/1?k=5", headers={"Authorization": f"Bearer {key}"},
                      timeout=60).raise_for_status()  # the first answer; then replays  # fmt: skip
            result = asyncio.run(
                measure(base, key, args.half_sent, args.seconds, args.probe_timeout)
            )
            result["server_alive"] = proc.poll() is None
            with contextlib.suppress(httpx.HTTPError):
                metrics = httpx.get(f"{base}/metrics", timeout=10).text
                result["server_connections_shed"] = {
                    line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in metrics.splitlines()
                    if line.startswith("ppr_http_connections_shed_total{")
                }
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = (Path(tmp) / "server.log").read_text(errors="replace")
        result["server_log_too_many_open_files"] = log.count("Too many open files")
        result["server_log_connection_bound_lines"] = log.count("at its connection bound")
    result["checkout"] = str(args.checkout)
    result["workers"] = args.workers
    result["server_nofile_soft_at_start"] = args.server_nofile
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
