"""The draw stage (:meth:`Drawer.draw_group`): each admitted query's own release, the group's
diffusions handed to the engine together before any is waited for, the other rankings drawn
on ``run``; a failure before any noise is drawn refunds that query's charge alone.

The graph, the plans and the ranking draws are real; the engine, the prefixes and the ledger
are fakes that record what they are asked.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import pytest

from service.config import MechanismSettings
from service.graph.build import build_graph
from service.ledger.records import BudgetView, ChargeReceipt, ReleaseKey, StoredRelease
from service.mechanisms.engine import EngineResult
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode
from service.serving.pipeline import draw
from service.serving.pipeline.draw import Drawer
from service.serving.pipeline.items import Admitted, Pending
from service.serving.planner import DiffusionPlanner
from service.serving.rankings import draw_ranked, plan_ranking
from service.serving.schemas import Principal, QueryRequest

GRAPH = build_graph(np.array([0, 1, 2, 3, 0]), np.array([1, 2, 3, 4, 2]))
USER = Principal(account_id=4, type="user", node_id="2", modes=("personalized",))
WAIT = 5.0  # upper bound on a wait for other threads (never reached when things work)
BUDGET = BudgetView(account_id=4, spent_epsilon=0.0, cap_epsilon=1.0, remaining_epsilon=1.0,
                    delta=1e-6)  # fmt: skip


class FakeEngine:
    def __init__(self, log: list[str], failing: set[int]) -> None:
        self.log = log
        self.failing = failing
        self.futures: list[Future[EngineResult]] = []

    @contextmanager
    def together(self) -> Iterator[None]:
        self.log.append("together")
        yield
        self.log.append("end together")

    def submit(self, graph: Any, seed: int, config: Any, **kwargs: Any) -> Future[EngineResult]:
        if seed in self.failing:
            raise MemoryError("no room for this block")
        self.log.append(f"submit {seed}")
        future: Future[EngineResult] = Future()
        future.set_result(EngineResult(np.arange(graph.n, dtype=np.float64)))
        self.futures.append(future)
        return future


class FakePrefixes:
    def lookup(self, *where: Any) -> None:
        return None

    def remember(self, *where: Any) -> None:
        pass


class FakeSettlement:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def refund(self, charge_id: int, *, reason: str) -> None:
        self.log.append(f"refund {charge_id}: {reason}")


class FakeLedger:
    def __init__(self, log: list[str]) -> None:
        self.settlement = FakeSettlement(log)


class FakeReads:
    """Records what the draw counts in a service account's read figure."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def counted(self, req: QueryRequest, version: str, charge_id: int, degree: Any) -> None:
        self.log.append(f"counted {charge_id}")

    def record(self, req: QueryRequest, version: str, charge_id: int, degree: Any) -> None:
        self.log.append(f"record {charge_id}")  # pragma: no cover - must not be called


def drawer(log: list[str], failing: set[int] | None = None, at_once: int = 1) -> Drawer:
    return Drawer(
        engine=cast(Any, FakeEngine(log, failing or set())), prefixes=cast(Any, FakePrefixes()),
        ledger=cast(Any, FakeLedger(log)), reads=cast(Any, FakeReads(log)),
        note_budget=lambda account, budget: None, replay_store_top=3,
        ranking_draws_at_once=at_once,
    )  # fmt: skip


def admitted(
    i: int, node: str, mechanism: RankingMechanism, principal: Principal = USER
) -> Admitted[Pending]:
    req = QueryRequest(principal, node, 2, 0.5, Mode.PERSONALIZED, mechanism=mechanism.value)
    if mechanism is RankingMechanism.NOISY_DIFFUSION:
        m = MechanismSettings()
        plan: Any = DiffusionPlanner().plan(0.5, 1e-6, m.steps, m.beta, m.eta, Mode.PERSONALIZED)
        described: dict[str, Any] = {"name": mechanism.value}
    else:
        plan = plan_ranking(mechanism, 0.5, Mode.PERSONALIZED, None)
        described = plan.describe()
    key = ReleaseKey(4, node, GRAPH.version, "personalized", 0.5, mechanism.value)
    p = Pending(req, GRAPH, GRAPH.index_of(node), 4, key, True, plan, described)
    return (i, p, ChargeReceipt(100 + i, BUDGET))


def in_order(log: list[str]) -> Callable[[list[Callable[[], Any]]], list[Any]]:
    def run(thunks: list[Callable[[], Any]]) -> list[Any]:
        log.append(f"run {len(thunks)}")
        return [thunk() for thunk in thunks]

    return run


def test_diffusions_go_to_the_engine_together_and_the_rest_are_drawn_in_turns() -> None:
    """With one slot, a group's count rankings are drawn on its own thread (``run`` is not
    asked), after every diffusion has gone to the engine."""
    log: list[str] = []
    group = [
        admitted(0, "0", RankingMechanism.NOISY_DIFFUSION),
        admitted(1, "1", RankingMechanism.COMMON_NEIGHBOURS),
        admitted(2, "3", RankingMechanism.NOISY_DIFFUSION),
    ]
    drawn = drawer(log).draw_group(group, in_order(log))
    assert log == ["together", "submit 0", "submit 3", "end together"]
    assert all(isinstance(release, StoredRelease) for release in drawn)
    assert [cast(StoredRelease, r).charge_id for r in drawn] == [100, 101, 102]
    assert [cast(StoredRelease, r).key.node for r in drawn] == ["0", "1", "3"]


def test_a_failure_before_any_noise_refunds_that_charge_alone() -> None:
    log: list[str] = []
    group = [
        admitted(0, "0", RankingMechanism.NOISY_DIFFUSION),
        admitted(1, "3", RankingMechanism.NOISY_DIFFUSION),
    ]
    drawn = drawer(log, failing={GRAPH.index_of("0")}).draw_group(group, in_order(log))
    assert isinstance(drawn[0], MemoryError) and isinstance(drawn[1], StoredRelease)
    assert [entry for entry in log if entry.startswith("refund")] == [
        "refund 100: failed before any noise was drawn"
    ]


def test_a_service_accounts_reads_were_counted_by_admission_the_draw_writes_none() -> None:
    """A service account's releases were counted in its read figure by their admission
    (``Admission.read``): the draw writes no read, only notes them as counted (so a replay
    of one writes nothing either); a user's release is no read at all."""
    service = Principal(account_id=9, type="service", modes=("personalized",))
    log: list[str] = []
    group = [
        admitted(0, "0", RankingMechanism.NOISY_DIFFUSION, service),
        admitted(1, "1", RankingMechanism.COMMON_NEIGHBOURS, service),
        admitted(2, "3", RankingMechanism.NOISY_DIFFUSION),  # a user's: no read figure
    ]
    drawer(log).draw_group(group, in_order(log))
    assert sorted(entry for entry in log if entry.startswith(("counted", "record"))) == [
        "counted 100",
        "counted 101",
    ]


@pytest.mark.parametrize("at_once", [1, 3])
def test_count_rankings_draw_at_most_ranking_draws_at_once_together(
    monkeypatch: pytest.MonkeyPatch, at_once: int
) -> None:
    """Eight count-ranking draws run on eight threads: no more than ``at_once`` draw at one
    time, and with room for three, three do (the others waited their turn, none was lost)."""
    inside, most, lock = [0], [0], threading.Lock()
    full = threading.Barrier(at_once, timeout=WAIT) if at_once > 1 else None

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            if full is not None:
                with contextlib.suppress(threading.BrokenBarrierError):
                    full.wait()  # the first at_once meet here: they are inside together
                    full.abort()  # the later ones pass at once
            time.sleep(0.01)
            return draw_ranked(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(draw, "draw_ranked", counted)
    log: list[str] = []
    group = [admitted(i, str(i % 5), RankingMechanism.COMMON_NEIGHBOURS) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:

        def run(thunks: list[Callable[[], Any]]) -> list[Any]:
            return list(pool.map(lambda thunk: thunk(), thunks))

        drawn = drawer(log, at_once=at_once).draw_group(group, run)
    assert [cast(StoredRelease, r).charge_id for r in drawn] == list(range(100, 108))
    assert most[0] == at_once


@pytest.mark.parametrize("at_once, turns", [(1, 0), (3, 3), (16, 8)])
def test_a_groups_count_rankings_are_shared_among_at_most_at_once_turns(
    monkeypatch: pytest.MonkeyPatch, at_once: int, turns: int
) -> None:
    """Eight count rankings: one slot draws them all on the calling thread, in order; more
    slots hand ``run`` one turn per slot (at most one per draw), each drawing its share in
    turn; the releases come back in the group's order, a failed draw as its own error."""
    threads: list[int] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        if args[1] == GRAPH.index_of("4"):
            raise MemoryError("the draw failed")
        return draw_ranked(*args, **kwargs)

    monkeypatch.setattr(draw, "draw_ranked", recorded)
    log: list[str] = []
    group = [admitted(i, str(i % 5), RankingMechanism.COMMON_NEIGHBOURS) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:

        def run(thunks: list[Callable[[], Any]]) -> list[Any]:
            log.append(f"run {len(thunks)}")
            return list(pool.map(lambda thunk: thunk(), thunks))

        drawn = drawer(log, at_once=at_once).draw_group(group, run)
    assert [entry for entry in log if entry.startswith("run")] == (
        [f"run {turns}"] if turns else []
    )
    here = {threading.get_ident()}
    assert set(threads) == here if turns == 0 else not set(threads) & here
    for i, release in enumerate(drawn):
        if i % 5 == 4:
            assert isinstance(release, MemoryError)
        else:
            assert cast(StoredRelease, release).charge_id == 100 + i
            assert cast(StoredRelease, release).key.node == str(i % 5)
