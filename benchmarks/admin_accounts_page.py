"""How long one page of the admin accounts table takes with many accounts, on SQLite and on
PostgreSQL: seeds a fresh ledger (bulk inserts; default 100,000 accounts, a third of them with
a composed spend) and times ``AdminViews.accounts_page`` (the SQL behind
``GET /v1/admin/account-table``: count of matches + one sorted, filtered page of 50).

    .venv/bin/python benchmarks/admin_accounts_page.py                 # both databases
    .venv/bin/python benchmarks/admin_accounts_page.py --backend sqlite --accounts 20000

PostgreSQL: a fresh database named ``ppr_bench_<random>`` is created on ``--postgres`` (default
the test server, postgres@127.0.0.1:5432) and dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, insert, make_url, text

from service.ledger import Ledger, upgrade
from service.ledger.admin_views import AccountFilter, AdminViews, Page
from service.ledger.tables import Account, Budget, Spend
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from service.privacy.orders import GRID_VERSION

DELTA = 1e-6
POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
BATCH = 5000


def _curves() -> list[tuple[dict[str, object], float, float, int]]:
    """A few spends (curve JSON, pure eps, eps at DELTA, charges) to spread over accounts."""
    one = plan_diffusion(0.1, DELTA, 100, 0.8, 1e-7, Mode.PERSONALIZED).curve
    spends = []
    for n in (1, 2, 3, 5, 8, 13, 21, 34, 55):
        curve: RdpCurve = one * n
        spends.append((curve.to_json(), curve.pure, curve.epsilon(DELTA), n))
    return spends


def seed(url: str, accounts: int, rng: random.Random) -> float:
    """Insert ``accounts`` accounts with budgets and spends; seconds taken."""
    started = time.perf_counter()
    engine = create_engine(url)
    spends = _curves()
    zero = RdpCurve.zero().to_json()
    now = datetime.now(UTC)
    try:
        for first in range(1, accounts + 1, BATCH):
            ids = range(first, min(first + BATCH, accounts + 1))
            rows_a, rows_b, rows_s = [], [], []
            for i in ids:
                kind = "service" if i % 50 == 0 else "user"
                node = str(i) if kind == "user" else None
                created = now - timedelta(days=30, seconds=-i)
                rows_a.append({
                    "id": i, "type": kind, "node_id": node, "user_node_id": node,
                    "label": f"team-{i % 997}", "may_create_seed_accounts": False,
                    "modes": "edge", "quota_epsilon": None, "created_at": created,
                })  # fmt: skip
                cap = rng.choice((1.0, 2.0, 3.0, 5.0, 10.0))
                rows_b.append({"account_id": i, "cap_epsilon": cap, "delta": DELTA,
                               "updated_at": created})  # fmt: skip
                if rng.random() < 1 / 3:
                    rdp, pure, eps, n = rng.choice(spends)
                    last = now - timedelta(seconds=rng.randrange(30 * 86400))
                else:
                    rdp, pure, eps, n, last = zero, 0.0, 0.0, 0, None
                rows_s.append({
                    "account_id": i, "rdp": json.dumps(rdp, separators=(",", ":"),
                    sort_keys=True), "pure_epsilon": pure, "grid_version": GRID_VERSION,
                    "charges": n, "epsilon": eps, "last_charge_at": last, "updated_at": created,
                })  # fmt: skip
            with engine.begin() as conn:
                conn.execute(insert(Account.__table__), rows_a)
                conn.execute(insert(Budget.__table__), rows_b)
                conn.execute(insert(Spend.__table__), rows_s)
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT setval('accounts_id_seq', :n)"), {"n": accounts})
            else:
                conn.execute(text("ANALYZE"))
        if engine.dialect.name == "postgresql":  # what autovacuum does to a settled table
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE"))
    finally:
        engine.dispose()
    return time.perf_counter() - started


CASES: list[tuple[str, AccountFilter, str, bool, int]] = [
    ("sorted by spent eps, page 1", AccountFilter(), "spent", True, 0),
    ("sorted by spent eps, page 1000", AccountFilter(), "spent", True, 49_950),
    ("users near cap (>= 80%), by share used", AccountFilter(type="user", status="near_cap"),
     "used", True, 0),
    ("label contains 'team-42', by spent", AccountFilter(q="team-42"), "spent", True, 0),
    ("node prefix '9999', by spent", AccountFilter(q="9999"), "spent", True, 0),
    ("active accounts by remaining eps (asc)", AccountFilter(status="active"), "remaining",
     False, 0),
    ("services by last query", AccountFilter(type="service"), "last_charge", True, 0),
]  # fmt: skip


def timed(call: Callable[[], Page], repeat: int) -> tuple[list[float], Page]:
    page = call()  # warm-up (plans, caches)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        page = call()
        times.append((time.perf_counter() - started) * 1000)
    return times, page


@contextmanager
def database(backend: str, postgres: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"
        return
    name = f"ppr_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(postgres).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(backend: str, accounts: int, repeat: int, postgres: str) -> None:
    rng = random.Random(7)  # benchmark data only; nothing here serves queries
    with database(backend, postgres) as url:
        upgrade(url)
        seconds = seed(url, accounts, rng)
        print(f"\n{backend}: seeded {accounts:,} accounts in {seconds:.1f} s")
        ledger = Ledger.from_url(url)
        views = AdminViews(ledger)
        try:
            print(f"| {backend} page of 50 | matches | median ms | max ms |")
            print("| --- | ---: | ---: | ---: |")
            for label, flt, sort, desc, offset in CASES:
                times, page = timed(
                    lambda f=flt, s=sort, d=desc, o=offset: views.listing.accounts_page(
                        f, sort=s, descending=d, limit=50, offset=o
                    ),
                    repeat,
                )
                print(
                    f"| {label} | {page.total:,} | {statistics.median(times):.1f} "
                    f"| {max(times):.1f} |"
                )
        finally:
            ledger.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--postgres", default=POSTGRES)
    args = parser.parse_args(argv)
    if args.accounts < 1 or args.repeat < 1:
        parser.error("--accounts and --repeat must be positive")
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    for backend in backends:
        run(backend, args.accounts, args.repeat, args.postgres)
    return 0


if __name__ == "__main__":
    sys.exit(main())
