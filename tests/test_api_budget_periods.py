"""Budget periods over the HTTP API, on SQLite and on PostgreSQL + Redis: an admin gives a
user a daily cap of 0.1; the user spends its day, is refused ``403 budget_exhausted`` with the
reset time and a Retry-After, and is answered again after the reset (the database's clock is
moved through ``ledger.periods.clock``, not slept on); the lifetime figure keeps growing and
matches an independent composition (dp_accounting); ``ledger verify`` passes. With no period
the budget reads exactly as before."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import dp_accounting
import pytest
from dp_accounting import rdp as dp_rdp
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.ledger.budget_rule import fits_under_cap
from service.ledger.period_spend import database_now
from service.ledger.periods import period_end
from service.mechanisms.charges import count_release
from service.mechanisms.registry import RankingMechanism
from service.privacy.orders import ORDERS
from tests.api_support import bearer, ledger_of
from tests.test_api import Accounts, accounts, backend, client, query

__all__ = ["accounts", "backend", "client"]  # the fixtures, used by name

PER_ANSWER = 0.03
DAY_CAP = 0.1
#: What one common-neighbours answer at PER_ANSWER is charged: a Laplace release.
CURVE = count_release(RankingMechanism.COMMON_NEIGHBOURS, PER_ANSWER).curve


def _independent(answers: int, delta: float) -> float:
    """``answers`` Laplace releases at the charged epsilon composed by dp_accounting on the
    service's orders at ``delta``; the pure figure where smaller (the service takes both)."""
    accountant = dp_rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / CURVE.pure), answers)
    return min(float(accountant.get_epsilon(delta)), answers * CURVE.pure)


def _move_clock(client: TestClient) -> Callable[[timedelta], datetime]:
    ledger = ledger_of(client)
    shift = [timedelta(0)]
    ledger.periods.clock = lambda session: database_now(session) + shift[0]

    def move(by: timedelta) -> datetime:
        shift[0] = by
        with Session(ledger.engine) as session:
            return database_now(session) + by

    return move


def _ask(client: TestClient, key: str, node: str) -> Any:
    return query(client, key, node, epsilon=PER_ANSWER, mechanism="common_neighbours", fresh="true")


def test_a_daily_user_is_refused_until_the_reset_then_answered_again(
    client: TestClient, accounts: Accounts
) -> None:
    move = _move_clock(client)
    account, key = accounts.user("40", cap_epsilon=5.0)
    admin = bearer(accounts.admin_key)
    put = client.put(
        f"/v1/admin/accounts/{account}/budget",
        json={"period": "day", "period_cap_epsilon": DAY_CAP}, headers=admin,
    )  # fmt: skip
    assert put.status_code == 200, put.text
    assert put.json()["period"] == "day" and put.json()["period_spent_epsilon"] == 0.0
    delta = put.json()["delta"]
    per_day = max(q for q in range(1, 20) if fits_under_cap(_independent(q, delta), DAY_CAP))
    answered = 0
    lifetime: list[float] = []
    for day in range(2):
        now = move(timedelta(days=day))
        for _ in range(per_day):
            response = _ask(client, key, "40")
            assert response.status_code == 200, response.text
            budget = response.json()["budget"]
            answered += 1
            lifetime.append(budget["spent_epsilon"])
            assert budget["period"] == "day" and budget["period_cap_epsilon"] == DAY_CAP
        refused = _ask(client, key, "40")
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "budget_exhausted"
        reset = period_end("day", now)
        assert error["details"]["resets_at"] == reset.isoformat()
        assert error["details"]["budget"]["period_resets_at"] == reset.isoformat()
        retry = int(refused.headers["Retry-After"])
        assert 0 < retry <= (reset - now).total_seconds() + 1
        shown = client.get(f"/v1/admin/accounts/{account}", headers=admin).json()["budget"]
        assert shown["period_spent_epsilon"] == pytest.approx(_independent(per_day, delta))
        assert shown["period_resets_at"] == reset.isoformat()
        assert shown["spent_epsilon"] == pytest.approx(_independent(answered, delta), rel=1e-6)
    # the lifetime figure kept growing past the day's cap, as dp_accounting composes it
    assert lifetime == sorted(lifetime) and lifetime[-1] > DAY_CAP
    assert lifetime[-1] == pytest.approx(_independent(answered, delta), rel=1e-6)
    # a replay of what was released stays free, in a spent day too
    replay = query(client, key, "40", epsilon=PER_ANSWER, mechanism="common_neighbours")
    assert replay.status_code == 200 and replay.json()["replayed"] is True
    assert ledger_of(client).reports.verify().ok


def test_periods_are_set_and_cleared_by_the_admin_and_validated(
    client: TestClient, accounts: Accounts
) -> None:
    account, key = accounts.user("41", cap_epsilon=2.0)
    admin = bearer(accounts.admin_key)
    path = f"/v1/admin/accounts/{account}/budget"
    before = client.get(f"/v1/admin/accounts/{account}", headers=admin).json()["budget"]
    assert not any(name.startswith("period") for name in before)  # today's shape
    answer = _ask(client, key, "41").json()
    assert not any(name.startswith("period") for name in answer["budget"])
    for body, parameter in [
        ({"period_cap_epsilon": 0.5}, "period"),
        ({"period": "week"}, "period_cap_epsilon"),
        ({"clear_period": True, "period": "day"}, "clear_period"),
    ]:
        refused = client.put(path, json=body, headers=admin)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.json()["error"]["details"]["parameter"] == parameter
    assert (
        client.put(
            path, json={"period": "year", "period_cap_epsilon": 1}, headers=admin
        ).status_code
        == 422
    )
    weekly = client.put(path, json={"period": "week", "period_cap_epsilon": 0.5}, headers=admin)
    assert weekly.json()["period"] == "week"
    assert weekly.json()["period_spent_epsilon"] == pytest.approx(
        CURVE.epsilon(weekly.json()["delta"])
    )
    monthly = client.put(path, json={"period": "month"}, headers=admin).json()
    assert monthly["period"] == "month" and monthly["period_cap_epsilon"] == 0.5
    cleared = client.put(path, json={"clear_period": True}, headers=admin).json()
    assert not any(name.startswith("period") for name in cleared)
    assert cleared["charges"] == 1
    assert cleared["spent_epsilon"] == pytest.approx(CURVE.epsilon(cleared["delta"]))
