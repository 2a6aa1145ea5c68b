"""PostgreSQL's cost of storing RDP curves, by the compression of the column that holds them.

Every charge and every service account's read stores its RDP curve as JSON text (about 2.2 kB
for a diffusion query's 100 orders), so a row is over the 2 kB threshold at which PostgreSQL
compresses a value before storing it. This makes a database next to ``--base-url`` (dropped at
the end) with a table shaped like the charges (an id, a seed, the curve, a timestamp, three
indexes) for each compression: ``pglz`` (PostgreSQL's default), ``lz4`` (what migration 0016
sets) and no compression (``STORAGE EXTERNAL``). It then inserts ``--transactions``
transactions of ``--rows`` rows of one diffusion query's curve (epsilon 0.01, edge mode), in
rounds that alternate the three, and prints per transaction the median wall time,
PostgreSQL's CPU (every PostgreSQL process on the machine, read from /proc as ``loadtest``
reads it: run it on the database's machine) and the bytes stored a curve:

    .venv/bin/python benchmarks/curve_compression.py --rows 200 --transactions 20 --rounds 4

Not part of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from request_statements import drop_database, fresh_database  # this folder's, beside it
from sqlalchemy import create_engine, text

from service.ledger.json_text import encode_json
from service.loadtest import cpu_share
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode

#: Each compression, and the statement that sets it on the table ``t``.
METHODS = {
    "pglz": "ALTER TABLE t ALTER COLUMN rdp SET COMPRESSION pglz",
    "lz4": "ALTER TABLE t ALTER COLUMN rdp SET COMPRESSION lz4",
    "none": "ALTER TABLE t ALTER COLUMN rdp SET STORAGE EXTERNAL",
}


def postgres_cpu_seconds() -> float:
    """CPU seconds of every PostgreSQL process on this machine so far (NaN without /proc)."""
    now = cpu_share.sample(port=0)  # no server of ours: only its postgres group is read
    return float("nan") if now is None else now.seconds["postgres"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--transactions", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    curve = encode_json(plan_diffusion(0.01, 1e-6, 100, 0.8, 1e-7, Mode.EDGE).curve.to_json())
    name = f"ppr_curve_compression_{uuid.uuid4().hex[:8]}"
    url = fresh_database(args.base_url, name)
    engine = create_engine(url)
    walls: dict[str, list[float]] = {method: [] for method in METHODS}
    cpus: dict[str, list[float]] = {method: [] for method in METHODS}
    stored: dict[str, float] = {}
    rows = [{"seed": str(i), "rdp": curve} for i in range(args.rows)]
    insert = text("INSERT INTO t (seed, rdp, created_at) VALUES (:seed, :rdp, now())")
    try:
        with engine.connect() as conn:
            for _ in range(args.rounds):
                for method, statement in METHODS.items():
                    conn.execute(text("DROP TABLE IF EXISTS t"))
                    conn.execute(text("CREATE TABLE t (id serial PRIMARY KEY, seed varchar, "
                                      "rdp text, created_at timestamptz)"))  # fmt: skip
                    conn.execute(text("CREATE INDEX ON t (seed)"))
                    conn.execute(text("CREATE INDEX ON t (created_at)"))
                    conn.execute(text(statement))
                    conn.commit()
                    cpu = postgres_cpu_seconds()
                    for _ in range(args.transactions):
                        started = time.perf_counter()
                        conn.execute(insert, rows)
                        conn.commit()
                        walls[method].append(time.perf_counter() - started)
                    cpus[method].append((postgres_cpu_seconds() - cpu) / args.transactions)
                    size = conn.execute(text("SELECT avg(pg_column_size(rdp)) FROM t")).scalar()
                    stored[method] = float(size)
            conn.execute(text("DROP TABLE t"))
            conn.commit()
    finally:
        engine.dispose()
        drop_database(args.base_url, name)
    print(f"{args.rows} rows of a {len(curve):,}-byte curve a transaction, "
          f"{args.transactions} transactions x {args.rounds} rounds a method\n")  # fmt: skip
    print("| compression | ms a transaction (median) | PostgreSQL CPU ms a transaction "
          "| bytes a curve |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for method in METHODS:
        cpu = ", ".join(f"{c * 1000:.1f}" for c in cpus[method])
        print(f"| {method} | {statistics.median(walls[method]) * 1000:.2f} | {cpu} | "
              f"{stored[method]:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
