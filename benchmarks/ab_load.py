"""A/B load run: an older checkout and this one, side by side, on PostgreSQL + Redis.

Starts ``python -m service serve --workers N`` twice, once from ``--before-dir`` (a checkout of
the older commit with its own ``.venv``; with ``--before REF`` and no such directory, this
script makes it: ``git worktree add --detach DIR REF`` and ``make install``) and once from
``--after-dir`` (default: this checkout), each on a fresh database of its own on the same
PostgreSQL, the same Redis and the same generated graph. Then it runs each side's own
``python -m service loadtest --url ... --json`` against its server, alternately, for
``--rounds`` short rounds with the same parameters (the order flips every round so neither side
always runs first), and prints one table per side: fresh and replay req/s (median over the
rounds, and the range), p50/p99 latency (medians) and the answers that were not 200, by status.
``/healthz`` is a phase of every round unless ``--phases`` leaves it out: it is the reference for
what the framework alone does on the machine at that moment.

With ``--count-database N``, after the rounds each side answers one more fresh-only run of N
seconds, and PostgreSQL's own counters for that side's database (``pg_stat_database``: commits,
rollbacks, rows read, inserted and updated, read before and after, each time after the server's
connections have been idle long enough to report them) are divided by the fresh queries it
answered: the database work per fresh query, under the same concurrency as the rounds. (The
load test's own account and key, a few rows, are counted in it too.)

    .venv/bin/python benchmarks/ab_load.py --before 786f9bc --before-dir ../before
    .venv/bin/python benchmarks/ab_load.py --before-dir ../before --rounds 6 --duration 8
    .venv/bin/python benchmarks/ab_load.py --before-dir ../before --count-database 10

At the end each side's Redis keys (``ppr:<ledger id>:*``) are removed and its database dropped.
Both sides run with prefix tables off (``PPR_PREFIX_TABLE_BYTES=0``), so that neither is
measured while a table is being built. Sends traffic only to 127.0.0.1. Not part of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from speed_targets import forget_redis_keys  # this directory: the same key removal

HERE = Path(__file__).resolve().parent.parent


@dataclass
class Side:
    name: str
    root: Path
    port: int
    database_url: str = ""
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def python(self) -> str:
        return str(self.root / ".venv" / "bin" / "python")

    def commit(self) -> str:
        out = subprocess.run(
            ["git", "-C", str(self.root), "log", "-1", "--format=%h %s"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip()[:90]


def ensure_checkout(directory: Path, ref: str | None) -> None:
    if (directory / ".venv" / "bin" / "python").exists():
        return
    if ref is None:
        raise SystemExit(f"ab_load: {directory} has no .venv; give --before REF to make it")
    if not directory.exists():
        subprocess.run(
            ["git", "-C", str(HERE), "worktree", "add", "--detach", str(directory), ref],
            check=True,
        )  # fmt: skip
    subprocess.run(["make", "install"], cwd=directory, check=True)


def fresh_database(python: str, base_url: str, name: str, root: Path) -> str:
    """A new database ``name`` next to ``base_url``'s, migrated by that side's own code."""
    from sqlalchemy import create_engine, make_url

    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    url = make_url(base_url).set(database=name).render_as_string(hide_password=False)
    env = {**os.environ, "PPR_DATABASE_URL": url}
    subprocess.run(
        [python, "-m", "service", "db", "upgrade"], cwd=root, env=env, check=True,
        capture_output=True, text=True,
    )  # fmt: skip
    return url


def drop_database(base_url: str, name: str) -> None:
    from sqlalchemy import create_engine

    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@contextlib.contextmanager
def serving(side: Side, args: argparse.Namespace, graph: Path, log_dir: Path) -> Iterator[None]:
    env = {
        **os.environ,
        "PPR_DATABASE_URL": side.database_url,
        "PPR_REDIS_URL": args.redis_url,
        "PPR_GRAPH_PATH": str(graph),
        "PPR_GRAPH_SNAPSHOT_DIR": str(log_dir / f"snapshots-{side.name}"),
        "PPR_PREFIX_TABLE_BYTES": "0",
        "PPR_LOG_LEVEL": "warning",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = open(log_dir / f"server-{side.name}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [side.python, "-m", "service", "serve", "--port", str(side.port),
         "--workers", str(args.workers)],
        cwd=side.root, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        ready = 0
        while ready < 2 * args.workers:  # several answers in a row: every worker is up
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"ab_load: the {side.name} server did not become ready")
            try:
                r = httpx.get(f"http://127.0.0.1:{side.port}/readyz", timeout=5)
                ready = ready + 1 if r.status_code == 200 else 0
            except httpx.HTTPError:
                ready = 0
            time.sleep(0.3)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def one_round(
    side: Side, args: argparse.Namespace, graph: Path, *, phases: str = "", duration: float = 0.0
) -> dict[str, Any]:
    out = subprocess.run(
        [side.python, "-m", "service", "loadtest", "--url", f"http://127.0.0.1:{side.port}",
         "--database-url", side.database_url, "--graph", str(graph),
         "--phases", phases or args.phases,
         "--duration", str(duration or args.duration), "--warmup", str(args.warmup),
         "--concurrency", str(args.concurrency), "--mode", args.mode,
         "--epsilon", str(args.epsilon), "--k", str(args.k), "--json"],
        cwd=side.root, capture_output=True, text=True,
    )  # fmt: skip
    try:
        report: dict[str, Any] = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"ab_load: {side.name}'s loadtest failed:\n{out.stderr[-2000:]}") from None
    return {p["phase"]: p for p in report["phases"]}


#: pg_stat_database's counters compared per fresh query
COUNTERS = ("xact_commit", "xact_rollback", "tup_fetched", "tup_inserted", "tup_updated")
#: A backend that has been idle this long has reported its counters (PostgreSQL flushes an idle
#: backend's pending statistics within 10 s).
STATS_IDLE_SECONDS = 11.0


def database_counters(base_url: str, name: str) -> dict[str, int]:
    from sqlalchemy import create_engine, text

    engine = create_engine(base_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(f"SELECT {', '.join(COUNTERS)} FROM pg_stat_database WHERE datname = :n"),
                {"n": name},
            ).one()
    finally:
        engine.dispose()
    return dict(zip(COUNTERS, (int(v) for v in row), strict=True))


def count_database(side: Side, args: argparse.Namespace, graph: Path, name: str) -> str:
    """One fresh-only run; the database's counters per fresh query answered (200)."""
    time.sleep(STATS_IDLE_SECONDS)
    before = database_counters(args.base_url, name)
    fresh = one_round(side, args, graph, phases="fresh", duration=args.count_database)["fresh"]
    time.sleep(STATS_IDLE_SECONDS)
    after = database_counters(args.base_url, name)
    answered = int(fresh["statuses"].get("200", 0))
    per = ", ".join(f"{c} {(after[c] - before[c]) / max(answered, 1):.2f}" for c in COUNTERS)
    return (
        f"{side.name}: {answered:,} fresh answers in {args.count_database:g} s; per answer: {per}"
    )


def summary(side: Side, phases: list[str]) -> str:
    lines = [
        f"{side.name}: {side.commit()}",
        "| phase | rounds | req/s (median) | req/s (min-max) | p50 ms | p99 ms | requests "
        "| not 200, by status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for phase in phases:
        runs = [r[phase] for r in side.rounds if phase in r]
        if not runs:
            continue
        rps = [float(r["rps"]) for r in runs]
        errors: Counter[str] = Counter()
        for r in runs:
            for status, n in r["statuses"].items():
                if not str(status).startswith("2"):
                    errors[str(status)] += int(n)
            if r.get("socket_errors"):
                errors["socket"] += int(r["socket_errors"])
        shown = ", ".join(f"{s}: {n}" for s, n in sorted(errors.items())) or "none"
        lines.append(
            f"| {phase} | {len(runs)} | {statistics.median(rps):,.1f} | "
            f"{min(rps):,.1f}-{max(rps):,.1f} | "
            f"{statistics.median(float(r['p50_ms']) for r in runs):.1f} | "
            f"{statistics.median(float(r['p99_ms']) for r in runs):.1f} | "
            f"{sum(int(r['requests']) for r in runs):,} | {shown} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, help="git ref of the older side")
    parser.add_argument(
        "--before-dir",
        type=Path,
        required=True,
        help="checkout of the older side (with .venv, or made from --before)",
    )
    parser.add_argument("--after-dir", type=Path, default=HERE)
    parser.add_argument("--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                        help="PostgreSQL to create the two databases next to")  # fmt: skip
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--generate", default="20000,200000", help="NODES,EDGES")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--phases", default="healthz,fresh,replay")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mode", default="edge", choices=("edge", "personalized"))
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--ports", default="8181,8182", help="BEFORE,AFTER")
    parser.add_argument("--count-database", type=float, default=0.0, metavar="SECONDS",
                        help="after the rounds, a fresh-only run of SECONDS per side with "
                        "PostgreSQL's counters per fresh answer (0: none)")  # fmt: skip
    args = parser.parse_args()

    ensure_checkout(args.before_dir.resolve(), args.before)
    before_port, after_port = (int(p) for p in args.ports.split(","))
    sides = [
        Side("before", args.before_dir.resolve(), before_port),
        Side("after", args.after_dir.resolve(), after_port),
    ]
    from service.graph.generate import write_generated_edge_list

    run_id = str(int(time.time()))
    counted: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ppr-ab-") as tmp:
        work = Path(tmp)
        graph = work / "graph.txt"
        nodes, edges = (int(x) for x in args.generate.split(","))
        write_generated_edge_list(graph, nodes, edges, seed=0)
        names = {side.name: f"ppr_ab_{side.name}_{run_id}" for side in sides}
        for side in sides:
            side.database_url = fresh_database(side.python, args.base_url, names[side.name],
                                               side.root)  # fmt: skip
        try:
            with serving(sides[0], args, graph, work), serving(sides[1], args, graph, work):
                for i in range(args.rounds):
                    order = sides if i % 2 == 0 else sides[::-1]
                    for side in order:
                        result = one_round(side, args, graph)
                        side.rounds.append(result)
                        shown = ", ".join(f"{p} {r['rps']:,.1f} req/s" for p, r in result.items())
                        print(f"round {i + 1} {side.name}: {shown}", file=sys.stderr, flush=True)
                if args.count_database > 0:
                    counted = [count_database(s, args, graph, names[s.name]) for s in sides]
        finally:
            failures: list[str] = []
            for side in sides:
                forget_redis_keys(side.database_url, args.redis_url, failures)
                drop_database(args.base_url, names[side.name])
            for failure in failures:
                print(f"ab_load: {failure}", file=sys.stderr)
    phases = [p for p in args.phases.split(",") if p and p != "healthz"]
    print(
        f"graph {nodes:,} nodes / {edges:,} edges; {args.workers} workers per side; "
        f"{args.rounds} rounds of {args.duration:g} s per phase, interleaved; "
        f"{args.concurrency} connections; mode {args.mode}, epsilon {args.epsilon:g}, k {args.k}"
    )
    for side in sides:
        print()
        print(summary(side, ["healthz", *phases]))
    if args.count_database > 0:
        print(
            "\nPostgreSQL counters (pg_stat_database) per fresh answer, one fresh-only run a side:"
        )
        for line in counted:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
