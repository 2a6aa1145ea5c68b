"""The coordinator (:class:`GroupAnswers`): a group through prepare -> admit -> draw -> store
-> answer, in that order, each stage fed the previous one's output.

The kind and every collaborator are fakes that write what they are asked into one journal,
so the tests read the order of the stages. A request is a string: ``"q:a"`` a query to admit,
``"replay:a"`` a stored release's replay, ``"key:a"`` a keyed replay to bind, ``"pop:a"``
``popular``, ``"bad:a"`` an error while preparing. The fake admitter refuses ``refuse:*``,
joins ``here:*`` to the group's first own charge and ``earlier:*`` to a charge admitted
before the group (charging it when it is admitted again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import pytest

from service.ledger.records import (
    Admission,
    BudgetExhausted,
    BudgetView,
    ChargeReceipt,
    DegreeReceipt,
    ReleaseKey,
    StoredRelease,
)
from service.serving.pipeline.group import GroupAnswers
from service.serving.pipeline.items import (
    Admitted,
    AdmittedGroup,
    PopularPending,
    PreparedGroup,
    Ready,
    Run,
    Step,
    ToAdmit,
    ToBind,
    run_in_turn,
)

BUDGET = BudgetView(account_id=1, spent_epsilon=0.0, cap_epsilon=1.0, remaining_epsilon=1.0,
                    delta=1e-6)  # fmt: skip


@dataclass(frozen=True)
class Query:
    """A fake kind's query prepared for admission (what :class:`Prepared` asks of one)."""

    name: str

    @property
    def req(self) -> Any:
        return self.name

    @property
    def graph(self) -> Any:
        return None

    @property
    def key(self) -> ReleaseKey:
        return ReleaseKey(1, self.name, "v", "edge", 0.1)


def release(charge_id: int, name: str) -> StoredRelease:
    return StoredRelease(ReleaseKey(1, name, "v", "edge", 0.1), charge_id, [], {}, name)


def popular(name: str) -> PopularPending:
    return PopularPending(cast(Any, name), cast(Any, None), 0, 1, cast(Any, None))


class Journal(list[str]):
    def index_of(self, prefix: str) -> int:
        return next(i for i, entry in enumerate(self) if entry.startswith(prefix))


class FakeAdmitter:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.next_charge = 100
        self.seen: set[str] = set()  # a query admitted again is charged (its twin refunded)

    def admit(
        self, group: PreparedGroup[Query], admission: Callable[[Query], Admission]
    ) -> AdmittedGroup[Query]:
        names = [p.name for _, p in group.to_admit] + [p.req for _, p in group.popular]
        self.journal.append(f"admit {' '.join(names)}")
        out: AdmittedGroup[Query] = AdmittedGroup()
        for i, pop in group.popular:
            out.popular.append((i, pop, DegreeReceipt(BUDGET, charged=True, epsilon=0.5)))
        first_own: int | None = None
        for i, p in group.to_admit:
            admission(p)
            again = p.name in self.seen
            self.seen.add(p.name)
            if p.name.startswith("refuse"):
                out.refused.append((i, BudgetExhausted(BUDGET, 0.1)))
            elif p.name.startswith("here") and first_own is not None:
                out.joined_here.append((i, p, ChargeReceipt(first_own, BUDGET, joined=True)))
            elif p.name.startswith("earlier") and not again:
                out.joined_earlier.append((i, p, ChargeReceipt(7, BUDGET, joined=True)))
            else:
                self.next_charge += 1
                first_own = first_own or self.next_charge
                out.own.append((i, p, ChargeReceipt(self.next_charge, BUDGET)))
        return out


class FakeStorer:
    def __init__(self, journal: Journal, failing: set[str] | None = None) -> None:
        self.journal = journal
        self.failing = failing or set()

    def store_many(self, items: list[tuple[Any, StoredRelease]]) -> list[BaseException | None]:
        self.journal.append(f"store {' '.join(str(req) for req, _ in items)}")
        return [RuntimeError("not stored") if req in self.failing else None for req, _ in items]


class FakeReplayer:
    """Twins: a twin admitted earlier is refunded (``refunded``: the query is admitted again
    and answered on its own charge) or stored (its release replayed)."""

    def __init__(self, journal: Journal, refunded: bool = False) -> None:
        self.journal = journal
        self.refunded = refunded

    def from_twin_in_group(
        self, p: Query, twin: StoredRelease | BaseException | None, replay: Any
    ) -> Any:
        if twin is None or isinstance(twin, BaseException):
            return twin or RuntimeError("no twin")
        return replay(twin, p)

    def join_twin(self, p: Query, receipt: ChargeReceipt, admit: Any, replay: Any, own: Any) -> Any:
        self.journal.append(f"wait {p.name} for charge {receipt.charge_id}")
        if self.refunded:
            return own(p, admit(p))
        return replay(release(receipt.charge_id, "earlier twin"), p)


class FakeLive:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    @contextmanager
    def holding(self, charge_ids: Iterable[int]) -> Iterator[None]:
        self.journal.append(f"hold {sorted(charge_ids)}")
        yield
        self.journal.append("let go")


class FakeRefusals:
    @contextmanager
    def gathered(self) -> Iterator[None]:
        yield


class Kind(GroupAnswers[str, Query, str, str]):
    """A fake kind: answers are strings naming how they were made."""

    def __init__(
        self,
        journal: Journal,
        *,
        storer: FakeStorer | None = None,
        replayer: FakeReplayer | None = None,
        failing_draws: set[str] | None = None,
    ) -> None:
        self.journal = journal
        self.admitting = cast(Any, FakeAdmitter(journal))
        self.storing = cast(Any, storer or FakeStorer(journal))
        self.replaying = cast(Any, replayer or FakeReplayer(journal))
        self.live = cast(Any, FakeLive(journal))
        self.refusals = cast(Any, FakeRefusals())
        self.failing_draws = failing_draws or set()

    def prepare(self, req: str) -> Step[str, str, Query]:
        self.journal.append(f"prepare {req}")
        kind, name = req.split(":")
        if kind == "bad":
            raise ValueError(name)
        if kind == "replay":
            return Ready(f"replayed {name}")
        if kind == "key":
            return ToBind(name)
        if kind == "pop":
            return popular(name)
        return ToAdmit(Query(name))

    def bind(self, items: list[str]) -> list[Ready[str] | ToAdmit[Query] | BaseException]:
        self.journal.append(f"bind {' '.join(items)}")
        return [Ready(f"bound {name}") for name in items]

    def admission(self, p: Query) -> Admission:
        return cast(Admission, p.name)

    def draw_group(
        self, admitted: list[Admitted[Query]], run: Run
    ) -> list[StoredRelease | BaseException]:
        self.journal.append(f"draw {' '.join(p.name for _, p, _ in admitted)}")
        failed = RuntimeError("draw failed")
        return [
            failed if p.name in self.failing_draws else release(r.charge_id, p.name)
            for _, p, r in admitted
        ]

    def fresh_answer(self, p: Query, receipt: ChargeReceipt, stored: StoredRelease) -> str:
        self.journal.append(f"answer {p.name}")
        return f"fresh {p.name} ({receipt.charge_id})"

    def replay_admitted(self, stored: StoredRelease, p: Query) -> str:
        return f"{p.name} from {stored.request_id} ({stored.charge_id})"

    def popular_answer(self, p: PopularPending, receipt: DegreeReceipt) -> str:
        return f"popular {p.req} (charged {receipt.charged})"


def answers(kind: Kind, reqs: Sequence[str]) -> list[Any]:
    return [
        str(o) if isinstance(o, BaseException) else o for o in kind.answer_many(reqs, run_in_turn)
    ]


def test_the_stages_run_in_order_each_once_for_the_group() -> None:
    journal = Journal()
    out = answers(Kind(journal), ["q:a", "replay:b", "q:c", "key:d"])
    assert out == ["fresh a (101)", "replayed b", "fresh c (102)", "bound d"]
    assert journal == [
        "prepare q:a", "prepare replay:b", "prepare q:c", "prepare key:d", "bind d",
        "admit a c", "hold [101, 102]", "draw a c", "store a c", "let go",
        "answer a", "answer c",
    ]  # fmt: skip


def test_a_lone_query_is_a_group_of_one() -> None:
    journal = Journal()
    assert Kind(journal).answer("q:a") == "fresh a (101)"
    assert journal == ["prepare q:a", "admit a", "hold [101]", "draw a", "store a", "let go",
                       "answer a"]  # fmt: skip
    with pytest.raises(ValueError, match="x"):
        Kind(Journal()).answer("bad:x")


def test_a_refused_query_is_neither_drawn_nor_stored() -> None:
    journal = Journal()
    out = Kind(journal).answer_many(["q:refuse1", "q:a"], run_in_turn)
    assert isinstance(out[0], BudgetExhausted) and out[1] == "fresh a (101)"
    assert journal[journal.index_of("admit") :] == [
        "admit refuse1 a", "hold [101]", "draw a", "store a", "let go", "answer a",
    ]  # fmt: skip


def test_no_answer_is_made_before_every_release_of_the_group_is_stored() -> None:
    journal = Journal()
    ready: list[tuple[Any, ...]] = []
    kind = Kind(journal)
    out = kind.answer_many(
        ["q:a", "replay:b", "q:c"], run_in_turn, lambda i, o: ready.append((i, o))
    )
    assert journal.index_of("store") < journal.index_of("answer")
    assert ready == [(1, "replayed b")]  # only what is final before admission is told early
    assert out[0] == "fresh a (101)" and out[2] == "fresh c (102)"


def test_a_failed_draw_is_that_query_s_error_and_is_not_stored() -> None:
    journal = Journal()
    out = answers(Kind(journal, failing_draws={"a"}), ["q:a", "q:c"])
    assert out == ["draw failed", "fresh c (102)"]
    assert "store c" in journal


def test_a_twin_of_the_group_is_answered_from_its_release_once_stored() -> None:
    out = answers(Kind(Journal()), ["q:a", "q:here1"])
    assert out == ["fresh a (101)", "here1 from a (101)"]
    failed = answers(Kind(Journal(), storer=FakeStorer(Journal(), failing={"a"})),
                     ["q:a", "q:here1"])  # fmt: skip
    assert failed == ["not stored", "not stored"]  # the twin's release was discarded


def test_a_twin_admitted_earlier_is_waited_for_after_the_group_is_stored() -> None:
    journal = Journal()
    out = answers(Kind(journal), ["q:a", "q:earlier1"])
    assert out == ["fresh a (101)", "earlier1 from earlier twin (7)"]
    assert journal.index_of("store") < journal.index_of("wait earlier1")


def test_a_refunded_twin_s_query_is_admitted_again_and_answered_alone() -> None:
    journal = Journal()
    kind = Kind(journal, replayer=FakeReplayer(journal, refunded=True))
    out = answers(kind, ["q:earlier1"])
    assert out == ["fresh earlier1 (101)"]
    assert journal[journal.index_of("wait"):] == [
        "wait earlier1 for charge 7", "admit earlier1", "hold [101]", "draw earlier1",
        "store earlier1", "let go", "answer earlier1",
    ]  # fmt: skip


def test_popular_is_admitted_with_the_group_and_never_drawn_or_stored() -> None:
    journal = Journal()
    out = answers(Kind(journal), ["pop:p", "q:a"])
    assert out == ["popular p (charged True)", "fresh a (101)"]
    assert "admit a p" in journal  # one admit stage for both
    assert "draw a" in journal and "store a" in journal


def test_an_error_while_preparing_is_that_query_s_outcome_at_once() -> None:
    ready: list[tuple[Any, ...]] = []
    out = Kind(Journal()).answer_many(
        ["bad:x", "q:a"], run_in_turn, lambda i, o: ready.append((i, o))
    )
    assert isinstance(out[0], ValueError) and out[1] == "fresh a (101)"
    assert [i for i, _ in ready] == [0]
