"""A group's admissions read keys, in-flight twins and stored releases once (GroupReads), and
must answer exactly as the same queries admitted one by one.

Every scenario is played twice on a fresh ledger, each time for a fresh account of its own
(keys, twins and releases are per account, so the two plays cannot see each other): once
with each batch of queries admitted as one group
(``ledger.admission.admit_and_charge_many``) and once with the same queries admitted one at
a time (``ledger.admission.admit_and_charge``), with the same releases, refunds and ageing
of charges in between. The receipts (which charge, reused / joined, budgets) and the
charges' final states must be the same, charges named by their order within the account;
each scenario also checks the outcome it is about.
Real SQLite and PostgreSQL (no mocks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from service.ledger import DegreeCharge, Ledger, ReleaseKey, StoredRelease
from service.ledger.ledger import DEFAULT_STALE_AFTER_SECONDS
from service.ledger.periods import day_start
from service.ledger.records import Admission, ChargeReceipt, ReadAsk
from service.ledger.tables import Charge, utcnow
from service.mechanisms.postprocess import RankedNode
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import plan_diffusion
from service.privacy.curves import laplace_curve
from service.privacy.modes import Mode

DELTA = 3e-6
CURVE: RdpCurve = plan_diffusion(0.1, DELTA, 100, 0.8, 1e-7, Mode.PERSONALIZED).curve


def admission(account: int, seed: str, **kwargs: Any) -> Admission:
    return Admission(
        charged_account_id=account,
        principal_account_id=account,
        seed=seed,
        mechanism="noisy_diffusion",
        mode="edge",
        params={"seed": seed},
        query_curve=CURVE,
        query_epsilon=0.1,
        graph_version="g1",
        request_id=f"req-{seed}",
        **kwargs,
    )


def key(account: int, node: str) -> ReleaseKey:
    return ReleaseKey(account, node, "g1", "edge", 0.1)


def release(account: int, node: str, charge_id: int) -> StoredRelease:
    results = [RankedNode(f"v{i}", 1.0 / (i + 2)) for i in range(5)]
    return StoredRelease(
        key(account, node), charge_id, results, {"name": "noisy_diffusion"}, f"r{charge_id}"
    )


@dataclass
class Batch:
    """Queries admitted together (as one group, or one by one on the other path)."""

    admissions: list[Admission]
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS


#: Something done between batches, given the ledger and every receipt so far (in order).
Action = Callable[[Ledger, list[ChargeReceipt]], None]
Scenario = Callable[[int], list[Batch | Action]]


@dataclass
class Played:
    receipts: list[ChargeReceipt] = field(default_factory=list)
    states: dict[int, str] = field(default_factory=dict)

    def rank(self, charge_id: int) -> int:
        """The charge's place among its account's charges (0: the first made)."""
        return sorted(self.states).index(charge_id)

    def summary(self, budgets: bool = True) -> list[tuple[Any, ...]]:
        return [
            (self.rank(r.charge_id), r.reused, r.joined)
            + ((r.budget.charges, r.budget.spent_epsilon) if budgets else ())
            for r in self.receipts
        ]

    def ranked_states(self) -> list[str]:
        return [self.states[c] for c in sorted(self.states)]


def play(ledger: Ledger, scenario: Scenario, *, grouped: bool) -> Played:
    account = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    played = Played()
    for step in scenario(account):
        if not isinstance(step, Batch):
            step(ledger, played.receipts)
            continue
        stale = step.stale_after_seconds
        if grouped:
            outcomes = ledger.admission.admit_and_charge_many(
                step.admissions, stale_after_seconds=stale
            )
            for outcome in outcomes:
                assert isinstance(outcome, ChargeReceipt), outcome
                played.receipts.append(outcome)
        else:
            for a in step.admissions:
                played.receipts.append(
                    ledger.admission.admit_and_charge(a, stale_after_seconds=stale)
                )
    played.states = {c.charge_id: c.state for c in ledger.reports.list_charges(account)}
    assert ledger.reports.verify().ok
    return played


def both_ways(ledger: Ledger, scenario: Scenario, *, budgets: bool = True) -> Played:
    """The scenario played grouped and one by one (fresh accounts): the same outcomes."""
    grouped = play(ledger, scenario, grouped=True)
    alone = play(ledger, scenario, grouped=False)
    assert grouped.summary(budgets) == alone.summary(budgets)
    assert grouped.ranked_states() == alone.ranked_states()
    return grouped


def store(node: str, receipt: int, *, many: bool = False) -> Action:
    """Store the release of the ``receipt``-th receipt's charge (marks it released)."""

    def act(ledger: Ledger, receipts: list[ChargeReceipt]) -> None:
        charge = receipts[receipt].charge_id
        stored = release(receipts[receipt].budget.account_id, node, charge)
        if many:
            assert ledger.settlement.store_releases([(stored, None, stored.key.account_id)]) == [
                None
            ]
        else:
            ledger.settlement.store_release(
                stored, idempotency_key=None, principal_account_id=stored.key.account_id
            )

    return act


def refund(receipt: int) -> Action:
    def act(ledger: Ledger, receipts: list[ChargeReceipt]) -> None:
        ledger.settlement.refund(receipts[receipt].charge_id, reason="test: no noise was drawn")

    return act


def age(receipt: int, by: timedelta = timedelta(hours=1)) -> Action:
    """Make the ``receipt``-th receipt's charge look admitted ``by`` ago: its admission time
    and the UTC day it records (``period_start``), so ``ledger verify`` still holds when ``by``
    reaches back across midnight."""

    def act(ledger: Ledger, receipts: list[ChargeReceipt]) -> None:
        with Session(ledger.engine) as session, session.begin():
            charge = session.get(Charge, receipts[receipt].charge_id)
            assert charge is not None
            charge.created_at = utcnow() - by
            charge.period_start = day_start(charge.created_at)

    return act


def test_a_twin_in_the_same_group_joins_the_first_ones_charge(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch(
                [
                    admission(acct, "n1", release_key=key(acct, "n1")),
                    admission(acct, "n1", release_key=key(acct, "n1")),
                ]
            )
        ],
    )
    first, twin = played.receipts
    assert not (first.joined or first.reused)
    assert twin.joined and not twin.reused and twin.charge_id == first.charge_id
    assert played.states == {first.charge_id: "admitted"}  # one charge only
    assert twin.budget.charges == 1


def test_the_same_idempotency_key_twice_in_a_group_is_reused(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch(
                [
                    admission(acct, "n1", idempotency_key="k"),
                    admission(acct, "n2", idempotency_key="k"),  # a retry, whatever it asks
                ]
            )
        ],
    )
    first, retry = played.receipts
    assert not first.reused and retry.reused and not retry.joined
    assert retry.charge_id == first.charge_id
    assert len(played.states) == 1 and retry.budget.charges == 1


def test_a_twin_still_in_flight_from_an_earlier_group_is_joined(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))]),
            Batch(
                [
                    admission(acct, "n2", release_key=key(acct, "n2")),
                    admission(acct, "n1", release_key=key(acct, "n1")),
                ]
            ),
        ],
    )
    earlier, other, twin = played.receipts
    assert twin.joined and twin.charge_id == earlier.charge_id
    assert not other.joined and other.charge_id != earlier.charge_id
    assert twin.budget.charges == 2  # the group's new charge is in the budget it shows
    assert set(played.states.values()) == {"admitted"} and len(played.states) == 2


@pytest.mark.parametrize("many", [False, True], ids=["store_release", "store_releases"])
def test_a_stored_release_is_joined(ledger: Ledger, many: bool) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))]),
            store("n1", 0, many=many),
            Batch(
                [
                    admission(acct, "n1", release_key=key(acct, "n1")),
                    admission(acct, "n2", release_key=key(acct, "n2")),
                    admission(acct, "n1", release_key=key(acct, "n1")),
                ]
            ),
        ],
    )
    released, joined, new, joined_again = played.receipts
    assert joined.joined and joined.charge_id == released.charge_id
    assert joined_again.joined and joined_again.charge_id == released.charge_id
    assert not new.joined and new.charge_id not in (released.charge_id,)
    assert played.states == {released.charge_id: "released", new.charge_id: "admitted"}


def test_a_release_of_another_epsilon_or_node_is_not_joined(
    ledger: Ledger,
) -> None:
    def other_epsilon(acct: int) -> ReleaseKey:
        return ReleaseKey(acct, "n1", "g1", "edge", 0.1 + 1e-12)

    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))]),
            store("n1", 0),
            Batch(
                [
                    admission(acct, "n1", release_key=other_epsilon(acct)),
                    admission(acct, "n3", release_key=key(acct, "n3")),
                ]
            ),
        ],
    )
    assert [r.joined for r in played.receipts] == [False, False, False]
    assert len(set(played.states)) == 3


def test_an_idempotency_key_held_by_an_earlier_charge_is_reused(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", idempotency_key="k")]),
            Batch(
                [
                    admission(acct, "n2"),
                    admission(acct, "n3", idempotency_key="k"),
                ]
            ),
        ],
    )
    first, new, retry = played.receipts
    assert retry.reused and retry.charge_id == first.charge_id
    assert retry.budget.charges == 2  # the spend as the group left it
    assert len(played.states) == 2 and new.charge_id != first.charge_id


def test_an_idempotency_key_held_by_a_released_charge_is_reused(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", idempotency_key="k", release_key=key(acct, "n1"))]),
            store("n1", 0),
            Batch([admission(acct, "n1", idempotency_key="k", release_key=key(acct, "n1"))]),
        ],
    )
    first, retry = played.receipts
    assert retry.reused and not retry.joined and retry.charge_id == first.charge_id


def test_a_refunded_charge_does_not_hold_its_idempotency_key(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", idempotency_key="k")]),
            refund(0),
            Batch([admission(acct, "n1", idempotency_key="k")]),
        ],
    )
    refunded, again = played.receipts
    assert not again.reused and again.charge_id != refunded.charge_id
    assert played.states == {refunded.charge_id: "refunded", again.charge_id: "admitted"}
    assert again.budget.charges == 1


def test_a_stale_twin_is_refunded_and_the_query_admitted_anew(ledger: Ledger) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))]),
            age(0),
            Batch(
                [
                    admission(acct, "n2", release_key=key(acct, "n2")),
                    admission(acct, "n1", release_key=key(acct, "n1")),
                ],
                stale_after_seconds=0,
            ),
        ],
        # The group is rolled back, the stale twin refunded, and the group started again, so
        # the query before the stale twin's already sees the refund in the budget it shows
        # (one charge), where alone it was admitted before the refund (two): budgets differ.
        budgets=False,
    )
    stale, other, anew = played.receipts
    assert not anew.joined and anew.charge_id not in (stale.charge_id, other.charge_id)
    # the group was started again after the refund, but charged each query once
    assert played.states == {
        stale.charge_id: "refunded",
        other.charge_id: "admitted",
        anew.charge_id: "admitted",
    }
    assert other.budget.charges == 1 and anew.budget.charges == 2


def test_after_a_stale_twin_is_refunded_a_later_twin_joins_the_new_charge(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))]),
            age(0),  # an hour old: stale after a minute, the new one (just made) is not
            Batch(
                [
                    admission(acct, "n1", release_key=key(acct, "n1")),
                    admission(acct, "n1", release_key=key(acct, "n1")),
                ],
                stale_after_seconds=60,
            ),
        ],
    )
    stale, anew, twin = played.receipts
    assert not anew.joined and anew.charge_id != stale.charge_id
    assert twin.joined and twin.charge_id == anew.charge_id  # the new one, not the stale one
    assert played.states == {stale.charge_id: "refunded", anew.charge_id: "admitted"}


def test_a_twin_charged_earlier_in_the_same_group_is_joined_whatever_its_age(
    ledger: Ledger,
) -> None:
    """The one intended difference from admitting one by one: a twin charged by the group's
    own transaction (not yet committed, answered by this same group) is never stale, so it is
    joined even with stale_after_seconds=0, where a query admitted alone a moment later would
    refund the committed twin and charge again."""
    acct = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    first, second = ledger.admission.admit_and_charge_many(
        [
            admission(acct, "n1", release_key=key(acct, "n1")),
            admission(acct, "n1", release_key=key(acct, "n1")),
        ],
        stale_after_seconds=0,
    )
    assert isinstance(first, ChargeReceipt) and isinstance(second, ChargeReceipt)
    assert not first.joined and second.joined and second.charge_id == first.charge_id
    assert ledger.settlement.charge_state(first.charge_id) == "admitted"


def test_a_twin_younger_than_stale_after_seconds_is_joined_not_refunded(
    ledger: Ledger,
) -> None:
    played = both_ways(
        ledger,
        lambda acct: [
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))]),
            age(0, timedelta(minutes=1)),
            Batch([admission(acct, "n1", release_key=key(acct, "n1"))], stale_after_seconds=3600),
        ],
    )
    first, twin = played.receipts
    assert twin.joined and twin.charge_id == first.charge_id
    assert played.states == {first.charge_id: "admitted"}


def _statements_of(ledger: Ledger, run: Callable[[], Any]) -> tuple[Any, int]:
    """What ``run()`` returns, and how many SQL statements it sent (every engine). SQLite
    inserts a group's charges one row at a time (in process, no round trip), which is not
    counted; PostgreSQL sends them as one statement in a pipeline."""
    sent: list[str] = []
    sqlite = ledger.engine.dialect.name == "sqlite"

    def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if not (sqlite and statement.startswith("INSERT INTO charges")):
            sent.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        return run(), len(sent)
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def test_a_personalized_group_reads_degree_quota_and_graph_release_once(ledger: Ledger) -> None:
    """A service account's group of personalized ``blended`` queries (its quota checked, its
    reads counted, each seed user paying the degree release with its first answer): the
    group's statements do not grow with its size (the degree charges paid before the group,
    the quota window and the graph release are read once for the group, and no charge is
    written before the end), and every user pays the release once: not again if it paid
    before the group, once for two queries in the group."""
    epsilon_d = 0.05
    degree = DegreeCharge("g1", epsilon_d, laplace_curve(epsilon_d))
    service = ledger.accounts.create_account(
        "service", cap_epsilon=100.0, delta=DELTA, modes=("edge", "personalized"),
        may_create_seed_accounts=True, quota_epsilon=100.0,
    ).account_id  # fmt: skip
    read = ReadAsk(default_cap_epsilon=None, graph_release=("g1", "degree_release"))

    def users(count: int, first: int) -> list[int]:
        return [
            ledger.accounts.create_account(
                "user", node_id=str(first + i), cap_epsilon=10.0, delta=DELTA
            ).account_id
            for i in range(count)
        ]

    def ask(user: int, i: int) -> Admission:
        return Admission(
            charged_account_id=user, principal_account_id=service, seed=f"n{user}-{i}",
            mechanism="blended", mode="personalized", params={"name": "blended"},
            query_curve=laplace_curve(0.1), query_epsilon=0.1, graph_version="g1",
            request_id=f"req-{user}-{i}", quota_epsilon=100.0, degree=degree, read=read,
        )  # fmt: skip

    counts = []
    for size, first in ((3, 100), (9, 200)):
        group = users(size, first)
        paid_before = ledger.admission.admit_and_charge(ask(group[0], 0))
        assert paid_before.degree_epsilon == epsilon_d
        asks = [ask(user, 1) for user in group] + [ask(group[1], 2)]
        outcomes, statements = _statements_of(
            ledger, functools.partial(ledger.admission.admit_and_charge_many, asks)
        )
        counts.append(statements)
        assert all(isinstance(o, ChargeReceipt) for o in outcomes), outcomes
        paid = [o.degree_epsilon for o in outcomes if isinstance(o, ChargeReceipt)]
        # group[0] paid before the group; group[1] pays with its first query, not its second
        assert paid == [0.0] + [epsilon_d] * (size - 1) + [0.0]
        for user in group:
            degree_charges = [
                c for c in ledger.reports.list_charges(user) if c.mechanism == "degree_release"
            ]
            assert len(degree_charges) == 1
    assert counts[0] == counts[1], counts
    report = ledger.reports.verify()  # the quota buckets hold every charge to others
    assert report.ok, report.mismatches
