"""A service account's 24-hour quota (``QuotaAndDegree.check_quota``), on SQLite and on
PostgreSQL: the window's sum counts only live charges to other accounts made in the last 24 h,
a refusal's ``Retry-After`` is when the oldest charges that free enough have left the window,
and a group's window is read once and added to."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.ledger import Ledger
from service.ledger.locked_rows import AdmissionWrites
from service.ledger.quota_and_degree import QUOTA_WINDOW
from service.ledger.quota_buckets import rebuild_buckets
from service.ledger.records import QuotaWindow, ServiceQuotaExhausted
from service.ledger.tables import Charge, utcnow
from service.privacy.curves import laplace_curve
from tests.ledger_support import admit_and_charge

DELTA = 1e-6


def _charge(ledger: Ledger, principal: int, charged: int, epsilon: float, i: int) -> int:
    receipt = admit_and_charge(
        ledger, charged_account_id=charged, principal_account_id=principal, seed=f"n{i}",
        mechanism="noisy_diffusion", mode="edge", params={"i": i},
        query_curve=laplace_curve(epsilon), query_epsilon=epsilon, graph_version="g1",
        request_id=f"r{i}",
    )  # fmt: skip
    return receipt.charge_id


def _move(ledger: Ledger, charge_id: int, created_at: datetime, **values: Any) -> None:
    """Place a charge in time (or change its state) by hand, its quota buckets with it."""
    with Session(ledger.engine) as session, session.begin():
        session.execute(
            update(Charge).where(Charge.id == charge_id).values(created_at=created_at, **values)
        )
        rebuild_buckets(session)


@pytest.fixture
def window(ledger: Ledger) -> tuple[Ledger, int, datetime]:
    """A service account whose live charges to others in the window are 0.2 (20 h ago), 0.25
    (10 h ago) and 0.1 (1 h ago); beside them one 30 h old, one refunded and one to itself."""
    service = ledger.accounts.create_account("service", cap_epsilon=100.0, delta=DELTA).account_id
    users = [
        ledger.accounts.create_account("user", cap_epsilon=10.0, delta=DELTA, node_id=str(i))
        .account_id
        for i in range(5)
    ]  # fmt: skip
    now = utcnow()
    placed = [
        (users[0], 0.3, now - timedelta(hours=30), {}),  # out of the window
        (users[1], 0.2, now - timedelta(hours=20), {}),
        (users[2], 0.25, now - timedelta(hours=10), {}),
        (users[3], 0.1, now - timedelta(hours=1), {}),
        (users[4], 0.4, now - timedelta(hours=2), {"state": "refunded"}),
        (service, 0.5, now - timedelta(hours=3), {}),  # its own budget, not others'
    ]
    for i, (charged, epsilon, at, values) in enumerate(placed):
        _move(ledger, _charge(ledger, service, charged, epsilon, i), at, **values)
    return ledger, service, now


def _check(
    ledger: Ledger, service: int, epsilon: float, now: datetime,
    windows: dict[int, QuotaWindow] | None = None,
) -> None:  # fmt: skip
    with Session(ledger.engine) as session, session.begin():
        ledger.quota_and_degree.check_quota(
            session, service, 1.0, epsilon, now, lock=False, windows=windows,
            writes=AdmissionWrites(),
        )  # fmt: skip


def test_only_live_charges_to_others_in_the_last_24_hours_count(
    window: tuple[Ledger, int, datetime],
) -> None:
    ledger, service, now = window
    _check(ledger, service, 0.44, now)  # 0.55 used: 0.99 fits
    with pytest.raises(ServiceQuotaExhausted) as refused:  # exactly the quota does not
        _check(ledger, service, 0.45, now)
    assert refused.value.details["used_epsilon"] == pytest.approx(0.55)


@pytest.mark.parametrize(
    ("epsilon", "freed_by"),
    [
        (0.5, timedelta(hours=20)),  # 0.05 too much: the 0.2 of 20 h ago frees it
        (0.7, timedelta(hours=10)),  # 0.25 too much: 0.2 + 0.25 by the charge of 10 h ago
        (0.95, timedelta(hours=1)),  # 0.5 too much: all three
    ],
)
def test_retry_after_is_when_the_oldest_charges_that_free_enough_leave_the_window(
    window: tuple[Ledger, int, datetime], epsilon: float, freed_by: timedelta
) -> None:
    ledger, service, now = window
    with pytest.raises(ServiceQuotaExhausted) as refused:
        _check(ledger, service, epsilon, now)
    expected, told = (QUOTA_WINDOW - freed_by).total_seconds(), refused.value.retry_after
    assert told is not None and expected <= told <= expected + 1


def test_a_query_over_the_quota_alone_waits_the_whole_window(
    window: tuple[Ledger, int, datetime],
) -> None:
    ledger, service, now = window
    with pytest.raises(ServiceQuotaExhausted) as refused:
        _check(ledger, service, 1.5, now)
    assert refused.value.retry_after == QUOTA_WINDOW.total_seconds()


def test_a_groups_window_is_read_once_and_counts_what_the_group_charged(
    window: tuple[Ledger, int, datetime],
) -> None:
    ledger, service, now = window
    windows: dict[int, QuotaWindow] = {}
    _check(ledger, service, 0.1, now, windows)
    assert windows[service].used == pytest.approx(0.55)
    windows[service].add(0.3)  # what the group charged under its lock
    _check(ledger, service, 0.14, now, windows)  # 0.85 + 0.14: fits
    with pytest.raises(ServiceQuotaExhausted):
        _check(ledger, service, 0.15, now, windows)
