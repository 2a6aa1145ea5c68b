"""A batch longer than the reconcile limit: does every item come back answered?

Starts ``python -m service serve --workers N`` from ``--checkout`` (its own ``service``
package) on a fresh SQLite ledger (or ``--database-url``, a PostgreSQL server: a database of
its own is created and dropped) and the built-in demo graph (or ``--graph``), with
``PPR_RECONCILE_AFTER_SECONDS`` at ``--reconcile-after`` (5) and every worker reconciling
every ``--reconcile-interval`` seconds (1), then sends one ``POST /v1/embeddings/batch`` of
``--items`` (600) distinct nodes in ``edge`` mode for a service account, and prints how many
items were answered, the errors by code, how long the batch took, the charges by state and
``python -m service ledger verify``'s verdict.

    .venv/bin/python benchmarks/long_batch.py --checkout .
    .venv/bin/python benchmarks/long_batch.py --checkout /tmp/before

Before charges in flight beat, every item whose charge the reconciler reached before the
batch stored its releases came back ``ledger_unavailable``. Sends traffic only to 127.0.0.1;
everything it starts it stops. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(checkout: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *args], cwd=checkout, env=env,
                          text=True, capture_output=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="worktree to serve from")
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reconcile-after", type=float, default=5.0)
    parser.add_argument("--reconcile-interval", type=float, default=1.0)
    parser.add_argument("--graph", type=Path, help="edge list (default: the demo graph)")
    parser.add_argument("--database-url", help="a PostgreSQL server URL (default: SQLite)")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ppr-long-batch-") as tmp:
        work = Path(tmp)
        url, drop = _database(args.database_url, work)
        env = {**os.environ, "PPR_DATABASE_URL": url, "PPR_LOG_LEVEL": "warning",
               "PPR_GRAPH_SNAPSHOT_DIR": str(work / "snapshots"),
               "PPR_RECONCILE_AFTER_SECONDS": str(args.reconcile_after),
               "PPR_RECONCILE_INTERVAL_SECONDS": str(args.reconcile_interval),
               "PPR_BATCH_MAX_ITEMS": str(max(1000, args.items)),
               "PPR_RATE_LIMIT_PER_SECOND": "0"}  # fmt: skip
        if args.graph is not None:
            env["PPR_GRAPH_PATH"] = str(args.graph.resolve())
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        try:
            result = _run(checkout, work, env, args)
        finally:
            drop()
    result["checkout"] = str(args.checkout)
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0 if result["answered"] == args.items and result["verify_exit"] == 0 else 1


def _run(checkout: Path, work: Path, env: dict[str, str], args: argparse.Namespace) -> dict:
    cli(checkout, "db", "upgrade", env=env).check_returncode()
    made = cli(checkout, "accounts", "create", "--type", "service", "--modes", "edge",
               "--cap", "1000", "--json", env=env)  # fmt: skip
    made.check_returncode()
    created = json.loads(made.stdout)
    key = created.get("api_key") or created["key"]
    port = free_port()
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--workers", str(args.workers),
         "--port", str(port)],
        cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
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
        nodes = [str(n) for n in range(args.items)]
        started = time.perf_counter()
        response = httpx.post(
            f"{base}/v1/embeddings/batch",
            json={"nodes": nodes, "mode": "edge", "epsilon": 0.1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=1800,
        )
        seconds = time.perf_counter() - started
        response.raise_for_status()
        items = response.json()["items"]
        errors = Counter(item["error"]["code"] for item in items if item.get("error"))
        time.sleep(args.reconcile_after + 2 * args.reconcile_interval)  # the reconciler runs
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    verify = cli(checkout, "ledger", "verify", "--json", env=env)
    report = json.loads(verify.stdout) if verify.stdout.strip().startswith("{") else {}
    states = _charge_states(checkout, env)
    log_text = (work / "server.log").read_text(errors="replace")
    return {
        "items": args.items,
        "answered": len(items) - sum(errors.values()),
        "errors_by_code": dict(errors),
        "batch_seconds": round(seconds, 1),
        "reconcile_after_seconds": args.reconcile_after,
        "charges_by_state": states,
        "verify_exit": verify.returncode,
        "verify_mismatches": len(report.get("mismatches", [])) if report else None,
        "reconcile_pass_failures_logged": log_text.count("reconciliation pass failed"),
    }


def _charge_states(checkout: Path, env: dict[str, str]) -> dict[str, int]:
    code = (
        "import json, os\n"
        "from sqlalchemy import create_engine, text\n"
        "e = create_engine(os.environ['PPR_DATABASE_URL'])\n"
        "with e.connect() as c:\n"
        "    rows = c.execute(text('SELECT state, count(*) FROM charges GROUP BY state'))\n"
        "    print(json.dumps({s: n for s, n in rows}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    states: dict[str, int] = json.loads(done.stdout)
    return states


def _database(url: str | None, work: Path) -> tuple[str, object]:
    if url is None:
        return f"sqlite:///{work / 'ledger.db'}", lambda: None
    from sqlalchemy import create_engine, make_url, text

    name = f"ppr_long_batch_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(url).set(database=name).render_as_string(hide_password=False), drop


if __name__ == "__main__":
    raise SystemExit(main())
