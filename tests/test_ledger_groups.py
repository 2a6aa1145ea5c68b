"""Group transactions of the ledger: many admissions in one, many releases stored in one,
the group committer that forms them, the compact release format and cached authentication.
Real SQLite and PostgreSQL (no mocks)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from service.ledger import (
    BudgetExhausted,
    ChargeSettled,
    Ledger,
    ReleaseKey,
    StoredRelease,
)
from service.ledger.records import Admission, ChargeReceipt
from service.ledger.release_format import decode_results, encode_results
from service.mechanisms.postprocess import RankedNode
from service.privacy.accountant import RdpCurve, compose
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from service.serving.group_commit import GroupCommitter
from tests.ledger_support import admit_and_charge, count_charges

# it mostly waits (4.7 s, 1.2 CPU-s in a run of the suite): scheduled apart, conftest.py
pytestmark = pytest.mark.waits

DELTA = 3e-6


def curve_for(epsilon: float) -> RdpCurve:
    return plan_diffusion(epsilon, DELTA, 100, 0.8, 1e-7, Mode.PERSONALIZED).curve


def admission(account: int, i: int, curve: RdpCurve, **kwargs: Any) -> Admission:
    return Admission(
        charged_account_id=account,
        principal_account_id=kwargs.pop("principal", account),
        seed=f"n{i}",
        mechanism="noisy_diffusion",
        mode="edge",
        params={"i": i},
        query_curve=curve,
        query_epsilon=0.1,
        graph_version="g1",
        request_id=f"r{i}",
        **kwargs,
    )


def test_a_group_admits_in_order_until_the_cap_and_refuses_the_rest(ledger: Ledger) -> None:
    curve = curve_for(0.1)
    fits_two = (compose([curve] * 2).epsilon(DELTA) + compose([curve] * 3).epsilon(DELTA)) / 2
    a = ledger.accounts.create_account("service", cap_epsilon=fits_two, delta=DELTA).account_id
    b = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    # accounts interleaved and out of id order: each is checked against its own spend so far
    group = [admission(b, 0, curve), admission(a, 1, curve), admission(a, 2, curve),
             admission(a, 3, curve), admission(b, 4, curve)]  # fmt: skip
    outcomes = ledger.admission.admit_and_charge_many(group)
    assert [type(o).__name__ for o in outcomes] == [
        "ChargeReceipt", "ChargeReceipt", "ChargeReceipt", "BudgetExhausted", "ChargeReceipt",
    ]  # fmt: skip
    receipts = [o for o in outcomes if isinstance(o, ChargeReceipt)]
    assert len({r.charge_id for r in receipts}) == 4
    assert [r.budget.charges for r in receipts] == [1, 1, 2, 2]
    refused = outcomes[3]
    assert isinstance(refused, BudgetExhausted)
    assert refused.budget.charges == 2  # it saw the two charges before it, nothing of its own
    assert ledger.budgets.budget(a).spent_epsilon == compose([curve] * 2).epsilon(DELTA) <= fits_two
    assert ledger.budgets.budget(b).charges == 2
    assert count_charges(ledger, a) == 2 and count_charges(ledger, b) == 2
    assert ledger.reports.verify().ok


def test_a_group_reuses_idempotency_keys_and_joins_twins(ledger: Ledger) -> None:
    curve = curve_for(0.1)
    acct = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    first = ledger.admission.admit_and_charge_many(
        [admission(acct, 0, curve, idempotency_key="k0")]
    )[0]
    assert isinstance(first, ChargeReceipt) and not first.reused
    twin_key = ReleaseKey(acct, "n9", "g1", "edge", 0.1)
    outcomes = ledger.admission.admit_and_charge_many(
        [
            admission(acct, 1, curve, idempotency_key="k0"),  # a retry: the earlier charge
            admission(acct, 9, curve, release_key=twin_key),
            admission(acct, 9, curve, release_key=twin_key),  # its twin in the same group
        ]
    )
    retry, new, twin = outcomes
    assert isinstance(retry, ChargeReceipt) and retry.reused
    assert retry.charge_id == first.charge_id
    assert isinstance(new, ChargeReceipt) and not (new.reused or new.joined)
    assert isinstance(twin, ChargeReceipt) and twin.joined and twin.charge_id == new.charge_id
    assert ledger.budgets.budget(acct).charges == 2


def test_a_retry_in_a_group_shows_the_budget_the_group_has_charged_so_far(
    ledger: Ledger,
) -> None:
    curve = curve_for(0.1)
    a = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    b = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    first = ledger.admission.admit_and_charge_many([admission(a, 0, curve, idempotency_key="k0")])[
        0
    ]
    assert isinstance(first, ChargeReceipt)
    # the retry names another charged account, but its key is the earlier charge to ``a``,
    # which this same group charges again before it
    new, retry = ledger.admission.admit_and_charge_many(
        [admission(a, 1, curve), admission(b, 2, curve, principal=a, idempotency_key="k0")]
    )
    assert isinstance(new, ChargeReceipt) and isinstance(retry, ChargeReceipt) and retry.reused
    assert retry.charge_id == first.charge_id
    assert retry.budget.account_id == a
    # a's spend as this transaction left it: the earlier charge and the group's new one
    assert retry.budget.charges == new.budget.charges == 2
    assert retry.budget.spent_epsilon == ledger.budgets.budget(a).spent_epsilon
    assert ledger.budgets.budget(b).charges == 0


def test_a_group_with_a_key_taken_meanwhile_falls_back_to_one_by_one(ledger: Ledger) -> None:
    curve = curve_for(0.1)
    acct = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    # the same key twice in one group: the unique index refuses the group's flush
    outcomes = ledger.admission.admit_and_charge_many(
        [
            admission(acct, 0, curve, idempotency_key="same"),
            admission(acct, 1, curve, idempotency_key="same"),
        ]
    )
    assert all(isinstance(o, ChargeReceipt) for o in outcomes)
    assert [o.reused for o in outcomes if isinstance(o, ChargeReceipt)] == [False, True]
    assert ledger.budgets.budget(acct).charges == 1


def release_of(key: ReleaseKey, charge_id: int, n: int) -> StoredRelease:
    results = [RankedNode(f"v{i}", 1.0 / (i + 3)) for i in range(n)]
    return StoredRelease(key, charge_id, results, {"name": "noisy_diffusion"}, f"req{charge_id}")


def test_a_group_of_releases_is_stored_in_one_transaction(ledger: Ledger) -> None:
    curve = curve_for(0.1)
    acct = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    receipts = ledger.admission.admit_and_charge_many([admission(acct, i, curve) for i in range(3)])
    ids = [r.charge_id for r in receipts if isinstance(r, ChargeReceipt)]
    keys = [ReleaseKey(acct, f"n{i}", "g1", "edge", 0.1) for i in range(3)]
    ledger.settlement.refund(ids[1], reason="failed before any noise was drawn")
    releases = [release_of(k, c, 50) for k, c in zip(keys, ids, strict=True)]
    outcomes = ledger.settlement.store_releases(
        [(r, None, acct) for r in releases] + [(releases[0], None, acct)]
    )
    assert outcomes[0] is None and outcomes[2] is None and outcomes[3] is None
    assert isinstance(outcomes[1], ChargeSettled)  # refunded: its answer must be discarded
    assert ledger.stored_releases.find_release(keys[0]) == releases[0]
    assert ledger.stored_releases.find_release(keys[1]) is None
    states = {c.charge_id: c.state for c in ledger.reports.list_charges(acct)}
    assert states == {ids[0]: "released", ids[1]: "refunded", ids[2]: "released"}
    assert ledger.settlement.store_releases([(releases[2], None, acct)]) == [
        None
    ]  # stored before: no-op
    assert ledger.reports.verify().ok


def test_the_compact_release_format_is_exact_and_reads_the_old_form() -> None:
    rng = np.random.default_rng(3)
    scores = [float(x) for x in rng.standard_normal(1000)] + [1e-300, -0.0, 5e-324]
    results = [RankedNode(f"node {i} é", s) for i, s in enumerate(scores)]
    decoded = decode_results(encode_results(results))
    assert list(decoded) == results
    assert [r.score for r in decoded[:3]] == scores[:3] and len(decoded) == len(results)
    assert all(np.float64(a.score).tobytes() == np.float64(b).tobytes()
               for a, b in zip(decoded, scores, strict=True))  # fmt: skip
    assert decode_results(encode_results(decoded)) == results  # re-encoding a decoded release
    assert list(decode_results([["a", 0.5], ["b", 0.25]])) == [
        RankedNode("a", 0.5),
        RankedNode("b", 0.25),
    ]
    bad = encode_results(results[:2])
    bad["count"] = 3  # three results stated, two packed
    with pytest.raises(ValueError):
        decode_results(bad)
    with pytest.raises(ValueError):
        decode_results({"format": "other"})


def test_group_committer_gives_each_caller_its_own_outcome() -> None:
    entered = threading.Event()
    release = threading.Event()
    groups: list[list[int]] = []

    def run(items: list[int]) -> list[int | BaseException]:
        groups.append(items)
        if len(groups) == 1:
            entered.set()
            assert release.wait(10)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    committer: GroupCommitter[int, int] = GroupCommitter(run, max_group=3)
    outcomes: dict[int, Any] = {}

    def call(i: int) -> None:
        try:
            outcomes[i] = committer.submit(i)
        except ValueError as exc:
            outcomes[i] = str(exc)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert entered.wait(10)  # the lone first caller runs at once, as a group of one
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 6)]
    for t in others:
        t.start()
    while len(committer._queue) < 5:  # all five queued behind the running group
        time.sleep(0.001)
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert groups[0] == [0]
    assert sorted(i for g in groups[1:] for i in g) == [1, 2, 3, 4, 5]
    assert max(len(g) for g in groups[1:]) == 3 and len(groups) == 3  # max_group respected
    assert outcomes == {0: 0, 1: "odd 1", 2: 20, 3: "odd 3", 4: 40, 5: "odd 5"}
    assert committer.groups == 3 and committer.items == 6


def test_group_committer_gives_a_group_failure_to_each_member() -> None:
    def run(items: list[int]) -> list[int]:
        raise RuntimeError("database gone")

    committer: GroupCommitter[int, int] = GroupCommitter(run, max_group=8)
    with pytest.raises(RuntimeError, match="database gone"):
        committer.submit(1)
    assert not committer._busy  # the next caller leads again


def test_cached_authentication_has_a_documented_staleness_bound(ledger_url: str) -> None:
    from service.ledger import upgrade

    upgrade(ledger_url)
    here, elsewhere = Ledger.from_url(ledger_url), Ledger.from_url(ledger_url)
    try:
        acct = here.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
        key, record = here.api_keys.create_api_key(acct)
        assert here.api_keys.authenticate_cached(key, 3600) is not None
        elsewhere.api_keys.revoke_api_key(record.key_id)  # another process
        # within the bound this process may still accept it; reading through never does
        assert here.api_keys.authenticate_cached(key, 3600) is not None
        assert here.api_keys.authenticate_cached(key, 0) is None
        assert (
            here.api_keys.authenticate_cached(key, 3600) is None
        )  # the failed read dropped the entry
        key2, record2 = here.api_keys.create_api_key(acct)
        assert here.api_keys.authenticate_cached(key2, 3600) is not None
        here.api_keys.revoke_api_key(record2.key_id)  # this process: at once
        assert here.api_keys.authenticate_cached(key2, 3600) is None
    finally:
        here.dispose()
        elsewhere.dispose()


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "group"])
def test_a_stale_twin_is_refunded_in_a_transaction_of_its_own(
    ledger: Ledger, grouped: bool
) -> None:
    """Reconciling a stale in-flight twin must not happen inside the admission that meets it:
    its refund locks the twin's exposure shard, which inside the admission would be a second
    shard lock out of ascending order (two such admissions could deadlock)."""
    from sqlalchemy import event

    curve = curve_for(0.1)
    acct = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    key = ReleaseKey(acct, "n9", "g1", "edge", 0.1)
    stale = ledger.admission.admit_and_charge_many([admission(acct, 9, curve, release_key=key)])[0]
    assert isinstance(stale, ChargeReceipt)  # admitted, never released: its worker died

    transactions: list[list[str]] = []
    current: list[str] = []
    engine = ledger._engine

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        current.append(statement.lower())

    def on_end(_conn: Any) -> None:
        transactions.append(list(current))
        current.clear()

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "commit", on_end)
    event.listen(engine, "rollback", on_end)
    try:
        if grouped:
            outcome = ledger.admission.admit_and_charge_many(
                [admission(acct, 9, curve, release_key=key)], stale_after_seconds=0.0
            )[0]
        else:
            outcome = admit_and_charge(
                ledger,
                charged_account_id=acct, principal_account_id=acct, seed="n9",
                mechanism="noisy_diffusion", mode="edge", params={"i": 9}, query_curve=curve,
                query_epsilon=0.1, graph_version="g1", request_id="r9b", release_key=key,
                idempotency_key=None, stale_after_seconds=0.0,
            )  # fmt: skip
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "commit", on_end)
        event.remove(engine, "rollback", on_end)

    assert isinstance(outcome, ChargeReceipt) and not outcome.joined
    assert outcome.charge_id != stale.charge_id
    assert ledger.settlement.charge_state(stale.charge_id) == "refunded"
    assert ledger.settlement.charge_state(outcome.charge_id) == "admitted"
    refunding = [t for t in transactions if any("insert into refunds" in s for s in t)]
    charging = [t for t in transactions if any("insert into charges" in s for s in t)]
    assert len(refunding) == 1 and len(charging) == 1
    assert refunding[0] is not charging[0]
    assert not any("insert into charges" in s for s in refunding[0])
    assert ledger.budgets.budget(acct).charges == 1
    assert ledger.reports.verify().ok


def test_requests_that_find_a_keys_lookup_expired_together_read_the_database_once(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen threads ask at once for a key whose cached lookup has just expired: one of them
    reads the database, the others wait for it and take its fresh answer. Revoked meanwhile,
    none of them is answered from the expired entry (a failed lookup is not kept: each reads)."""
    acct = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    key, record = ledger.api_keys.create_api_key(acct)
    lookups: list[str] = []
    read = ledger.api_keys.authenticate

    def slow_read(api_key: str) -> Any:
        lookups.append(api_key)
        time.sleep(0.05)  # long enough for every thread to reach the lookup meanwhile
        return read(api_key)

    monkeypatch.setattr(ledger.api_keys, "authenticate", slow_read)
    cache = ledger.api_keys._auth_cache
    for revoked in (False, True):
        assert ledger.api_keys.authenticate_cached(key, 60.0) is not None
        digest, (account, _, generation) = next(iter(cache.items()))
        cache[digest] = (account, time.monotonic() - 120.0, generation)  # expired
        if revoked:
            elsewhere = Ledger.from_url(str(ledger.engine.url.render_as_string(False)))
            elsewhere.api_keys.revoke_api_key(record.key_id)  # another process
            elsewhere.dispose()
        lookups.clear()
        start = threading.Barrier(16)
        answers: list[Any] = []

        def ask(start: threading.Barrier, answers: list[Any]) -> None:
            start.wait()
            answers.append(ledger.api_keys.authenticate_cached(key, 60.0))

        threads = [threading.Thread(target=ask, args=(start, answers)) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(answers) == 16 and all((a is None) == revoked for a in answers)
        assert len(lookups) == (16 if revoked else 1)
