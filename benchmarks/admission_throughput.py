"""Admissions per second on PostgreSQL with the graph-wide cap off, on (sharded), and on with
every charge forced through the exact path (every shard locked: what one global lock costs).

Several processes, each with several threads, charge distinct accounts as fast as they can for
``--seconds``; the table prints admissions/s and the p50/p99 latency of one admit-and-charge.

    .venv/bin/python benchmarks/admission_throughput.py --processes 2 --threads 8 --seconds 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time

from sqlalchemy import create_engine, make_url

from service.ledger import GraphCap, Ledger, upgrade
from service.ledger.records import Admission
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode

DELTA = 1e-6


def _curve() -> RdpCurve:
    return plan_diffusion(0.1, DELTA, 100, 0.8, 1e-7, Mode.EDGE).curve


def _worker(url: str, accounts: list[int], mode: str, seconds: float, out: mp.Queue) -> None:
    from service.ledger.exposure_shards import ExposureShards

    curve = _curve()
    cap = None
    if mode != "off":
        cap = GraphCap(cap_epsilon=1e6, delta=DELTA, max_charge=curve)  # far from the cap
    if mode == "exact":
        # every charge locks all shards: the cost of a single global lock
        original = ExposureShards.add_exposure

        def exact(self, session, c, cap_, exact_, writes):  # type: ignore[no-untyped-def]
            return original(self, session, c, cap_, True, writes)

        ExposureShards.add_exposure = exact  # type: ignore[method-assign]
    ledger = Ledger.from_url(url)
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def run(account: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            ledger.admission.admit_and_charge(
                Admission(
                    charged_account_id=account, principal_account_id=account, seed="s",
                    mechanism="noisy_diffusion", mode="edge", params={}, query_curve=curve,
                    query_epsilon=0.1, graph_version="g", request_id=f"{account}-{i}",
                    idempotency_key=None,
                ),
                graph_cap=cap,
            )  # fmt: skip
            with lock:
                latencies.append(time.perf_counter() - t0)
            i += 1

    threads = [threading.Thread(target=run, args=(a,)) for a in accounts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ledger.dispose()
    out.put(latencies)


def measure(url: str, mode: str, args: argparse.Namespace) -> tuple[float, float, float]:
    ledger = Ledger.from_url(url)
    n = args.processes * args.threads
    ids = [ledger.accounts.create_account("service", cap_epsilon=1000.0, delta=DELTA).account_id
           for _ in range(n)]  # fmt: skip
    ledger.dispose()
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(url, ids[p * args.threads : (p + 1) * args.threads], mode, args.seconds, out),
        )
        for p in range(args.processes)
    ]
    for p in procs:
        p.start()
    latencies: list[float] = []
    for _ in procs:
        latencies.extend(out.get())
    for p in procs:
        p.join()
    latencies.sort()
    rate = len(latencies) / args.seconds
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000
    return rate, p50, p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    admin = create_engine(args.base_url, isolation_level="AUTOCOMMIT")
    rows = []
    for mode in ("off", "sharded", "exact"):
        name = f"ppr_admission_{mode}_{int(time.time())}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = make_url(args.base_url).set(database=name).render_as_string(hide_password=False)
        try:
            upgrade(url)
            rows.append((mode, *measure(url, mode, args)))
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()
    labels = {
        "off": "graph cap off",
        "sharded": "graph cap on (16 shards, fast path)",
        "exact": "graph cap on, every shard locked (one global lock)",
    }
    print(f"{args.processes} processes x {args.threads} threads, {args.seconds:g} s each, "
          "distinct accounts, PostgreSQL")  # fmt: skip
    print("| admission | charges/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- |")
    for mode, rate, p50, p99 in rows:
        print(f"| {labels[mode]} | {rate:.0f} | {p50:.1f} | {p99:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
