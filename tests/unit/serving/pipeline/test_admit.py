"""The admit stage (:class:`Admitter`): one way into admission for every charge.

The ledger is a fake that records which of its admission calls ran with what; the graph-wide
cap is a fake too. The prepared queries are real :class:`Pending` / :class:`PopularPending`
records (with stand-ins for the graph and plan the fakes never read).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from service.ledger.records import (
    Admission,
    BudgetExhausted,
    BudgetView,
    ChargeReceipt,
    DegreeReceipt,
    GraphCap,
    ReleaseKey,
)
from service.privacy.modes import Mode
from service.serving.pipeline.admit import Admitter, split_twins
from service.serving.pipeline.items import Pending, PopularPending, PreparedGroup
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.schemas import Principal, QueryRequest
from tests.unit.serving.pipeline.lone_arrivals import first_alone_then_two_together

BUDGET = BudgetView(account_id=1, spent_epsilon=0.0, cap_epsilon=1.0, remaining_epsilon=1.0,
                    delta=1e-6)  # fmt: skip
SERVICE = Principal(account_id=9, type="service", modes=("personalized", "edge"))


class Graph:
    version = "v1"


class FakeAdmissions:
    def __init__(self, log: list[Any], refuse: set[str]) -> None:
        self.log = log
        self.refuse = refuse
        self.next_charge = 0
        self.inside = threading.Event()  # a transaction is running
        self.hold = threading.Event()  # ... and waits for this before it commits
        self.hold.set()

    def _receipt(self, a: Admission) -> ChargeReceipt | BudgetExhausted:
        if a.seed in self.refuse:
            return BudgetExhausted(BUDGET, a.query_epsilon)
        self.next_charge += 1
        return ChargeReceipt(self.next_charge, BUDGET)

    def admit_and_charge(self, a: Admission, **kwargs: Any) -> ChargeReceipt:
        self.log.append(("alone", a.seed))
        self.inside.set()
        self.hold.wait(5)
        outcome = self._receipt(a)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def admit_and_charge_many(self, admissions: list[Admission], **kwargs: Any) -> list[Any]:
        self.log.append(("together", [a.seed for a in admissions]))
        return [self._receipt(a) for a in admissions]


class FakeDegrees:
    def __init__(self, log: list[Any], refuse: set[str]) -> None:
        self.log = log
        self.refuse = refuse

    def admit_degree_release(self, **ask: Any) -> DegreeReceipt:
        self.log.append(("degree release", ask["seed"], ask["quota_epsilon"]))
        if ask["seed"] in self.refuse:
            raise BudgetExhausted(BUDGET, ask["degree"].epsilon)
        return DegreeReceipt(BUDGET, charged=True, epsilon=ask["degree"].epsilon)


class FakeLedger:
    def __init__(self, refuse: set[str] | None = None) -> None:
        self.log: list[Any] = []
        self.admission = FakeAdmissions(self.log, refuse or set())
        self.quota_and_degree = FakeDegrees(self.log, refuse or set())


class FakeCaps:
    def for_graph(self, graph: Any) -> GraphCap | None:
        return None


class Degrees:
    graph_version = "v1"

    class plan:  # noqa: N801 - stands in for a LaplacePlan
        epsilon = 0.5

    curve = "curve"


def request(node: str, principal: Principal = SERVICE) -> QueryRequest:
    return QueryRequest(principal=principal, node=node, k=5, epsilon=0.1, mode=Mode.EDGE)


def pending(node: str) -> Pending:
    key = ReleaseKey(9, node, "v1", "edge", 0.1)
    return Pending(request(node), cast(Any, Graph()), 0, 9, key, True, cast(Any, None), {})


def popular(node: str, account_id: int = 3) -> PopularPending:
    return PopularPending(request(node), cast(Any, Graph()), 0, account_id, cast(Any, Degrees()))


def admission_of(p: Pending) -> Admission:
    return Admission(
        charged_account_id=p.account_id, principal_account_id=p.req.principal.account_id,
        seed=p.req.node, mechanism="m", mode="edge", params={}, query_curve=None,
        query_epsilon=0.1, graph_version="v1", request_id=p.req.node,
    )  # fmt: skip


def admitter(ledger: FakeLedger, group_max: int = 1) -> Admitter:
    policy = AdmissionPolicy(service_quota_epsilon=2.0)
    return Admitter(cast(Any, ledger), policy, cast(Any, FakeCaps()), group_max)


def group(*items: Pending | PopularPending) -> PreparedGroup[Pending]:
    out: PreparedGroup[Pending] = PreparedGroup()
    for i, p in enumerate(items):
        if isinstance(p, PopularPending):
            out.popular.append((i, p))
        else:
            out.to_admit.append((i, p))
    return out


def test_a_group_is_admitted_in_one_transaction_and_a_lone_query_alone() -> None:
    ledger = FakeLedger()
    admitted = admitter(ledger).admit(group(pending("a"), pending("b")), admission_of)
    assert [(i, p.req.node) for i, p, _ in admitted.own] == [(0, "a"), (1, "b")]
    lone = admitter(ledger).admit(group(pending("c")), admission_of)
    assert [p.req.node for _, p, _ in lone.own] == ["c"]
    assert ledger.log == [("together", ["a", "b"]), ("alone", "c")]


def test_popular_is_charged_its_degree_release_in_the_admit_stage_before_the_queries() -> None:
    ledger = FakeLedger()
    admitted = admitter(ledger).admit(group(popular("p"), pending("a")), admission_of)
    # a service account charging another account: its quota is checked with the release
    assert ledger.log == [("degree release", "p", 2.0), ("alone", "a")]
    ((i, p, receipt),) = admitted.popular
    assert (i, p.req.node, receipt.charged) == (0, "p", True)
    assert [p.req.node for _, p, _ in admitted.own] == ["a"]


def test_a_refused_query_is_refused_and_the_others_go_on() -> None:
    ledger = FakeLedger(refuse={"b", "p"})
    items = group(popular("p"), pending("a"), pending("b"), pending("c"))
    admitted = admitter(ledger).admit(items, admission_of)
    assert sorted(i for i, _ in admitted.refused) == [0, 2]
    assert all(isinstance(e, BudgetExhausted) for _, e in admitted.refused)
    assert [i for i, _, _ in admitted.own] == [1, 3]
    assert admitted.popular == []


def test_a_failed_transaction_is_each_query_s_error() -> None:
    ledger = FakeLedger()

    def broken(admissions: list[Admission], **kwargs: Any) -> list[Any]:
        raise ConnectionError("database down")

    ledger.admission.admit_and_charge_many = broken  # type: ignore[method-assign]
    admitted = admitter(ledger).admit(group(pending("a"), pending("b")), admission_of)
    assert [(i, type(e)) for i, e in admitted.refused] == [
        (0, ConnectionError),
        (1, ConnectionError),
    ]
    assert admitted.own == []


def test_lone_admissions_arriving_together_share_one_transaction() -> None:
    ledger = FakeLedger()
    stage = admitter(ledger, group_max=8)
    ledger.admission.hold.clear()  # the first lone admission runs alone and waits
    results: dict[str, Any] = {}

    def admit(node: str) -> Callable[[], None]:
        def run() -> None:
            results[node] = stage.admit(group(pending(node)), admission_of)

        return run

    first_alone_then_two_together(
        [admit(node) for node in "abc"],
        inside=ledger.admission.inside,
        hold=ledger.admission.hold,
        queued=lambda: 0 if stage._admitting is None else len(stage._admitting._queue),
    )
    assert ledger.log[0] == ("alone", "a")
    assert ledger.log[1][0] == "together" and sorted(ledger.log[1][1]) == ["b", "c"]
    assert all(len(results[node].own) == 1 for node in "abc")


@pytest.mark.parametrize(
    ("receipts", "own", "earlier", "here"),
    [
        ([ChargeReceipt(1, BUDGET)], [0], [], []),
        # joined charge 1, admitted in this group: answered from its release once stored
        ([ChargeReceipt(1, BUDGET), ChargeReceipt(1, BUDGET, joined=True)], [0], [], [1]),
        # joined (or reused a key's) charge 7, admitted before the group: waited for
        ([ChargeReceipt(7, BUDGET, reused=True), ChargeReceipt(2, BUDGET)], [1], [0], []),
    ],
)
def test_receipts_are_sorted_by_what_the_query_does_next(
    receipts: list[ChargeReceipt], own: list[int], earlier: list[int], here: list[int]
) -> None:
    admitted = [(i, pending(str(i)), r) for i, r in enumerate(receipts)]
    sorted_out = split_twins(admitted)
    assert [[i for i, _, _ in part] for part in sorted_out] == [own, earlier, here]
