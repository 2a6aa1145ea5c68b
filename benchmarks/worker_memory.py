"""Memory of ``serve --workers N`` at ready, measured as PSS (proportional set size).

PSS divides each shared page among the processes that map it, so the sum over the server's
processes is what the machine holds for it; RSS would count shared pages once per process.
Starts the server for each worker count on the given graph and ledger, waits for /readyz,
sums ``Pss`` from ``/proc/PID/smaps_rollup`` over the server and its children, and prints a
table with the ratio to the first worker count.

    python benchmarks/worker_memory.py --graph /tmp/g100k.txt --workers 1 2 \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/ppr_mem
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def tree(pid: int) -> list[int]:
    out = [pid]
    for child in children(pid):
        out += tree(child)
    return out


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def measure(graph: Path, workers: int, database_url: str, port: int) -> tuple[int, list[int]]:
    env = {**os.environ, "PPR_GRAPH_PATH": str(graph), "PPR_DATABASE_URL": database_url,
           "PPR_LOG_LEVEL": "warning"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port), "--workers", str(workers)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                ready = False
            if ready and len(tree(proc.pid)) >= (workers + 1 if workers > 1 else 1):
                break
            time.sleep(0.5)
        time.sleep(5)  # every worker has loaded by now (readyz answers from one of them)
        pids = tree(proc.pid)
        return sum(pss_kib(p) for p in pids), [pss_kib(p) for p in pids]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--port", type=int, default=8650)
    args = parser.parse_args()
    rows = []
    for n in args.workers:
        total, per = measure(args.graph, n, args.database_url, args.port)
        rows.append((n, total, per))
    base = rows[0][1]
    print("| workers | PSS total MiB | per process MiB | x first |")
    print("| --- | --- | --- | --- |")
    for n, total, per in rows:
        each = ", ".join(f"{p / 1024:.0f}" for p in per)
        print(f"| {n} | {total / 1024:.0f} | {each} | {total / base:.2f} |")


if __name__ == "__main__":
    main()
