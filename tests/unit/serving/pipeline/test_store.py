"""The store stage (:meth:`Storer.store_many`): a group's releases in one transaction, a lone
one group-committed with those stored at the same time, each cached only once stored.

The ledger's settlement and the replay cache are fakes that record what they are given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from service.ledger.ledger import LedgerUnavailable
from service.ledger.records import ChargeSettled, ReleaseKey, StoredRelease
from service.privacy.modes import Mode
from service.serving.pipeline.store import Storer
from service.serving.schemas import Principal, QueryRequest
from tests.unit.serving.pipeline.lone_arrivals import first_alone_then_two_together

USER = Principal(account_id=4, type="user", node_id="n", modes=("personalized",))


def request(node: str, key: str | None = None) -> QueryRequest:
    return QueryRequest(USER, node, 5, 0.1, Mode.EDGE, idempotency_key=key)


def release(charge_id: int) -> StoredRelease:
    return StoredRelease(ReleaseKey(4, "n", "v", "edge", 0.1), charge_id, [], {}, "r")


class FakeSettlement:
    def __init__(self, log: list[Any], settled: set[int], down: bool = False) -> None:
        self.log = log
        self.settled = settled
        self.down = down
        self.inside = threading.Event()
        self.hold = threading.Event()
        self.hold.set()

    def store_release(self, stored: StoredRelease, **kwargs: Any) -> None:
        self.log.append(("one", stored.charge_id, kwargs["idempotency_key"]))
        self.inside.set()
        self.hold.wait(5)
        if self.down:
            raise LedgerUnavailable("down")
        if stored.charge_id in self.settled:
            raise ChargeSettled("refunded")

    def store_releases(self, items: list[tuple[StoredRelease, str | None, int]]) -> list[Any]:
        self.log.append(("many", [stored.charge_id for stored, _, _ in items]))
        if self.down:
            raise LedgerUnavailable("down")
        return [
            ChargeSettled("refunded") if s.charge_id in self.settled else None for s, _, _ in items
        ]


class FakeLedger:
    def __init__(self, settled: set[int] | None = None, down: bool = False) -> None:
        self.log: list[Any] = []
        self.settlement = FakeSettlement(self.log, settled or set(), down)


class FakeReplays:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def put_many(self, entries: list[tuple[StoredRelease, int, str | None]]) -> None:
        self.log.append(("cached", [stored.charge_id for stored, _, _ in entries]))


def storer(ledger: FakeLedger, group_max: int = 1) -> Storer:
    return Storer(cast(Any, ledger), cast(Any, FakeReplays(ledger.log)), group_max)


def test_a_group_is_stored_in_one_transaction_then_cached() -> None:
    ledger = FakeLedger()
    errors = storer(ledger).store_many([(request("a"), release(1)), (request("b"), release(2))])
    assert errors == [None, None]
    assert ledger.log == [("many", [1, 2]), ("cached", [1, 2])]


def test_a_lone_release_is_stored_with_its_key_in_the_single_transaction() -> None:
    ledger = FakeLedger()
    assert storer(ledger).store_many([(request("a", key="k"), release(1))]) == [None]
    assert ledger.log == [("one", 1, "k"), ("cached", [1])]


def test_a_release_whose_charge_was_settled_is_discarded_and_not_cached() -> None:
    ledger = FakeLedger(settled={2})
    errors = storer(ledger).store_many([(request("a"), release(1)), (request("b"), release(2))])
    assert errors[0] is None and isinstance(errors[1], LedgerUnavailable)
    assert errors[1].details == {"charge_id": 2}
    assert ledger.log[-1] == ("cached", [1])
    lone = FakeLedger(settled={3})
    (error,) = storer(lone, group_max=4).store_many([(request("c"), release(3))])
    assert isinstance(error, LedgerUnavailable) and lone.log == [("one", 3, None), ("cached", [])]


def test_a_database_that_is_down_discards_every_answer_of_the_group() -> None:
    for group_max, items in ((1, 2), (4, 1)):
        ledger = FakeLedger(down=True)
        pairs = [(request(str(i)), release(i)) for i in range(items)]
        errors = storer(ledger, group_max).store_many(pairs)
        assert len(errors) == items and all(isinstance(e, LedgerUnavailable) for e in errors)
        assert not any(entry[0] == "cached" for entry in ledger.log)


def test_lone_releases_stored_at_the_same_time_share_one_transaction() -> None:
    ledger = FakeLedger()
    stage = storer(ledger, group_max=8)
    ledger.settlement.hold.clear()  # the first lone store runs alone and waits
    outcomes: dict[int, Any] = {}

    def store(i: int) -> Callable[[], None]:
        def run() -> None:
            outcomes[i] = stage.store_many([(request(str(i)), release(i))])

        return run

    first_alone_then_two_together(
        [store(i) for i in (1, 2, 3)],
        inside=ledger.settlement.inside,
        hold=ledger.settlement.hold,
        queued=lambda: 0 if stage._storing is None else len(stage._storing._queue),
    )
    assert outcomes == {1: [None], 2: [None], 3: [None]}
    stored = [entry for entry in ledger.log if entry[0] in ("one", "many")]
    assert stored[0] == ("one", 1, None) and stored[1][0] == "many"
    assert sorted(stored[1][1]) == [2, 3]
