"""Admission under contention from several processes, each with its own Ledger and engine.

The cap is chosen so that exactly ``N`` identical queries fit (computed independently with
:class:`RdpCurve`); the processes together try many more. Whatever the interleaving, exactly N
are admitted, each admitted query has one charge row, and the stored spend is the composition
of exactly N curves, never above the cap. A few idempotency keys are shared by all processes:
each of them is charged once and replayed to the others.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import traceback
from typing import Any

import pytest
from sqlalchemy import text

from service.ledger import BudgetExhausted, Ledger, upgrade
from service.ledger.records import Admission, ChargeReceipt
from service.privacy.accountant import RdpCurve, compose
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from tests.ledger_support import count_charges

PROCESSES = 4
ATTEMPTS = 12  # per process
SHARED_KEYS = 3  # the first attempts of every process use these shared idempotency keys
FIT = 20  # the cap admits exactly this many queries
DELTA = 1e-6


def query_curve() -> RdpCurve:
    return plan_diffusion(0.1, DELTA, 100, 0.8, 1e-7, Mode.PERSONALIZED).curve


def spent_after(n: int) -> float:
    return compose([query_curve()] * n).epsilon(DELTA)


GROUP = 3  # admissions per transaction in the processes that admit in groups

# The processes are forked from multiprocessing's fork server, which a test process starts once
# (importing this module and the ledger, about 1.2 CPU-s) and keeps: the tests run on one xdist
# worker, so one fork server serves them all.
pytestmark = pytest.mark.xdist_group("test_ledger_concurrency")


def attempt(account: int, principal: int, proc: int, i: int, curve: RdpCurve) -> Admission:
    """Process ``proc``'s ``i``-th admission; the first SHARED_KEYS keys are shared by all."""
    return Admission(
        charged_account_id=account,
        principal_account_id=principal,
        seed="n1",
        mechanism="noisy_diffusion",
        mode="personalized",
        params={"attempt": i, "proc": proc},
        query_curve=curve,
        query_epsilon=0.1,
        graph_version="g1",
        request_id=f"{proc}-{i}",
        idempotency_key=f"shared-{i}" if i < SHARED_KEYS else f"p{proc}-{i}",
    )


def outcome_row(outcome: object) -> tuple[str, int, bool, float]:
    if isinstance(outcome, BudgetExhausted):
        return ("refused", -1, False, outcome.budget.spent_epsilon)
    assert isinstance(outcome, ChargeReceipt), outcome
    return ("ok", outcome.charge_id, outcome.reused, outcome.budget.spent_epsilon)


def hammer_grouped(
    ledger: Ledger, account: int, principal: int, proc: int
) -> list[tuple[str, int, bool, float]]:
    """ATTEMPTS admissions in groups of GROUP, each group one transaction."""
    curve = query_curve()
    outcomes: list[tuple[str, int, bool, float]] = []
    for start in range(0, ATTEMPTS, GROUP):
        group = [
            attempt(account, principal, proc, i, curve)
            for i in range(start, min(start + GROUP, ATTEMPTS))
        ]
        outcomes.extend(outcome_row(o) for o in ledger.admission.admit_and_charge_many(group))
    return outcomes


def hammer(
    url: str,
    account: int,
    principal: int,
    proc: int,
    barrier: Any,
    results: Any,
    grouped: bool = False,
) -> None:
    """One process: its own engine, then ATTEMPTS admissions as fast as it can (one per
    transaction, or in groups)."""
    try:
        ledger = Ledger.from_url(url)
        curve = query_curve()
        outcomes: list[tuple[str, int, bool, float]] = []
        barrier.wait(timeout=60)
        if grouped:
            outcomes = hammer_grouped(ledger, account, principal, proc)
        for i in range(ATTEMPTS if not grouped else 0):
            try:
                receipt = ledger.admission.admit_and_charge(
                    attempt(account, principal, proc, i, curve)
                )
            except BudgetExhausted as exc:
                outcomes.append(outcome_row(exc))
            else:
                outcomes.append(outcome_row(receipt))
        ledger.dispose()
        results.put((proc, outcomes, None))
    except BaseException:
        results.put((proc, [], traceback.format_exc()))


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [False, True], ids=["single", "half-grouped"])
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_processes_never_overspend(
    backend: str, grouped: bool, request: pytest.FixtureRequest
) -> None:
    """Also with half of the processes admitting in groups (one transaction per group)."""
    url = str(request.getfixturevalue(f"{backend}_url"))
    # independently: the cap half-way between N and N + 1 queries admits exactly N
    cap = (spent_after(FIT) + spent_after(FIT + 1)) / 2
    fit = 0
    while spent_after(fit + 1) <= cap:
        fit += 1
    assert fit == FIT
    assert PROCESSES * (ATTEMPTS - SHARED_KEYS) + SHARED_KEYS > FIT  # contention for the cap

    upgrade(url)
    setup = Ledger.from_url(url)
    principal = setup.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    account = setup.accounts.create_account(
        "user", node_id="n1", cap_epsilon=cap, delta=DELTA
    ).account_id

    # Separate processes, each opening its own engine, forked from a server process that
    # imported this module (and the ledger) once, rather than each importing them anew (spawn).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=hammer,
            args=(url, account, principal, p, barrier, results, grouped and p % 2 == 0),
        )
        for p in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    outcomes: list[tuple[str, int, bool, float]] = []
    try:
        for _ in range(PROCESSES):
            _, got, error = results.get(timeout=120)
            assert error is None, error
            outcomes.extend(got)
    except queue.Empty:  # pragma: no cover
        pytest.fail("a worker process did not report back")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():  # pragma: no cover
                proc.terminate()
    assert all(proc.exitcode == 0 for proc in procs)
    assert len(outcomes) == PROCESSES * ATTEMPTS

    charged = [o for o in outcomes if o[0] == "ok" and not o[2]]
    reused = [o for o in outcomes if o[0] == "ok" and o[2]]
    refused = [o for o in outcomes if o[0] == "refused"]
    assert len(charged) == FIT
    assert len({o[1] for o in charged}) == FIT
    assert len(reused) == SHARED_KEYS * (PROCESSES - 1)
    assert len(refused) == PROCESSES * ATTEMPTS - FIT - len(reused)
    assert all(o[3] <= cap for o in outcomes)

    budget = setup.budgets.budget(account)
    assert budget.charges == FIT == count_charges(setup, account) == count_charges(setup)
    assert budget.spent_epsilon == spent_after(FIT) <= cap
    with setup.engine.connect() as conn:
        shared = conn.execute(
            text(
                "SELECT idempotency_key, count(*) FROM charges "
                "WHERE idempotency_key LIKE 'shared-%' GROUP BY idempotency_key"
            )
        ).all()
        rdp = conn.execute(text("SELECT rdp FROM spend WHERE account_id = :a"), {"a": account})
        stored = RdpCurve.from_json(json.loads(rdp.scalar_one()))
    assert sorted(shared) == [(f"shared-{i}", 1) for i in range(SHARED_KEYS)]
    assert stored == compose([query_curve()] * FIT)
    setup.dispose()
