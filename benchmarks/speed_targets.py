"""The service's speed targets, each printed beside this machine's figure from one run.

``make bench`` runs this script. It runs the project's own measuring tools as subprocesses,
reads their ``--json`` reports and prints one table, target | figure | ratio to target | met?,
with the commit and the machine's load average (``os.getloadavg``) at the start and the end:

* ``python -m service loadtest --start --workers 2`` on PostgreSQL + Redis, on ego-Facebook
  (``--graph``, default ``../shared/data/facebook_combined.txt`` next to the repository), in
  edge mode at epsilon 0.01, phases ``healthz,fresh,replay,batch`` with 200 seeds a batch call:
  the batch endpoint's seeds/s, fresh queries as a share of ``/healthz`` (measured in the same
  run, by wrk when it is installed) with their p99 and errors, replays as a share of
  ``/healthz``. The server builds its prefix table first and the load test waits for it.
* ``python -m service bench --generate 100000,2000000 --mode edge --epsilon 0.01
  --mechanisms noisy_cold noisy_warm naive_reference --batch 32``: warm and cold noisy
  diffusion in blocks of 32 queries against the naive reference (the papers' style).
* With ``--papers-code DIR`` (a checkout of the papers' repository, Graph-COM/DP_GraphDiffusion,
  which is not part of this one) and ``--papers-python`` (a Python with its requirements):
  ``python -m service bench --generate 10312,333983`` (the size of their 10k-node / 330k-edge
  held-out blog network, which is not here either; ``--papers-graph FILE`` gives a graph file
  instead) with ``--papers-code``: warm blocks of 32 and a lone cold query against their
  ``PrivatePageRankClip`` on the same graph and seeds. Without ``--papers-code`` those two rows
  say "not measured" and why; no figure is made up.

Everything it creates is removed at the end: the PostgreSQL database (named
``ppr_speed_targets_<pid>_<time>``, created on ``--postgres-url``'s server and dropped), the
Redis keys the server wrote under that ledger's id (``ppr:<ledger id>:*``), and the graph
snapshots and prefix table (in a temporary directory, ``PPR_GRAPH_SNAPSHOT_DIR``). The server
listens on a free port of 127.0.0.1, and the whole run takes two to three minutes on a 2-core
machine (``--generate`` and ``--duration`` shorten it).

It is a report: the exit status is 0 when targets are missed, and 1 only when a measurement
failed (a tool gave no report, or a report lacked a figure) or what it created could not be
removed. Run it with nothing else on the machine: figures drop with the load, which is why the
load average is printed beside them (the one at the end includes the run's own load: the server,
wrk and bench keep both cores of a 2-core machine busy).

    make bench
    make bench BENCH_ARGS="--json"
    make bench BENCH_ARGS="--papers-code ../DP_GraphDiffusion --papers-python ../pv/bin/python"
    .venv/bin/python benchmarks/speed_targets.py
    .venv/bin/python benchmarks/speed_targets.py --json > targets.json
    .venv/bin/python benchmarks/speed_targets.py --generate 20000,400000 --duration 4

Not part of the test suite (tests/test_speed_targets.py checks its arithmetic and parsing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.cli.arg_types import positive_float, positive_int, seconds
from service.cli.bench import generate_spec

HERE = Path(__file__).resolve().parent.parent
#: ego-Facebook, where the load targets are stated (a copy shared next to the checkouts).
DEFAULT_GRAPH = HERE.parent / "shared" / "data" / "facebook_combined.txt"
#: The generated graph the engine targets are stated on.
DEFAULT_GENERATE = (100_000, 2_000_000)
#: Seeds per batch call and queries per engine block, as the targets state them.
BATCH_SIZE = 200
BLOCK = 32
EPSILON = 0.01
DATABASE_PREFIX = "ppr_speed_targets_"


@dataclass(frozen=True)
class Target:
    """One stated target: a figure at least (or, ``at_most``, at most) ``threshold``."""

    key: str
    text: str
    threshold: float
    at_most: bool = False

    def ratio(self, figure: float) -> float | None:
        """figure / threshold (>= 1 meets an at-least target, <= 1 an at-most one); None for a
        threshold of 0."""
        return figure / self.threshold if self.threshold else None

    def met(self, figure: float) -> bool:
        return figure <= self.threshold if self.at_most else figure >= self.threshold


BATCH_SEEDS = Target(
    "batch_seeds_per_s",
    f"batch endpoint, {BATCH_SIZE} edge-mode seeds a call, ego-Facebook: >= 1,500 seeds/s",
    1500.0,
)
FRESH_SHARE = Target(
    "fresh_share_of_healthz", "fresh edge-mode queries: >= 15% of /healthz (wrk)", 0.15
)
FRESH_P99 = Target("fresh_p99_ms", "fresh edge-mode queries: p99 <= 100 ms", 100.0, at_most=True)
FRESH_ERRORS = Target("fresh_errors", "fresh edge-mode queries: 0 errors", 0.0, at_most=True)
REPLAY_SHARE = Target("replay_share_of_healthz", "replays: >= 50% of /healthz", 0.50)
LOAD_TARGETS = (BATCH_SEEDS, FRESH_SHARE, FRESH_P99, FRESH_ERRORS, REPLAY_SHARE)
WARM_BLOCK = Target(
    "warm_block_x_naive",
    f"noisy diffusion, warm, blocks of {BLOCK}: >= 100x the naive reference",
    100.0,
)
COLD_BLOCK = Target(
    "cold_block_x_naive",
    f"noisy diffusion, cold, blocks of {BLOCK}: >= 15x the naive reference",
    15.0,
)
ENGINE_TARGETS = (WARM_BLOCK, COLD_BLOCK)
PAPERS_WARM = Target(
    "papers_warm_block_x",
    "against the papers' code, 10k-node / 330k-edge held-out graph: warm blocks of 32 >= 100x",
    100.0,
)
PAPERS_COLD = Target(
    "papers_lone_cold_x",
    "against the papers' code, the same graph: a lone cold query >= 3x",
    3.0,
)
PAPERS_TARGETS = (PAPERS_WARM, PAPERS_COLD)
PAPERS_REASON = (
    "not measured: give --papers-code DIR (a checkout of Graph-COM/DP_GraphDiffusion) and "
    "--papers-python (a Python with its requirements)"
)
#: The size of the papers' held-out blog network (BlogCatalog): the generated stand-in's.
PAPERS_GENERATE = (10_312, 333_983)
#: Seeds timed one at a time against the papers' code (each of its queries takes ~0.2 s).
PAPERS_QUERIES = 20


@dataclass(frozen=True)
class Row:
    """A target and what this run found: ``status`` is ``measured`` (with ``figure``),
    ``not measured`` or ``failed``; ``shown`` is the figure as printed (or why there is none)."""

    target: Target
    figure: float | None
    shown: str
    status: str = "measured"

    @property
    def ratio(self) -> float | None:
        return None if self.figure is None else self.target.ratio(self.figure)

    @property
    def met(self) -> bool | None:
        return None if self.figure is None else self.target.met(self.figure)

    def cells(self) -> list[str]:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}"
        if self.status == "failed":
            met = "FAILED"
        else:
            met = {True: "yes", False: "no", None: "-"}[self.met]
        return [self.target.text, self.shown, ratio, met]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.target.key,
            "target": self.target.text,
            "threshold": self.target.threshold,
            "at_most": self.target.at_most,
            "figure": self.figure,
            "shown": self.shown,
            "ratio": self.ratio,
            "met": self.met,
            "status": self.status,
        }


class MeasurementFailed(Exception):
    """A tool gave no usable report."""


# --- reading the tools' reports (pure) ----------------------------------------------------


def _phase(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for phase in report.get("phases", ()):
        if phase.get("phase") == name:
            return dict(phase)
    raise MeasurementFailed(f"the load test's report has no {name} phase")


def _number(mapping: Mapping[str, Any], field: str, where: str) -> float:
    value = mapping.get(field)
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        raise MeasurementFailed(f"the {where} has no figure {field} ({value!r})")
    return float(value)


def load_rows(report: Mapping[str, Any]) -> list[Row]:
    """The load targets' rows from ``loadtest --json``'s report."""
    healthz = _phase(report, "healthz")
    fresh = _phase(report, "fresh")
    replay = _phase(report, "replay")
    batch = _phase(report, "batch")
    reference = _number(healthz, "rps", "healthz phase")
    if reference <= 0:
        raise MeasurementFailed("/healthz answered nothing: no reference to compare with")
    driver = str(report.get("driver", "?"))
    by = "" if driver == "wrk" else f"; /healthz measured by {driver}, not wrk"

    seeds = _number(batch, "items_per_second", "batch phase")
    calls = int(_number(batch, "requests", "batch phase"))
    batch_errors = int(batch.get("errors", 0)) + int(batch.get("item_errors", 0))
    shown_batch = f"{seeds:,.0f} seeds/s ({calls:,} calls finished"
    if calls:
        shown_batch += f", p50 {_number(batch, 'p50_ms', 'batch phase') / 1000:,.1f} s a call"
    else:
        shown_batch += " within the phase: give a longer --duration"
    shown_batch += f", {batch_errors:,} errors" if batch_errors else ""
    # the machine's speed drifts between runs and days; /healthz in the same run measures it
    shown_batch += f"; {seeds / reference:.3f} seeds per /healthz request)"

    share = _number(fresh, "rps", "fresh phase") / reference
    p99 = _number(fresh, "p99_ms", "fresh phase")
    errors = _number(fresh, "errors", "fresh phase")
    answered = int(_number(fresh, "requests", "fresh phase"))
    replay_share = _number(replay, "rps", "replay phase") / reference
    replay_errors = int(replay.get("errors", 0))
    shown_replay = f"{100 * replay_share:.1f}% ({replay['rps']:,.1f} req/s{by}"
    shown_replay += f", {replay_errors:,} errors)" if replay_errors else ")"
    return [
        Row(BATCH_SEEDS, seeds, shown_batch),
        Row(
            FRESH_SHARE,
            share,
            f"{100 * share:.1f}% ({fresh['rps']:,.1f} of {reference:,.1f} req/s{by})",
        ),
        Row(FRESH_P99, p99, f"{p99:,.1f} ms"),
        Row(FRESH_ERRORS, errors, f"{errors:,.0f} of {answered:,} requests"),
        Row(REPLAY_SHARE, replay_share, shown_replay),
    ]


def _latency(report: Mapping[str, Any], mechanism: str, batch: int) -> Mapping[str, Any]:
    for row in report.get("latency", ()):
        if row.get("mechanism") == mechanism and row.get("batch") == batch:
            return dict(row)
    raise MeasurementFailed(f"the bench report has no {mechanism} row at batch {batch}")


def _speedup_rows(
    report: Mapping[str, Any],
    reference_ms: float,
    field: str,
    wanted: Sequence[tuple[Target, str, int]],
) -> list[Row]:
    """One row a (target, mechanism, batch): the bench row's ``field`` (a speed-up over the
    reference, whose p50 is ``reference_ms``)."""
    rows = []
    for target, mechanism, batch in wanted:
        row = _latency(report, mechanism, batch)
        speedup = _number(row, field, f"{mechanism} row")
        per_query = _number(row, "p50_ms", f"{mechanism} row")
        shown = f"{speedup:,.1f}x ({per_query:,.2f} against {reference_ms:,.1f} ms a query)"
        rows.append(Row(target, speedup, shown))
    return rows


def engine_rows(report: Mapping[str, Any]) -> list[Row]:
    """The engine targets' rows from ``bench --json``'s report."""
    naive = _number(_latency(report, "naive_reference", 1), "p50_ms", "naive reference row")
    wanted = [(WARM_BLOCK, "noisy_warm", BLOCK), (COLD_BLOCK, "noisy_cold", BLOCK)]
    return _speedup_rows(report, naive, "speedup_vs_naive", wanted)


def papers_rows(report: Mapping[str, Any]) -> list[Row]:
    """The rows against the papers' code from ``bench --papers-code --json``'s report: warm
    blocks of 32 and a lone cold query, each as the papers' p50 over the service's."""
    papers = _number(_latency(report, "papers_code", 1), "p50_ms", "papers' code row")
    wanted = [(PAPERS_WARM, "noisy_warm", BLOCK), (PAPERS_COLD, "noisy_cold", 1)]
    return _speedup_rows(report, papers, "speedup_vs_papers", wanted)


def not_measured_rows() -> list[Row]:
    return [Row(target, None, PAPERS_REASON, "not measured") for target in PAPERS_TARGETS]


def failed_rows(targets: Sequence[Target], reason: str) -> list[Row]:
    """Rows for ``targets`` whose measurement failed; the reason's first line, kept to one table
    cell (the whole reason is printed after the table)."""
    first = (reason.strip().splitlines() or ["(no reason given)"])[0].replace("|", "/")
    return [Row(target, None, f"measurement failed: {first}", "failed") for target in targets]


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (a phase without answers has no percentiles) made
    None, so that the report is strict JSON."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def load_text(load: Sequence[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load) + " (1 / 5 / 15 min)"


def table(rows: Sequence[Row]) -> str:
    lines = ["| target | figure | ratio to target | met? |", "| --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def tally(rows: Sequence[Row]) -> str:
    measured = [row for row in rows if row.status == "measured"]
    met = sum(1 for row in measured if row.met)
    parts = [f"{met} of {len(measured)} measured targets met"]
    not_measured = sum(1 for row in rows if row.status == "not measured")
    failed = sum(1 for row in rows if row.status == "failed")
    if not_measured:
        parts.append(f"{not_measured} not measured")
    if failed:
        parts.append(f"{failed} FAILED to measure")
    return "; ".join(parts)


# --- running the tools ------------------------------------------------------------------


def say(text: str) -> None:
    print(f"speed_targets: {text}", file=sys.stderr, flush=True)


def commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("log", "-1", "--format=%h %s")[:90] or "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain") else "")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_tool(name: str, command: list[str], *, env: Mapping[str, str], timeout: float) -> Any:
    """Run ``command`` (in a process group of its own, so a server it starts is stopped with it
    on a timeout or an interrupt) and return the JSON it printed."""
    say(f"running {' '.join(command[1:])}")
    proc = subprocess.Popen(
        command, cwd=HERE, env=dict(env), stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException as exc:
        _stop_group(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise MeasurementFailed(f"{name} did not finish in {timeout:.0f} s") from None
        raise
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise MeasurementFailed(
            f"{name} exited with status {proc.returncode} without a report (its errors are above)"
        ) from None


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def fresh_database(server_url: str, failures: list[str]) -> Iterator[str]:
    """A new, empty PostgreSQL database on ``server_url``'s server, dropped afterwards."""
    from sqlalchemy import create_engine, make_url
    from sqlalchemy.exc import SQLAlchemyError

    name = f"{DATABASE_PREFIX}{os.getpid()}_{int(time.time())}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        except SQLAlchemyError as exc:
            raise MeasurementFailed(f"cannot create a database on {server_url}: {exc}") from None
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        try:
            yield url
        finally:
            try:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                say(f"dropped the database {name}")
            except Exception as exc:  # reported, and the exit status says so
                failures.append(f"the database {name} could not be dropped: {exc}")
    finally:
        admin.dispose()


def forget_redis_keys(database_url: str, redis_url: str, failures: list[str]) -> None:
    """Delete the keys a server wrote in Redis: all are under ``ppr:<ledger id>:``. The id is
    read from ``ledger_meta`` with plain SQL, so a ledger at any revision is found (benchmarks/
    ab_load.py removes an older commit's keys with this too)."""
    import redis
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            ledger_id = conn.execute(
                text("SELECT value FROM ledger_meta WHERE key = :key"), {"key": "ledger_id"}
            ).scalar_one_or_none()
    except SQLAlchemyError:
        return  # the server never migrated the ledger: it wrote nothing to Redis
    finally:
        engine.dispose()
    if ledger_id is None:
        return
    pattern = f"ppr:{ledger_id}:*"
    try:
        client = redis.Redis.from_url(redis_url)
        try:
            removed = 0
            batch: list[Any] = []
            for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    removed += int(client.delete(*batch))
                    batch = []
            if batch:
                removed += int(client.delete(*batch))
        finally:
            client.close()
    except redis.RedisError as exc:
        failures.append(f"the Redis keys {pattern} could not be removed: {exc}")
        return
    say(f"removed {removed:,} Redis keys {pattern}")


def measure_load(args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    """``loadtest --start --json`` on a fresh database; its report."""
    with (
        tempfile.TemporaryDirectory(prefix="ppr-speed-targets-") as tmp,
        fresh_database(args.postgres_url, failures) as database_url,
    ):
        env = {**os.environ, "PPR_GRAPH_SNAPSHOT_DIR": str(Path(tmp) / "snapshots")}
        command = [
            sys.executable, "-m", "service", "loadtest", "--start", "--port", str(free_port()),
            "--workers", str(args.workers), "--database-url", database_url,
            "--redis-url", args.redis_url, "--graph", str(args.graph), "--mode", "edge",
            "--epsilon", str(EPSILON), "--phases", "healthz,fresh,replay,batch",
            "--batch-size", str(BATCH_SIZE), "--concurrency", str(args.concurrency),
            "--duration", str(args.duration), "--warmup", str(args.warmup), "--json",
        ]  # fmt: skip
        try:
            report: dict[str, Any] = run_tool("loadtest", command, env=env, timeout=args.timeout)
        finally:
            forget_redis_keys(database_url, args.redis_url, failures)
    return report


def measure_engine(args: argparse.Namespace) -> dict[str, Any]:
    nodes, edges = args.generate
    command = [
        sys.executable, "-m", "service", "bench", "--generate", f"{nodes},{edges}",
        "--mode", "edge", "--epsilon", str(EPSILON),
        "--mechanisms", "noisy_cold", "noisy_warm", "naive_reference",
        "--batch", str(BLOCK), "--queries", str(args.queries),
        "--batch-repeats", str(args.batch_repeats), "--json",
    ]  # fmt: skip
    report: dict[str, Any] = run_tool("bench", command, env=os.environ, timeout=args.timeout)
    return report


def measure_papers(args: argparse.Namespace) -> dict[str, Any]:
    """``bench --papers-code`` on the held-out graph's stand-in (or ``--papers-graph``)."""
    if args.papers_graph is not None:
        source = ["--graph", str(args.papers_graph)]
    else:
        source = ["--generate", ",".join(str(x) for x in PAPERS_GENERATE)]
    command = [
        sys.executable, "-m", "service", "bench", *source, "--mode", "edge",
        "--epsilon", str(EPSILON), "--mechanisms", "noisy_cold", "noisy_warm",
        "--batch", str(BLOCK), "--queries", str(PAPERS_QUERIES),
        "--batch-repeats", str(args.batch_repeats), "--papers-code", str(args.papers_code),
        "--papers-python", args.papers_python, "--json",
    ]  # fmt: skip
    report: dict[str, Any] = run_tool("bench", command, env=os.environ, timeout=args.timeout)
    return report


def describe_setup(args: argparse.Namespace, load_report: Mapping[str, Any]) -> dict[str, str]:
    """What each tool measured on, one line each (with where the targets are stated, when the
    run was made elsewhere)."""
    graph = load_report.get("graph", {})
    stated = "" if args.graph.name == DEFAULT_GRAPH.name else f"; targets: {DEFAULT_GRAPH.name}"
    nodes, edges = args.generate
    generated = (
        ""
        if args.generate == DEFAULT_GENERATE
        else f" (targets: {DEFAULT_GENERATE[0]:,} / {DEFAULT_GENERATE[1]:,})"
    )
    size = f"{graph['nodes']:,} nodes / {graph['edges']:,} edges" if graph else "no report"
    if args.papers_code is None:
        papers = "papers' code: not given (--papers-code)"
    else:
        graph_text = (
            args.papers_graph.name
            if args.papers_graph is not None
            else f"generated {PAPERS_GENERATE[0]:,} nodes / {PAPERS_GENERATE[1]:,} edges (the "
            "held-out graph's size; the graph itself is not here)"
        )
        papers = (
            f"papers' code: {args.papers_code} under {args.papers_python}, bench on "
            f"{graph_text}, edge mode, epsilon {EPSILON:g}, {PAPERS_QUERIES} seeds"
        )
    return {
        "papers": papers,
        "load": (
            f"loadtest: PostgreSQL + Redis, {args.workers} workers, {args.graph.name} "
            f"({size}{stated}), "
            f"edge mode, epsilon {EPSILON:g}, driver {load_report.get('driver', '-')}, "
            f"{args.concurrency} connections, {args.duration:g} s a phase, prefix table "
            f"{load_report.get('prefix_table', '-')}"
        ),
        "engine": (
            f"bench: generated {nodes:,} nodes / {edges:,} edges{generated}, edge mode, "
            f"epsilon {EPSILON:g}, {args.queries} seeds, {args.batch_repeats} blocks of {BLOCK} "
            "timed per engine"
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--graph",
        type=Path,
        default=DEFAULT_GRAPH,
        help="the load test's edge list (default: ego-Facebook at %(default)s)",
    )
    parser.add_argument(
        "--postgres-url",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
        help="PostgreSQL server on which a database of the run's own is created and dropped",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--workers", type=positive_int, default=2, help="server workers (default 2)"
    )
    parser.add_argument(
        "--concurrency", type=positive_int, default=32, help="load test connections (default 32)"
    )
    parser.add_argument(
        "--duration", type=positive_float, default=10.0, help="seconds per load phase (default 10)"
    )
    parser.add_argument(
        "--warmup",
        type=seconds,
        default=3.0,
        help="unreported seconds before each query phase (default 3)",
    )
    parser.add_argument(
        "--generate",
        type=generate_spec,
        default=DEFAULT_GENERATE,
        metavar="NODES,EDGES",
        help="bench's generated graph (default 100000,2000000, where the "
        "engine targets are stated; smaller runs faster)",
    )
    parser.add_argument(
        "--queries",
        type=positive_int,
        default=5,
        help="seeds bench times one at a time (default 5)",
    )
    parser.add_argument(
        "--batch-repeats",
        type=positive_int,
        default=3,
        help="blocks of 32 bench times per engine (default 3)",
    )
    parser.add_argument(
        "--papers-code",
        type=Path,
        default=None,
        metavar="DIR",
        help="a checkout of the papers' code (Graph-COM/DP_GraphDiffusion): measures the two "
        "rows against it (default: not measured)",
    )
    parser.add_argument(
        "--papers-python",
        default=sys.executable,
        metavar="PYTHON",
        help="the Python that runs the papers' code, with its requirements (default: this one)",
    )
    parser.add_argument(
        "--papers-graph",
        type=Path,
        default=None,
        metavar="FILE",
        help="the graph to compare with the papers' code on (default: a generated graph of "
        "their held-out graph's size, 10312,333983)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=1200.0,
        help="seconds each tool may take (default 1200)",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    load_start = os.getloadavg()
    head = commit()
    cpus = os.cpu_count() or 1
    say(f"commit {head}; load average {load_text(load_start)} on {cpus} CPUs")
    failures: list[str] = []
    rows: list[Row] = []

    def measured(
        label: str,
        targets: Sequence[Target],
        measure: Callable[[], dict[str, Any]],
        to_rows: Callable[[Mapping[str, Any]], list[Row]],
    ) -> dict[str, Any]:
        """A tool's report, its rows added; on a failed measurement, failed rows and {}."""
        try:
            report = measure()
            rows.extend(to_rows(report))
            return report
        except MeasurementFailed as exc:
            failures.append(f"{label}: {exc}")
            rows.extend(failed_rows(targets, str(exc)))
            return {}

    def measure_load_here() -> dict[str, Any]:
        if not args.graph.is_file():
            raise MeasurementFailed(f"no graph at {args.graph} (give --graph)")
        return measure_load(args, failures)

    load_report = measured("load", LOAD_TARGETS, measure_load_here, load_rows)
    engine_report = measured("engine", ENGINE_TARGETS, lambda: measure_engine(args), engine_rows)
    papers_report: dict[str, Any] = {}
    if args.papers_code is None:
        rows += not_measured_rows()
    else:
        papers_report = measured(
            "papers' code", PAPERS_TARGETS, lambda: measure_papers(args), papers_rows
        )
    load_end = os.getloadavg()
    elapsed = time.monotonic() - started

    setup = describe_setup(args, load_report)
    if args.json:
        print(json.dumps({
            "commit": head,
            "cpus": cpus,
            "load_average": {"start": list(load_start), "end": list(load_end)},
            "elapsed_s": elapsed,
            "setup": setup,
            "rows": [row.to_dict() for row in rows],
            "summary": tally(rows),
            "failures": failures,
            "reports": finite(
                {"loadtest": load_report, "bench": engine_report, "papers": papers_report}
            ),
        }, indent=2, allow_nan=False))  # fmt: skip
    else:
        print(f"speed targets; commit {head}; {cpus} CPUs")
        print(f"load average at the start {load_text(load_start)}; at the end, this run's own "
              f"load included, {load_text(load_end)}")  # fmt: skip
        if load_start[0] > 0.75 * cpus:
            print("(the machine was busy at the start: figures are lower than on a quiet one)")
        print(setup["load"])
        print(setup["engine"])
        print(setup["papers"])
        print()
        print(table(rows))
        print()
        print(f"{tally(rows)}; took {elapsed:.0f} s")
    for failure in failures:
        print(f"speed_targets: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
