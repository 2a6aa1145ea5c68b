"""The budget ledger on real SQLite and PostgreSQL databases (no mocks)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text

from service.errors import InvalidParameter
from service.ledger import (
    UPGRADE_COMMAND,
    AccountExists,
    BudgetExhausted,
    ChargeSettled,
    Ledger,
    LedgerGridMismatch,
    LedgerNotMigrated,
    ReleaseKey,
    StoredRelease,
    UnknownAccount,
    UnknownApiKey,
    UnknownCharge,
    upgrade,
)
from service.ledger.database import make_engine
from service.ledger.keys import hash_api_key
from service.ledger.tables import EXPOSURE_SHARDS, Base
from service.mechanisms.postprocess import RankedNode
from service.privacy.accountant import RdpCurve, compose
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from service.privacy.orders import GRID_VERSION, grid_fingerprint
from tests.ledger_support import admit_and_charge, count_charges

DELTA = 3e-6
TABLES = {
    "accounts", "api_keys", "budgets", "spend", "charges", "refunds", "releases", "audit_log",
    "ledger_meta", "alembic_version", "exposure_shards", "graph_releases", "refusals",
    "service_reads", "read_totals", "graph_versions", "synthesis_jobs",
    "idempotency_bindings", "embedding_salts", "quota_buckets",
}  # fmt: skip


def curve_for(epsilon: float, delta: float = DELTA) -> RdpCurve:
    return plan_diffusion(epsilon, delta, 100, 0.8, 1e-7, Mode.PERSONALIZED).curve


@pytest.fixture
def raw(ledger_url: str) -> Iterator[Engine]:
    engine = make_engine(ledger_url)
    yield engine
    engine.dispose()


def stored_spend(raw: Engine, account_id: int) -> tuple[RdpCurve, int]:
    with raw.connect() as conn:
        rdp, charges = conn.execute(
            text("SELECT rdp, charges FROM spend WHERE account_id = :a"), {"a": account_id}
        ).one()
    return RdpCurve.from_json(json.loads(rdp)), int(charges)


def charge(
    ledger: Ledger,
    account: int,
    curve: RdpCurve,
    *,
    epsilon: float = 0.1,
    key: str | None = None,
    principal: int | None = None,
    request_id: str = "req",
) -> Any:
    return admit_and_charge(
        ledger,
        charged_account_id=account,
        principal_account_id=account if principal is None else principal,
        seed="n1",
        mechanism="noisy_diffusion",
        mode="personalized",
        params={"k": 10, "beta": 0.8},
        query_curve=curve,
        query_epsilon=epsilon,
        graph_version="g1",
        request_id=request_id,
        idempotency_key=key,
    )


# --- migrations -------------------------------------------------------------------------------


def test_migration_builds_the_schema_and_matches_the_models(ledger_url: str) -> None:
    upgrade(ledger_url)
    upgrade(ledger_url)  # idempotent
    engine = make_engine(ledger_url)
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
        with engine.connect() as conn:
            meta = dict(conn.execute(text("SELECT key, value FROM ledger_meta")).all())
            ledger_id = meta.pop("ledger_id")
            assert meta == {
                "grid_version": str(GRID_VERSION),
                "grid_fingerprint": grid_fingerprint(),
            }
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
            assert diff == []
            for table in TABLES - {"alembic_version", "ledger_meta", "exposure_shards"}:
                assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 0
            shards = conn.execute(text("SELECT count(*), sum(charges) FROM exposure_shards"))
            assert tuple(shards.one()) == (EXPOSURE_SHARDS, 0)
    finally:
        engine.dispose()
    ledger = Ledger.from_url(ledger_url)
    try:
        assert ledger.ping()
        assert ledger.accounts.list_accounts() == []
        assert ledger.ledger_id == ledger_id and len(ledger_id) == 32
    finally:
        ledger.dispose()


def test_unmigrated_database_is_refused_with_the_command(ledger_url: str) -> None:
    if ledger_url.startswith("sqlite"):  # an existing but empty file, besides a missing one
        with pytest.raises(LedgerNotMigrated, match="does not exist"):
            Ledger.from_url(ledger_url)
        create_engine(ledger_url).connect().close()
    with pytest.raises(LedgerNotMigrated) as info:
        Ledger.from_url(ledger_url)
    assert info.value.code == "ledger_not_migrated"
    assert UPGRADE_COMMAND == "python -m service db upgrade"
    assert f"`{UPGRADE_COMMAND}`" in info.value.message
    assert "PPR_AUTO_MIGRATE=true" in info.value.message


def test_auto_migrate(ledger_url: str) -> None:
    opened: list[Ledger] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def start() -> None:  # several workers starting at once migrate once
        barrier.wait()
        try:
            opened.append(Ledger.from_url(ledger_url, auto_migrate=True))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(opened) == 4
    for other in opened[1:]:
        other.dispose()
    ledger = opened[0]
    ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=DELTA)
    ledger.dispose()
    again = Ledger.from_url(ledger_url)  # at head now: no migration needed
    assert [a.type for a in again.accounts.list_accounts()] == ["admin"]
    again.dispose()


@pytest.mark.parametrize(
    ("key", "value"), [("grid_version", "999"), ("grid_fingerprint", "0123456789abcdef")]
)
def test_grid_mismatch_is_refused(ledger_url: str, key: str, value: str) -> None:
    upgrade(ledger_url)
    engine = make_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE ledger_meta SET value = :v WHERE key = :k"), {"v": value, "k": key}
        )
    engine.dispose()
    for auto in (False, True):
        with pytest.raises(LedgerGridMismatch, match="needs a migration") as info:
            Ledger.from_url(ledger_url, auto_migrate=auto)
        assert info.value.code == "ledger_grid_mismatch"


# --- accounts and keys ------------------------------------------------------------------------


def test_accounts(ledger: Ledger) -> None:
    user = ledger.accounts.create_account(
        "user", node_id="n1", cap_epsilon=1.0, delta=DELTA, label="u"
    )
    svc = ledger.accounts.create_account(
        "service", cap_epsilon=5.0, delta=1e-7, may_create_seed_accounts=True, label="backend"
    )
    admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=DELTA)
    assert (user.type, user.node_id, user.label) == ("user", "n1", "u")
    assert svc.may_create_seed_accounts and svc.node_id is None
    assert ledger.accounts.get_account(user.account_id) == user
    assert ledger.accounts.account_for_node("n1") == user
    assert ledger.accounts.account_for_node("n2") is None
    assert ledger.accounts.list_accounts() == [user, svc, admin]
    assert ledger.accounts.list_accounts(type="service") == [svc]
    assert ledger.accounts.list_accounts(limit=1, offset=1) == [svc]
    assert ledger.budgets.budget(svc.account_id).to_dict() == {
        "account_id": svc.account_id, "spent_epsilon": 0.0, "cap_epsilon": 5.0,
        "remaining_epsilon": 5.0, "delta": 1e-7, "charges": 0,
    }  # fmt: skip
    assert ledger.budgets.account_delta(svc.account_id) == 1e-7
    assert user.created_at.endswith("+00:00")

    with pytest.raises(AccountExists) as exists:
        ledger.accounts.create_account("user", node_id="n1", cap_epsilon=1.0, delta=DELTA)
    assert (exists.value.code, exists.value.status) == ("account_exists", 409)
    with pytest.raises(UnknownAccount):
        ledger.accounts.get_account(999)
    with pytest.raises(UnknownAccount):
        ledger.budgets.budget(999)
    bad: list[dict[str, Any]] = [
        {"type": "user", "cap_epsilon": 1.0, "delta": DELTA},
        {"type": "service", "node_id": "n3", "cap_epsilon": 1.0, "delta": DELTA},
        {"type": "root", "cap_epsilon": 1.0, "delta": DELTA},
        {"type": "admin", "cap_epsilon": 0.0, "delta": DELTA},
        {"type": "admin", "cap_epsilon": math.inf, "delta": DELTA},
        {"type": "admin", "cap_epsilon": 1.0, "delta": 1.0},
        {"type": "admin", "cap_epsilon": 1.0, "delta": 0.0},
    ]
    for kwargs in bad:
        with pytest.raises(InvalidParameter):
            ledger.accounts.create_account(**kwargs)
    assert len(ledger.accounts.list_accounts()) == 3


def test_api_keys(ledger: Ledger, raw: Engine) -> None:
    account = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA)
    key, record = ledger.api_keys.create_api_key(
        account.account_id, actor_account_id=account.account_id
    )
    assert key.startswith("ppr_") and len(key) > 40
    assert record.prefix == key[:12] and record.revoked_at is None
    assert ledger.api_keys.authenticate(key) == account
    assert ledger.api_keys.authenticate(key + "x") is None
    assert ledger.api_keys.authenticate("") is None
    with raw.connect() as conn:
        stored = conn.execute(text("SELECT key_hash FROM api_keys")).scalar_one()
    assert stored == hash_api_key(key) and key not in stored

    other, _ = ledger.api_keys.create_api_key(account.account_id)
    revoked = ledger.api_keys.revoke_api_key(record.key_id)
    assert revoked.revoked_at is not None
    assert ledger.api_keys.authenticate(key) is None
    assert ledger.api_keys.authenticate(other) == account
    assert ledger.api_keys.revoke_api_key(record.key_id) == revoked  # idempotent
    assert [k.revoked_at is None for k in ledger.api_keys.list_api_keys(account.account_id)] == [
        False,
        True,
    ]
    with pytest.raises(UnknownApiKey):
        ledger.api_keys.revoke_api_key(999)
    with pytest.raises(UnknownAccount):
        ledger.api_keys.create_api_key(999)
    revokes = [a for a in ledger.reports.list_audit() if a["action"] == "api_key.revoke"]
    assert len(revokes) == 1 and revokes[0]["details"]["key_id"] == record.key_id


# --- admission --------------------------------------------------------------------------------


def test_admit_until_cap_then_refuse_with_nothing_written(ledger: Ledger, raw: Engine) -> None:
    account = ledger.accounts.create_account(
        "user", node_id="n1", cap_epsilon=1.0, delta=DELTA
    ).account_id
    curve = curve_for(0.1)
    for i in range(10):
        receipt = charge(ledger, account, curve, request_id=f"r{i}")
        assert not receipt.reused and receipt.budget.charges == i + 1
    ten = compose([curve] * 10)
    assert stored_spend(raw, account) == (ten, 10)  # bit for bit
    spent = ledger.budgets.budget(account).spent_epsilon
    assert spent == ten.epsilon(DELTA)
    assert 0.70 < spent < 0.72  # RDP composition: ~0.71, not 10 x 0.1

    # independently: how many identical queries fit under the cap
    fit = 0
    while compose([curve] * (fit + 1)).epsilon(DELTA) <= 1.0:
        fit += 1
    assert fit > 10
    for i in range(10, fit):
        charge(ledger, account, curve, request_id=f"r{i}")
    before = ledger.budgets.budget(account)
    assert before.charges == fit and before.spent_epsilon <= 1.0
    with pytest.raises(BudgetExhausted) as refused:
        charge(ledger, account, curve, key="refused")
    assert refused.value.code == "budget_exhausted" and refused.value.status == 403
    assert refused.value.budget == before
    assert refused.value.details["query_epsilon"] == 0.1
    assert ledger.budgets.budget(account) == before
    assert count_charges(ledger, account) == fit
    assert stored_spend(raw, account) == (compose([curve] * fit), fit)
    # a cheaper query may still fit
    small = curve_for(0.01)
    if (compose([curve] * fit) + small).epsilon(DELTA) <= 1.0:
        assert not charge(ledger, account, small, epsilon=0.01).reused


def test_spend_survives_reopening(ledger_url: str) -> None:
    upgrade(ledger_url)
    first = Ledger.from_url(ledger_url)
    account = first.accounts.create_account("admin", cap_epsilon=2.0, delta=DELTA).account_id
    curves = [curve_for(e) for e in (0.1, 0.2, 0.05)]
    for curve in curves:
        charge(first, account, curve)
    view = first.budgets.budget(account)
    first.dispose()
    second = Ledger.from_url(ledger_url)
    assert second.budgets.budget(account) == view
    assert view.spent_epsilon == compose(curves).epsilon(DELTA)
    second.dispose()


def test_set_budget_reconverts_and_can_go_below_spend(ledger: Ledger) -> None:
    account = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=DELTA).account_id
    curve = curve_for(0.1)
    for _ in range(3):
        charge(ledger, account, curve)
    view = ledger.budgets.set_budget(account, delta=1e-9, actor_account_id=None)
    assert view.delta == 1e-9 and view.spent_epsilon == compose([curve] * 3).epsilon(1e-9)
    assert view.spent_epsilon > compose([curve] * 3).epsilon(DELTA)
    view = ledger.budgets.set_budget(account, cap_epsilon=0.1)
    assert view.cap_epsilon == 0.1 and view.remaining_epsilon == 0.0
    with pytest.raises(BudgetExhausted):
        charge(ledger, account, curve_for(0.01))
    assert ledger.budgets.set_budget(account) == view  # no change, no audit row
    with pytest.raises(InvalidParameter):
        ledger.budgets.set_budget(account, cap_epsilon=-1.0)
    with pytest.raises(UnknownAccount):
        ledger.budgets.set_budget(999, cap_epsilon=1.0)
    changes = [a["details"] for a in ledger.reports.list_audit() if a["action"] == "budget.set"]
    assert changes == [
        {"cap_epsilon": {"old": 1.0, "new": 0.1}},
        {"delta": {"old": DELTA, "new": 1e-9}},
    ]


def test_refunds_compensate_exactly_and_are_idempotent(ledger: Ledger, raw: Engine) -> None:
    account = ledger.accounts.create_account("admin", cap_epsilon=5.0, delta=DELTA).account_id
    a, b, c = (curve_for(e) for e in (0.1, 0.3, 0.05))
    ids = [charge(ledger, account, curve).charge_id for curve in (a, b, c)]
    view = ledger.settlement.refund(ids[1], reason="noise never drawn")
    assert stored_spend(raw, account) == (RdpCurve.zero() + a + c, 2)
    assert view == ledger.budgets.budget(account)
    assert view.spent_epsilon == (a + c).epsilon(DELTA) and view.charges == 2
    assert ledger.settlement.refund(ids[1], reason="again") == view
    with raw.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM refunds")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM charges")).scalar() == 3
    assert [r.refunded for r in ledger.reports.list_charges(account)] == [False, True, False]
    # a new charge continues from the compensated spend
    charge(ledger, account, b)
    assert stored_spend(raw, account) == (RdpCurve.zero() + a + c + b, 3)
    for charge_id in (ids[0], ids[2]):
        ledger.settlement.refund(charge_id, reason="r")
    assert stored_spend(raw, account) == (RdpCurve.zero() + b, 1)
    with pytest.raises(UnknownCharge):
        ledger.settlement.refund(999, reason="r")
    refunds = [a for a in ledger.reports.list_audit() if a["action"] == "charge.refund"]
    assert len(refunds) == 3


def test_idempotency_keys(ledger: Ledger) -> None:
    svc = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    user = ledger.accounts.create_account(
        "user", node_id="n1", cap_epsilon=0.5, delta=DELTA
    ).account_id
    curve = curve_for(0.1)
    first = charge(ledger, user, curve, key="k1", principal=svc)
    again = charge(ledger, user, curve, key="k1", principal=svc)
    assert again.reused and again.charge_id == first.charge_id and again.budget == first.budget
    assert count_charges(ledger, user) == 1
    # another principal's key is another request
    own = charge(ledger, user, curve, key="k1", principal=user)
    assert not own.reused and count_charges(ledger, user) == 2
    # a reused key returns the charge even when the budget could not take another one
    ledger.budgets.set_budget(user, cap_epsilon=0.01)
    assert charge(ledger, user, curve, key="k1", principal=svc).reused
    # a refunded charge frees its key: the retry is a new charge (if the budget takes it)
    ledger.settlement.refund(first.charge_id, reason="failed before noise")
    ledger.budgets.set_budget(user, cap_epsilon=0.5)
    retry = charge(ledger, user, curve, key="k1", principal=svc)
    assert not retry.reused and retry.charge_id != first.charge_id
    assert count_charges(ledger, user) == 3
    charges = ledger.reports.list_charges(user)
    assert [(c.idempotency_key, c.principal_account_id, c.state) for c in charges] == [
        ("k1", svc, "admitted"),
        ("k1", user, "admitted"),
        ("k1", svc, "refunded"),
    ]
    assert charges[0].params == {"k": 10, "beta": 0.8} and charges[0].epsilon == 0.1


def test_concurrent_twins_charge_once(ledger: Ledger) -> None:
    svc = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    users = [
        ledger.accounts.create_account(
            "user", node_id=f"n{i}", cap_epsilon=5.0, delta=DELTA
        ).account_id
        for i in range(3)
    ]
    curve = curve_for(0.1)
    barrier = threading.Barrier(6)
    receipts: list[Any] = []
    errors: list[BaseException] = []

    def twin(i: int) -> None:
        barrier.wait()
        try:  # same principal and key, even for different charged accounts
            receipts.append(charge(ledger, users[i % 3], curve, key="twin", principal=svc))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=twin, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({r.charge_id for r in receipts}) == 1
    assert sorted(r.reused for r in receipts) == [False] + [True] * 5
    assert count_charges(ledger) == 1


# --- seed accounts ----------------------------------------------------------------------------


def test_user_account_for_node(ledger: Ledger) -> None:
    with pytest.raises(UnknownAccount, match="no account for node 'n9'"):
        ledger.accounts.user_account_for_node("n9", create=False, cap_epsilon=1.0, delta=DELTA)
    created = ledger.accounts.user_account_for_node("n9", create=True, cap_epsilon=0.7, delta=DELTA)
    assert (
        ledger.accounts.user_account_for_node("n9", create=False, cap_epsilon=1.0, delta=DELTA)
        == created
    )
    assert ledger.budgets.budget(created).cap_epsilon == 0.7
    assert ledger.accounts.get_account(created).node_id == "n9"


def test_user_account_for_node_race(ledger: Ledger) -> None:
    barrier = threading.Barrier(8)
    found: list[int] = []
    errors: list[BaseException] = []

    def create() -> None:
        barrier.wait()
        try:
            found.append(
                ledger.accounts.user_account_for_node(
                    "seed", create=True, cap_epsilon=1.0, delta=DELTA
                )
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(found) == 8 and len(set(found)) == 1
    assert [a.account_id for a in ledger.accounts.list_accounts(type="user")] == found[:1]


# --- releases ---------------------------------------------------------------------------------


def test_releases(ledger: Ledger) -> None:
    svc = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    user = ledger.accounts.create_account(
        "user", node_id="n1", cap_epsilon=5.0, delta=DELTA
    ).account_id
    curve = curve_for(0.1)
    key = ReleaseKey(
        account_id=user, node="n1", graph_version="g1", mode="personalized", epsilon=0.1
    )
    assert ledger.stored_releases.find_release(key) is None

    def release(charge_id: int, scores: list[float]) -> StoredRelease:
        results = [RankedNode(f"v{i}", s) for i, s in enumerate(scores)]
        return StoredRelease(
            key, charge_id, results, {"name": "noisy_diffusion"}, f"req{charge_id}"
        )

    first = release(
        charge(ledger, user, curve, key="a", principal=svc).charge_id, [0.1 / 3, 1e-300]
    )
    ledger.settlement.store_release(first, idempotency_key="a", principal_account_id=svc)
    ledger.settlement.store_release(first, idempotency_key="a", principal_account_id=svc)  # no-op
    found = ledger.stored_releases.find_release(key)
    assert found == first  # floats round-trip exactly
    assert found is not None and found.released_at is not None  # the row's time, in UTC
    assert abs((datetime.now(UTC) - found.released_at).total_seconds()) < 60
    second = release(charge(ledger, user, curve).charge_id, [0.5])
    ledger.settlement.store_release(second, idempotency_key=None, principal_account_id=user)
    assert ledger.stored_releases.find_release(key) == second  # the newest
    assert ledger.stored_releases.release_for_idempotency_key(svc, "a") == first
    assert ledger.stored_releases.release_for_idempotency_key(user, "a") is None
    # epsilon is compared exactly; other fields are part of the key
    assert (
        ledger.stored_releases.find_release(
            ReleaseKey(user, "n1", "g1", "personalized", 0.10000000000000002)
        )
        is None
    )
    assert (
        ledger.stored_releases.find_release(ReleaseKey(user, "n1", "g2", "personalized", 0.1))
        is None
    )
    assert ledger.stored_releases.find_release(ReleaseKey(user, "n1", "g1", "edge", 0.1)) is None
    assert (
        ledger.stored_releases.find_release(ReleaseKey(svc, "n1", "g1", "personalized", 0.1))
        is None
    )
    # a released charge can never be refunded (its answer may have left the process) ...
    with pytest.raises(ChargeSettled):
        ledger.settlement.refund(second.charge_id, reason="test")
    assert ledger.stored_releases.find_release(key) == second
    # ... and a refunded (e.g. reconciled) charge's answer can never be stored, so never sent
    third = charge(ledger, user, curve, key="c", principal=svc).charge_id
    ledger.settlement.refund(third, reason="reconciled")
    with pytest.raises(ChargeSettled):
        ledger.settlement.store_release(
            release(third, [0.9]), idempotency_key="c", principal_account_id=svc
        )
    assert ledger.stored_releases.find_release(key) == second
    assert ledger.stored_releases.release_for_idempotency_key(svc, "c") is None
    assert [c.state for c in ledger.reports.list_charges(user)] == [
        "refunded",
        "released",
        "released",
    ]


# --- audit and health -------------------------------------------------------------------------


def test_audit_rows(ledger: Ledger) -> None:
    admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=DELTA).account_id
    user = ledger.accounts.create_account(
        "user", node_id="n1", cap_epsilon=1.0, delta=DELTA, actor_account_id=admin
    ).account_id
    _, key = ledger.api_keys.create_api_key(user, actor_account_id=admin)
    ledger.api_keys.revoke_api_key(key.key_id, actor_account_id=admin)
    ledger.budgets.set_budget(user, cap_epsilon=2.0, actor_account_id=admin)
    rows = ledger.reports.list_audit()
    assert [(r["action"], r["actor_account_id"], r["target_account_id"]) for r in rows] == [
        ("budget.set", admin, user),
        ("api_key.revoke", admin, user),
        ("api_key.create", admin, user),
        ("account.create", admin, user),
        ("account.create", None, admin),
    ]
    assert rows[3]["details"]["node_id"] == "n1"
    assert ledger.reports.list_audit(limit=2) == rows[:2]
    ledger.reports.record_audit(admin, "graph_reload", details={"version": "g2"})
    ledger.reports.record_audit(None, "note")
    latest = ledger.reports.list_audit(limit=2)
    assert [(r["action"], r["actor_account_id"], r["details"]) for r in latest] == [
        ("note", None, {}),
        ("graph_reload", admin, {"version": "g2"}),
    ]


def test_ping() -> None:
    unreachable = Ledger(make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none"))
    assert not unreachable.ping()
    unreachable.dispose()
