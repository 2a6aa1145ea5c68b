"""The quota window read from buckets of a minute (``service/ledger/quota_buckets.py``), on SQLite
and on PostgreSQL: the buckets are kept by the admissions and refunds themselves, the window's
sum from them equals the sum over the charges at every start (bucket boundaries and charges
exactly at the start included), ``ledger verify`` compares them and catches a bucket that
differs, and under concurrent admissions of one service account the quota still holds."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.ledger import Ledger, ServiceQuotaExhausted
from service.ledger import admission_rules as admission_rules_module
from service.ledger.periods import as_aware_utc
from service.ledger.quota_buckets import (
    QUOTA_BUCKET,
    bucket_start,
    buckets_from_charges,
    charges_to_others,
    exact_window_sum,
    oldest_freeing,
    stored_buckets,
    window_sum,
)
from service.ledger.tables import Charge, QuotaBucket
from service.ledger.verification import verify_ledger
from service.privacy.curves import laplace_curve
from tests.ledger_support import admit_and_charge

DELTA = 1e-6


def test_a_bucket_starts_at_its_minute_whatever_the_zone_or_naivety() -> None:
    at = datetime(2026, 11, 29, 10, 44, 59, 999_999, tzinfo=UTC)
    assert bucket_start(at) == datetime(2026, 11, 29, 10, 44, tzinfo=UTC)
    assert bucket_start(at.replace(tzinfo=None)) == bucket_start(at)
    assert bucket_start(at.astimezone(timezone(timedelta(hours=-5)))) == bucket_start(at)
    after = at + timedelta(microseconds=1)
    assert bucket_start(after) == datetime(2026, 11, 29, 10, 45, tzinfo=UTC)
    boundary = datetime(2026, 11, 29, 0, 0, tzinfo=UTC)
    assert bucket_start(boundary) == boundary
    assert bucket_start(boundary - timedelta(microseconds=1)) == boundary - QUOTA_BUCKET


def _users(ledger: Ledger, count: int) -> list[int]:
    return [
        ledger.accounts.create_account("user", cap_epsilon=100.0, delta=DELTA, node_id=str(i))
        .account_id
        for i in range(count)
    ]  # fmt: skip


def _charge(
    ledger: Ledger, principal: int, charged: int, epsilon: float, i: int, quota: float | None
) -> int:
    receipt = admit_and_charge(
        ledger, charged_account_id=charged, principal_account_id=principal, seed=f"n{i}",
        mechanism="noisy_diffusion", mode="personalized", params={"i": i},
        query_curve=laplace_curve(epsilon), query_epsilon=epsilon, graph_version="g1",
        request_id=f"r{i}", quota_epsilon=quota,
    )  # fmt: skip
    return receipt.charge_id


def test_the_windows_sum_from_buckets_is_the_sum_over_the_charges(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Charges admitted (through the ledger, its clock placed) over 30 hours, a third of them
    refunded, one to the service itself; the sum from the buckets equals the exact sum at
    every window start: random ones, bucket boundaries, and the instants of charges."""
    rng = random.Random(7)
    service = ledger.accounts.create_account("service", cap_epsilon=1e6, delta=DELTA).account_id
    other = ledger.accounts.create_account("service", cap_epsilon=1e6, delta=DELTA).account_id
    users = _users(ledger, 6)
    now = datetime(2026, 11, 29, 12, 7, 30, tzinfo=UTC)
    clock = {"at": now}
    monkeypatch.setattr(admission_rules_module, "utcnow", lambda: clock["at"])
    moments: list[datetime] = []
    charged: list[int] = []
    for i in range(60):
        at = now - timedelta(seconds=rng.uniform(0, 30 * 3600))
        if i % 10 == 0:  # some exactly on a bucket boundary
            at = bucket_start(at)
        clock["at"] = at
        moments.append(at)
        principal = other if i % 7 == 0 else service
        target = service if i == 5 else users[i % len(users)]
        charged.append(
            _charge(ledger, principal, target, round(rng.uniform(0.01, 0.3), 3), i, None)
        )
    for charge_id in charged[::3]:
        ledger.settlement.refund(charge_id, reason="test: refunded")
    with Session(ledger.engine) as session:
        stored, expected = stored_buckets(session), buckets_from_charges(session)
        kept = {k: v for k, v in stored.items() if v[1]}  # emptied by refunds: 0 charges
        assert kept.keys() == expected.keys() and len(expected) > 20
        for key, (eps, count) in expected.items():
            assert kept[key][1] == count and kept[key][0] == pytest.approx(eps, abs=1e-12)
        starts = [now - timedelta(hours=24)]
        starts += [bucket_start(m) for m in moments[:20]]
        starts += moments[:20]
        starts += [now - timedelta(seconds=rng.uniform(0, 30 * 3600)) for _ in range(20)]
        for principal in (service, other):
            for since in starts:
                assert window_sum(session, principal, since) == pytest.approx(
                    exact_window_sum(session, principal, since), abs=1e-12
                )
        since = now - timedelta(hours=24)
        live = sorted(
            (as_aware_utc(c.created_at), c.id, c.epsilon)
            for c in session.scalars(select(Charge).where(charges_to_others(service)))
            if as_aware_utc(c.created_at) > since
        )
        running = 0.0
        for at, _, epsilon in live:  # Retry-After's charge: where the oldest add up to excess
            running += epsilon
            found = oldest_freeing(session, service, since, running - 1e-9)
            assert found is not None and as_aware_utc(found) == at
        assert oldest_freeing(session, service, since, running + 0.01) is None
    assert verify_ledger(ledger.engine).ok


def test_verify_catches_a_bucket_that_is_not_its_charges_sum(ledger: Ledger) -> None:
    service = ledger.accounts.create_account("service", cap_epsilon=1e6, delta=DELTA).account_id
    (user,) = _users(ledger, 1)
    _charge(ledger, service, user, 0.2, 0, 10.0)
    assert verify_ledger(ledger.engine).ok
    with ledger.engine.begin() as conn:
        conn.execute(update(QuotaBucket).values(epsilon=QuotaBucket.epsilon - 0.1))
    report = verify_ledger(ledger.engine)
    assert [m["kind"] for m in report.mismatches] == ["quota_bucket"]


@pytest.mark.postgres
def test_concurrent_admissions_of_one_service_account_keep_its_quota(
    postgres_url: str,
) -> None:
    """Four threads, each with its own connection, admit charges of 0.1 from one service
    account with a quota of 2.05 to twelve users, refunding every fifth: whatever the
    interleaving, the live charges in the window never pass the quota, the buckets are the
    charges' sums and verify is clean (no deadlock between admissions and refunds)."""
    from service.ledger import upgrade

    upgrade(postgres_url)
    ledger = Ledger.from_url(postgres_url)
    try:
        service = ledger.accounts.create_account("service", cap_epsilon=1e6, delta=DELTA).account_id
        users = _users(ledger, 12)
        refused = [0]
        errors: list[BaseException] = []

        def work(worker: int) -> None:
            try:
                for i in range(12):
                    n = worker * 100 + i
                    try:
                        charge = _charge(ledger, service, users[n % 12], 0.1, n, 2.05)
                    except ServiceQuotaExhausted:
                        refused[0] += 1
                        continue
                    if i % 5 == 4:
                        ledger.settlement.refund(charge, reason="test: refunded")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        with Session(ledger.engine) as session:
            since = datetime.now(UTC) - timedelta(hours=24)
            used = exact_window_sum(session, service, since)
            assert used <= 2.05 + 1e-9 and refused[0] > 0
            assert window_sum(session, service, since) == pytest.approx(used, abs=1e-12)
        assert verify_ledger(ledger.engine).ok
    finally:
        ledger.dispose()
