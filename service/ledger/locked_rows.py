"""The rows an admission reads under lock and writes back, through SQLAlchemy Core.

An admission (of one query, or of a group) reads the charged account's spend and budget and
an exposure shard under ``FOR UPDATE`` locks, decides, then writes the spend, the shard and
the new charges before it commits. Through the ORM, the identity map and the unit of work
cost several times what the statements do (about 2,500 Python calls for one admission);
here each read and write is one prebuilt Core statement and the rows are plain records.

Every write happens inside the admission's own transaction, under the locks it read with:
the atomicity of admit-and-charge is the transaction's, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Table, bindparam, func, insert, select, text, update
from sqlalchemy.orm import Session

from service.ledger.array_writes import insert_rows, update_rows
from service.ledger.id_lists import is_postgresql, one_of_bound
from service.ledger.json_text import EncodedJson, encode_json
from service.ledger.periods import day_start
from service.ledger.quota_buckets import ChargeFigures, add_to_buckets
from service.ledger.tables import Budget, Charge, ExposureShard, IdempotencyBinding, Release, Spend

CHARGES = cast(Table, Charge.__table__)
RELEASES = cast(Table, Release.__table__)
SPEND = cast(Table, Spend.__table__)
BUDGETS = cast(Table, Budget.__table__)
SHARDS = cast(Table, ExposureShard.__table__)
BINDINGS = cast(Table, IdempotencyBinding.__table__)

_BUDGET_COLUMNS = (
    BUDGETS.c.cap_epsilon,
    BUDGETS.c.delta,
    BUDGETS.c.period,
    BUDGETS.c.period_cap_epsilon,
)
_LOCK_ACCOUNT = (
    select(SPEND, *_BUDGET_COLUMNS)
    .join_from(SPEND, BUDGETS, BUDGETS.c.account_id == SPEND.c.account_id)
    .where(SPEND.c.account_id == bindparam("account_id"))
    .with_for_update(of=SPEND)
)
_LOCK_SPEND_ONLY = (
    select(SPEND.c.account_id)
    .where(SPEND.c.account_id == bindparam("account_id"))
    .with_for_update()
)
_LOCK_SHARD = select(SHARDS).where(SHARDS.c.shard == bindparam("shard")).with_for_update()
_LOCK_ALL_SHARDS = select(SHARDS).order_by(SHARDS.c.shard).with_for_update()
_OTHER_SHARDS = select(SHARDS).where(SHARDS.c.shard != bindparam("shard"))
_WRITE_SHARD = (
    update(SHARDS)
    .where(SHARDS.c.shard == bindparam("w_shard"))
    .values(
        rdp=bindparam("w_rdp", type_=SHARDS.c.rdp.type),
        pure_epsilon=bindparam("w_pure_epsilon"),
        charges=bindparam("w_charges"),
        updated_at=bindparam("w_updated_at", type_=SHARDS.c.updated_at.type),
    )
)
_INSERT_CHARGES = insert(CHARGES).returning(CHARGES.c.id, sort_by_parameter_order=True)
#: PostgreSQL: ids for new charges from the table's own sequence, in one short statement; the
#: charges are then inserted with them by one statement of one array per column
#: (service/ledger/array_writes.py). A multi-row ``INSERT ... RETURNING`` has too many
#: parameters for psycopg's cache of parsed statements, and parsing it again took half of a
#: 200-charge admission.
_RESERVE_CHARGE_IDS = text(
    "SELECT nextval(pg_get_serial_sequence('charges', 'id')) FROM generate_series(1, :n)"
)
_INSERT_BINDINGS = insert(BINDINGS)
_SETTLE = (
    update(CHARGES)
    .where(CHARGES.c.id == bindparam("charge_id"), CHARGES.c.state == "admitted")
    .values(
        state=bindparam("new_state"), settled_at=bindparam("now", type_=CHARGES.c.settled_at.type)
    )
)


#: PostgreSQL: a release stored and its charge marked ``released`` in ONE statement (a
#: data-modifying CTE): the charge moves from ``admitted`` as :data:`_SETTLE` moves it, and the
#: release row is inserted only if it moved. One statement is atomic, so committed on its own
#: it is the two-statement transaction it replaces, in one round trip instead of four (BEGIN,
#: UPDATE, INSERT, COMMIT). Parameters: ``s_charge_id``, ``s_now`` and ``r_<column>`` for every
#: other column of ``releases``; it returns the charge's id if stored, no row otherwise.
RELEASE_COLUMNS = tuple(c.name for c in RELEASES.c if c.name != "charge_id")
_SETTLED = (
    update(CHARGES)
    .where(CHARGES.c.id == bindparam("s_charge_id"), CHARGES.c.state == "admitted")
    .values(state="released", settled_at=bindparam("s_now", type_=CHARGES.c.settled_at.type))
    .returning(CHARGES.c.id)
    .cte("settled")
)
STORE_RELEASE_SETTLED = (
    insert(RELEASES)
    .from_select(
        ["charge_id", *RELEASE_COLUMNS],
        select(
            _SETTLED.c.id,
            *(bindparam(f"r_{name}", type_=RELEASES.c[name].type) for name in RELEASE_COLUMNS),
        ),
    )
    .returning(RELEASES.c.charge_id)
)

#: A charge's last sign of life: its heartbeat, or its admission if it never beat.
charge_last_sign = func.coalesce(CHARGES.c.heartbeat_at, CHARGES.c.created_at)
_SETTLE_STALE = _SETTLE.where(
    charge_last_sign < bindparam("stale_before", type_=CHARGES.c.created_at.type)
)


def settle(
    session: Session,
    charge_id: int,
    state: str,
    now: datetime,
    *,
    stale_before: datetime | None = None,
) -> int:
    """Move a charge from ``admitted`` to ``state``; 1 if it moved, 0 if it was settled
    already. The conditional UPDATE is what makes a release and a refund of one charge
    exclusive. With ``stale_before`` (a refund by a reconciler), it moves only if its last
    sign of life (heartbeat, else admission) is older than that, in the same statement: a
    heartbeat committed first keeps it admitted."""
    values = {"charge_id": charge_id, "new_state": state, "now": now}
    if stale_before is None:
        result = session.execute(_SETTLE, values)
    else:
        result = session.execute(_SETTLE_STALE, {**values, "stale_before": stale_before})
    return int(cast(CursorResult[Any], result).rowcount)


class LockedAccount:
    """An account's spend row (locked) and its budget, as one record: it stands for both the
    ``Spend`` and the ``Budget`` row where the admission helpers read them."""

    __slots__ = (
        "account_id", "cap_epsilon", "charges", "delta", "epsilon", "grid_version",
        "last_charge_at", "period", "period_cap_epsilon", "period_spent", "pure_epsilon", "rdp",
        "updated_at",
    )  # fmt: skip

    def __init__(self, row: Any) -> None:
        self.account_id: int = row.account_id
        self.rdp: dict[str, Any] = row.rdp
        self.pure_epsilon: float = row.pure_epsilon
        self.grid_version: int = row.grid_version
        self.charges: int = row.charges
        self.epsilon: float = row.epsilon
        self.last_charge_at: datetime | None = row.last_charge_at
        self.updated_at: datetime = row.updated_at
        self.cap_epsilon: float = row.cap_epsilon
        self.delta: float = row.delta
        #: The account's budget period and its cap (None: no period, as by default).
        self.period: str | None = row.period
        self.period_cap_epsilon: float | None = row.period_cap_epsilon
        #: With a period: (window start, composed live charges of that window so far, this
        #: transaction's included), read once per transaction (service/ledger/period_spend.py).
        self.period_spent: tuple[datetime, Any] | None = None


class LockedShard:
    """An exposure shard row (locked, or read for the graph-wide total)."""

    __slots__ = ("charges", "pure_epsilon", "rdp", "shard", "updated_at")

    def __init__(self, row: Any) -> None:
        self.shard: int = row.shard
        self.rdp: dict[str, Any] = row.rdp
        self.pure_epsilon: float = row.pure_epsilon
        self.charges: int = row.charges
        self.updated_at: datetime = row.updated_at


def lock_account(session: Session, account_id: int) -> LockedAccount | None:
    """The account's spend and budget, its spend row locked until the transaction ends."""
    row = session.execute(_LOCK_ACCOUNT, {"account_id": account_id}).one_or_none()
    return None if row is None else LockedAccount(row)


_LOCK_ACCOUNTS_QUERY = select(SPEND, *_BUDGET_COLUMNS).join_from(
    SPEND, BUDGETS, BUDGETS.c.account_id == SPEND.c.account_id
)
#: The accounts of a list (service/ledger/id_lists.py: one array on PostgreSQL, IN elsewhere).
_LOCK_ACCOUNTS = {
    postgresql: _LOCK_ACCOUNTS_QUERY.where(listed)
    .order_by(SPEND.c.account_id)
    .with_for_update(of=SPEND)
    for postgresql, listed in one_of_bound(SPEND.c.account_id, "account_ids").items()
}


def lock_accounts(session: Session, account_ids: list[int]) -> dict[int, LockedAccount]:
    """As :func:`lock_account` for many accounts, a few hundred per statement, every spend
    row locked in ascending account id (the order every admission locks in, so groups and
    single admissions never deadlock); an unknown account is missing from the answer."""
    ordered = sorted(set(account_ids))
    locked: dict[int, LockedAccount] = {}
    statement = _LOCK_ACCOUNTS[is_postgresql(session)]
    for start in range(0, len(ordered), 500):
        rows = session.execute(statement, {"account_ids": ordered[start : start + 500]})
        for row in rows:
            locked[int(row.account_id)] = LockedAccount(row)
    return locked


def lock_spend_row(session: Session, account_id: int) -> bool:
    """Lock the account's spend row only (a principal whose quota is checked)."""
    return session.execute(_LOCK_SPEND_ONLY, {"account_id": account_id}).first() is not None


def lock_shard(session: Session, shard: int) -> LockedShard | None:
    row = session.execute(_LOCK_SHARD, {"shard": shard}).one_or_none()
    return None if row is None else LockedShard(row)


def lock_all_shards(session: Session) -> list[LockedShard]:
    """Every shard, locked in ascending order."""
    return [LockedShard(row) for row in session.execute(_LOCK_ALL_SHARDS)]


def other_shards(session: Session, shard: int) -> list[LockedShard]:
    """The shards other than ``shard``, read without locks (for the cap's fast path)."""
    return [LockedShard(row) for row in session.execute(_OTHER_SHARDS, {"shard": shard})]


class NewCharge:
    """A charge admitted in the current transaction: its column values, and its id once
    :meth:`AdmissionWrites.write_charges` has inserted it."""

    __slots__ = ("degree_epsilon", "id", "values")

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.id: int = 0
        #: The degree release charged with this charge (its epsilon), 0 if none.
        self.degree_epsilon: float = 0.0


class AdmissionWrites:
    """What one admission transaction changes: the accounts' spend, the shards, the new
    charges and the Idempotency-Keys they bind. Charges (then the keys bound to them) are
    inserted with one multi-row ``INSERT`` each when the transaction must see them (before a
    read of the charges, and at the end); spend and shards are written once each at the end.
    The JSON of a curve or parameter set shared by many charges of a group is encoded once."""

    def __init__(self) -> None:
        self._charges: list[NewCharge] = []
        self._bindings: list[
            tuple[int, str, NewCharge | int, str, datetime, tuple[str, str] | None]
        ] = []
        self._accounts: dict[int, LockedAccount] = {}
        self._shards: dict[int, LockedShard] = {}
        self._encoded: dict[int, tuple[object, EncodedJson]] = {}
        #: The charges written so far, for their principals' quota buckets (added at the end,
        #: after every other lock this transaction takes, in one order).
        self._to_buckets: list[ChargeFigures] = []
        #: (account, graph version, epsilon) of the degree releases this transaction charged.
        self.degree_paid: set[tuple[int, str, float]] = set()
        #: The database's clock, read once when the transaction admits to an account with a
        #: budget period (service/ledger/period_spend.py); None until then.
        self.period_now: datetime | None = None

    def json(self, owner: object, value: Callable[[], Any]) -> EncodedJson:
        """The encoded JSON of ``value()``, computed once per ``owner`` object (kept alive
        here, so its id is not reused while the transaction runs)."""
        hit = self._encoded.get(id(owner))
        if hit is None or hit[0] is not owner:
            hit = (owner, EncodedJson(encode_json(value())))
            self._encoded[id(owner)] = hit
        return hit[1]

    def add_charge(self, **values: Any) -> NewCharge:
        """A charge of this transaction; its ``period_start`` is the UTC day of ``created_at``."""
        values["period_start"] = day_start(values["created_at"])
        charge = NewCharge(values)
        self._charges.append(charge)
        return charge

    def bind(
        self, principal: int, idempotency_key: str, charge: NewCharge | int, kind: str,
        now: datetime, popular: tuple[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Bind ``idempotency_key`` of ``principal`` to ``charge`` (one of this transaction's
        new charges, or an earlier charge's id); ``popular``: the (node, mode) of a popular
        query. Written with the charges; a key bound concurrently by another transaction
        makes the commit fail (IntegrityError)."""
        self._bindings.append((principal, idempotency_key, charge, kind, now, popular))

    def changed_account(self, account: LockedAccount) -> None:
        self._accounts[account.account_id] = account

    def account(self, account_id: int) -> LockedAccount | None:
        """The account's record if this transaction changed it (not yet written)."""
        return self._accounts.get(account_id)

    def changed_shard(self, shard: LockedShard) -> None:
        self._shards[shard.shard] = shard

    def write_charges(self, session: Session) -> None:
        """Insert the pending charges, then the pending key bindings."""
        if self._charges:
            pending, self._charges = self._charges, []
            rows = [charge.values for charge in pending]
            if len(rows) > 1 and is_postgresql(session):
                ids = sorted(session.scalars(_RESERVE_CHARGE_IDS, {"n": len(rows)}))
                insert_rows(
                    session,
                    CHARGES,
                    [{**row, "id": charge_id} for row, charge_id in zip(rows, ids, strict=True)],
                )
            else:
                ids = list(session.scalars(_INSERT_CHARGES, rows))
            for charge, charge_id in zip(pending, ids, strict=True):
                charge.id = int(charge_id)
            self._to_buckets.extend(
                (r["principal_account_id"], r["charged_account_id"], r["created_at"],
                 r["epsilon"])
                for r in rows
            )  # fmt: skip
        if self._bindings:
            bindings, self._bindings = self._bindings, []
            rows = []
            for principal, key, target, kind, now, popular in bindings:
                charge_id = target if isinstance(target, int) else target.id
                assert charge_id, "a new charge is written before the key bound to it"
                seed, mode = popular if popular is not None else (None, None)
                rows.append(
                    {
                        "principal_account_id": principal, "idempotency_key": key,
                        "charge_id": charge_id, "kind": kind, "created_at": now,
                        "seed": seed, "mode": mode,
                    }
                )  # fmt: skip
            session.execute(_INSERT_BINDINGS, rows)

    def quota_pending(self, principal: int) -> float:
        """The epsilon this transaction has charged to others for ``principal`` that its
        quota buckets do not hold yet (they are written by :meth:`finish`)."""
        written = [(p, charged, epsilon) for p, charged, _, epsilon in self._to_buckets]
        unwritten = [
            (c.values["principal_account_id"], c.values["charged_account_id"], c.values["epsilon"])
            for c in self._charges
        ]
        return sum(
            float(epsilon)
            for p, charged, epsilon in written + unwritten
            if p == principal and charged != principal
        )

    def finish(self, session: Session) -> None:
        """Write everything still pending (before the transaction commits)."""
        self.write_charges(session)
        if self._accounts:  # one statement on PostgreSQL, whatever the number of accounts
            update_rows(
                session,
                SPEND,
                "account_id",
                [
                    {
                        "account_id": a.account_id, "rdp": a.rdp, "pure_epsilon": a.pure_epsilon,
                        "grid_version": a.grid_version, "charges": a.charges,
                        "epsilon": a.epsilon, "last_charge_at": a.last_charge_at,
                        "updated_at": a.updated_at,
                    }
                    for a in self._accounts.values()
                ],
            )  # fmt: skip
            self._accounts.clear()
        if self._shards:
            session.execute(
                _WRITE_SHARD,
                [
                    {
                        "w_shard": s.shard, "w_rdp": s.rdp, "w_pure_epsilon": s.pure_epsilon,
                        "w_charges": s.charges, "w_updated_at": s.updated_at,
                    }
                    for s in self._shards.values()
                ],
            )  # fmt: skip
            self._shards.clear()
        if self._to_buckets:  # last: the bucket rows are the last locks a transaction takes
            add_to_buckets(session, self._to_buckets)
            self._to_buckets = []
