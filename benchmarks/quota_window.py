"""How long a service account's 24-hour quota check takes as its window fills, on PostgreSQL.

Makes a fresh database next to ``--base-url`` (migrated by this checkout's ``db upgrade``), a
service account and one user, charges one query, then copies that charge in SQL until the
window holds each of ``--sizes`` live charges to other accounts (spread over the last 24 hours),
and times ``QuotaAndDegree.check_quota`` (the check every charged query of a service account
with a quota runs, under its lock) ``--repeats`` times at each size, passing and refused (a
refusal works out its ``Retry-After`` from the oldest charges). The database is dropped
at the end.

Meant to be run by any checkout's own interpreter, so two commits compare on the same machine:

    .venv/bin/python benchmarks/quota_window.py --sizes 1000 100000

Not part of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.ledger import Ledger, ServiceQuotaExhausted, upgrade
from service.ledger.records import Admission
from service.ledger.tables import utcnow

try:  # a checkout with quota buckets (the window read from them)
    from service.ledger.locked_rows import AdmissionWrites
    from service.ledger.quota_buckets import rebuild_buckets
except ImportError:  # an older checkout: the window summed over its charges
    rebuild_buckets = None  # type: ignore[assignment]
from service.privacy.curves import laplace_curve

#: Columns the copies take from the first charge (the rest are set per copy).
_PER_COPY = ("id", "created_at", "request_id")


def _fill(ledger: Ledger, principal: int, charged: int, size: int) -> None:
    """``size`` live charges from ``principal`` to ``charged`` in the last 24 hours."""
    ledger.admission.admit_and_charge(
        Admission(
            charged_account_id=charged, principal_account_id=principal, seed="1",
            mechanism="noisy_diffusion", mode="edge", params={},
            query_curve=laplace_curve(1e-6), query_epsilon=1e-6, graph_version="g1",
            request_id="r0",
        )
    )  # fmt: skip
    with ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM charges WHERE request_id <> 'r0'"))
        columns = [
            row[0]
            for row in conn.execute(
                text(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = 'charges'"
                )
            )
            if row[0] not in _PER_COPY
        ]
        listed = ", ".join(columns)
        step = 86_000.0 / size  # seconds between two copies: all inside the window
        conn.execute(
            text(
                f"INSERT INTO charges ({listed}, created_at, request_id) "
                f"SELECT {listed}, now() - make_interval(secs => g * {step}), 'r' || g "
                f"FROM charges, generate_series(1, {size - 1}) g WHERE request_id = 'r0'"
            )
        )
        conn.execute(text("ANALYZE charges"))
    if rebuild_buckets is not None:  # a checkout with quota buckets: the copies' buckets too
        with Session(ledger.engine) as session, session.begin():
            rebuild_buckets(session)


def _times(ledger: Ledger, service: int, quota: float, repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` quota checks of a query of 0.1 against ``quota`` (a refusal
    includes working out its Retry-After)."""
    times = []
    for _ in range(repeats):
        with Session(ledger.engine) as session, session.begin():
            started = time.perf_counter()
            try:
                if rebuild_buckets is not None:
                    ledger.quota_and_degree.check_quota(
                        session, service, quota, 0.1, utcnow(), lock=False,
                        writes=AdmissionWrites(),
                    )  # fmt: skip
                else:
                    ledger.quota_and_degree.check_quota(
                        session, service, quota, 0.1, utcnow(), lock=False
                    )
            except ServiceQuotaExhausted:
                pass
            times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    name = f"ppr_quota_bench_{uuid.uuid4().hex[:10]}"
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
    ledger: Ledger | None = None
    try:
        url = args.base_url.rstrip("/") + "/" + name
        upgrade(url)
        ledger = Ledger.from_url(url)
        service = ledger.accounts.create_account("service", cap_epsilon=1e9, delta=1e-6)
        user = ledger.accounts.create_account("user", cap_epsilon=1e9, delta=1e-6, node_id="1")
        print("| charges in the window | check_quota median ms (min) | refused, with Retry-After |")
        print("| ---: | ---: | ---: |")
        for size in args.sizes:
            _fill(ledger, service.account_id, user.account_id, size)
            passed = _times(ledger, service.account_id, 1e9, args.repeats)
            refused = _times(ledger, service.account_id, 1e-9, args.repeats)
            print(
                f"| {size:,} | {statistics.median(passed):.2f} ({min(passed):.2f}) "
                f"| {statistics.median(refused):.2f} ({min(refused):.2f}) |"
            )
    finally:
        if ledger is not None:
            ledger.dispose()
        subprocess.run(
            ["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", "--force", name],
            check=True,
        )


if __name__ == "__main__":
    main()
