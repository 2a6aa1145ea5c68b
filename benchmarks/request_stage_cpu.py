"""Thread CPU per fresh query, by ledger stage and by thread, through the whole app in one process.

Builds the app as ``request_cpu.py`` does (``create_app`` with the PPR_* settings of the
environment; the ledger at ``PPR_DATABASE_URL`` must be migrated), with a service account (``--mode
personalized``: one that may charge seed users, whose accounts the server must be allowed to
create: ``PPR_CREATE_SEED_ACCOUNTS=true``), asks once for each of ``--pool`` random seeds (so
their prefixes are cached and, personalized, their users exist), then sends ``--requests``
fresh queries of those seeds, ``--concurrency`` at once, through httpx's ASGI transport. Under
that concurrency single queries are admitted and stored in groups, as under load.

Prints the process's CPU per query, the admission groups' mean size, the CPU and wall time of
the ledger's stages (the group admission, its writes, its reads' writes, the group store),
measured with the thread's own CPU clock around each call, and every thread's CPU per query
(from /proc, by thread name). Thread CPU is robust to what else runs on the machine; a
sampling profiler is not here (GIL waits look like work).

    PPR_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/DB \\
    PPR_REDIS_URL=redis://127.0.0.1:6379/0 PPR_GRAPH_PATH=graph.txt PPR_PREFIX_TABLE_BYTES=0 \\
    PPR_CREATE_SEED_ACCOUNTS=true PPR_DEFAULT_CAP_EPSILON=1000 \\
        .venv/bin/python benchmarks/request_stage_cpu.py --mode personalized --requests 1000

Not part of the tests; Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from request_cpu import app_in_process

from service.ledger import admission, admission_reads, locked_rows, settlement

SECONDS: dict[str, float] = defaultdict(float)
CALLS: Counter[str] = Counter()


def timed(cls: type, name: str, label: str) -> None:
    """Wrap ``cls.name`` to add its thread CPU and wall time under ``label``."""
    original: Callable[..., Any] = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[f"{label} CPU"] += time.thread_time() - cpu
            SECONDS[f"{label} wall"] += time.perf_counter() - wall
            CALLS[label] += 1
            if name == "admit_and_charge_many":
                CALLS["grouped queries"] += len(args[1])

    setattr(cls, name, wrapper)


timed(admission.Admissions, "admit_and_charge_many", "group admission")
timed(locked_rows.AdmissionWrites, "finish", "admission writes")
timed(admission_reads.AdmissionReads, "write", "reads' writes")
timed(settlement.Settlement, "store_releases", "group store")


def thread_seconds() -> dict[int, float]:
    """CPU seconds of every thread of this process, by native id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


async def run(args: argparse.Namespace) -> None:
    personalized = args.mode == "personalized"
    async with app_in_process(personalized=personalized) as (client, graph, auth):
        rng = np.random.default_rng()
        pool = [str(s) for s in graph.external_ids(rng.choice(graph.n, args.pool, False))]
        seeds = [pool[i] for i in rng.integers(0, len(pool), size=args.requests)]
        query = (
            f"mode=personalized&mechanism={args.mechanism}&epsilon=0.1&k=20&fresh=true"
            if personalized
            else "mode=edge&epsilon=0.01&k=10&fresh=true"
        )
        for seed in pool:  # prefixes cached, seed users' accounts made
            (await client.get(f"/v1/ppr/{seed}?{query}", headers=auth)).raise_for_status()
        SECONDS.clear()
        CALLS.clear()
        left = iter(seeds)

        async def send() -> None:
            for seed in left:
                response = await client.get(f"/v1/ppr/{seed}?{query}", headers=auth)
                response.raise_for_status()

        before = thread_seconds()
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(send() for _ in range(args.concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = thread_seconds()
    n = args.requests
    groups = CALLS["group admission"]
    print(
        f"{args.mode} {'' if not personalized else args.mechanism + ' '}fresh queries: {n}, "
        f"{args.concurrency} at once; process CPU {cpu / n * 1000:.2f} ms a query, wall "
        f"{wall / n * 1000:.2f} ms; {groups} admission groups of "
        f"{CALLS['grouped queries'] / max(groups, 1):.2f} queries on average"
    )
    print("| stage | ms a query | ms a call | calls |")
    print("| --- | --- | --- | --- |")
    for label, seconds in sorted(SECONDS.items()):
        calls = CALLS[label.rsplit(" ", 1)[0]]
        print(f"| {label} | {seconds / n * 1000:.3f} | {seconds / max(calls, 1) * 1000:.3f} "
              f"| {calls} |")  # fmt: skip
    names = {t.native_id: t.name for t in threading.enumerate()}
    by_thread: dict[str, float] = defaultdict(float)
    for tid, seconds in after.items():
        name = re.sub(r"[-_ ]?\d+", "#", names.get(tid, "native"))
        by_thread[name] += seconds - before.get(tid, 0.0)
    print("| thread (numbers as #; native: not a Python thread) | CPU ms a query |")
    print("| --- | --- |")
    for name, seconds in sorted(by_thread.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {name} | {seconds / n * 1000:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool", type=int, default=300, help="distinct seeds asked")
    parser.add_argument("--mode", choices=["edge", "personalized"], default="edge")
    parser.add_argument("--mechanism", default="blended", help="personalized mode's ranking")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
