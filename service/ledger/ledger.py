"""The durable budget ledger: accounts, API keys, budgets and the atomic admit-and-charge.

Every account's spend is the RDP curve composed from its unrefunded charges, stored on the
``spend`` row. Admission locks that row (``SELECT ... FOR UPDATE`` on PostgreSQL, a
``BEGIN IMMEDIATE`` write transaction on SQLite), composes the spent curve with the query's,
converts at the account's delta and either refuses with nothing written or inserts the charge
and the new spend in the same transaction. The charge is therefore committed before any noise
is drawn. Nothing is ever deleted: refunds are compensating rows.

The stored spend is always the left fold, in charge-id order, of the unrefunded charges'
curves (charges are inserted under the lock, so ids follow the lock order); a refund recomputes
that fold, so it is bit-for-bit what incremental charging would have produced without the
refunded charge.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

from alembic.util import CommandError
from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from service.errors import InvalidParameter, ServiceError
from service.ledger.database import (
    LedgerGridMismatch,
    check_migrated,
    is_sqlite,
    make_engine,
    upgrade_engine,
    write_engine,
)
from service.ledger.keys import generate_api_key, hash_api_key, key_prefix
from service.ledger.records import (
    ACCOUNT_TYPES,
    AccountRecord,
    AccountType,
    ApiKeyRecord,
    BudgetExhausted,
    BudgetView,
    ChargeReceipt,
    ChargeRecord,
    IdempotencyKeyFailed,
    LedgerNotMigrated,
    ReleaseKey,
    StoredRelease,
    UnknownAccount,
)
from service.ledger.tables import (
    META_LEDGER_ID,
    Account,
    ApiKey,
    AuditLog,
    Budget,
    Charge,
    LedgerMeta,
    Refund,
    Release,
    Spend,
    iso,
    utcnow,
)
from service.mechanisms.postprocess import RankedNode
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION

#: Admission refuses when the composed epsilon exceeds ``cap * (1 - ADMISSION_RTOL)``: the
#: tolerance only ever makes admission stricter, so a spend that a different summation order
#: would evaluate an ulp higher still never exceeds the cap.
ADMISSION_RTOL = 1e-12

IDEMPOTENCY_REFUNDED_MESSAGE = (
    "the earlier request with this Idempotency-Key failed before any noise was drawn and was "
    "refunded; retry with a new key"
)


class AccountExists(ServiceError):
    code = "account_exists"
    status = 409


class UnknownApiKey(ServiceError):
    code = "unknown_api_key"
    status = 404


class UnknownCharge(ServiceError):
    code = "unknown_charge"
    status = 404


class LedgerUnavailable(ServiceError):
    code = "ledger_unavailable"
    status = 503


# --- validation and conversion ----------------------------------------------------------------


@contextmanager
def _transaction(engine: Engine) -> Iterator[Session]:
    """One transaction on ``engine``; a database that cannot be reached (or stays locked) is
    ``ledger_unavailable`` (503). A transaction that fails this way did not commit: nothing
    was charged by it.
    """
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            yield session
    except (OperationalError, InterfaceError) as exc:
        raise LedgerUnavailable(
            "the budget ledger database cannot be reached; no answer was released. Retry later",
            details={"error": type(exc.orig).__name__ if exc.orig is not None else "unknown"},
        ) from exc


def _check_cap(cap_epsilon: float) -> float:
    if isinstance(cap_epsilon, bool) or not isinstance(cap_epsilon, int | float):
        raise InvalidParameter("cap_epsilon", f"must be a number, got {cap_epsilon!r}")
    if not (math.isfinite(cap_epsilon) and cap_epsilon > 0):
        raise InvalidParameter("cap_epsilon", f"must be a finite number > 0, got {cap_epsilon}")
    return float(cap_epsilon)


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise InvalidParameter("delta", f"must be a number, got {delta!r}")
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    return float(delta)


def _account_record(row: Account) -> AccountRecord:
    return AccountRecord(
        account_id=row.id,
        type=cast(AccountType, row.type),
        node_id=row.node_id,
        label=row.label,
        allow_create_seed_accounts=bool(row.allow_create_seed_accounts),
        created_at=iso(row.created_at) or "",
    )


def _key_record(row: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=row.id,
        account_id=row.account_id,
        prefix=row.prefix,
        created_at=iso(row.created_at) or "",
        revoked_at=iso(row.revoked_at),
    )


def _charge_record(row: Charge, refunded: bool) -> ChargeRecord:
    return ChargeRecord(
        charge_id=row.id,
        created_at=iso(row.created_at) or "",
        charged_account_id=row.charged_account_id,
        principal_account_id=row.principal_account_id,
        seed=row.seed,
        mechanism=row.mechanism,
        mode=row.mode,
        epsilon=row.epsilon,
        graph_version=row.graph_version,
        request_id=row.request_id,
        idempotency_key=row.idempotency_key,
        refunded=refunded,
        params=dict(row.params),
    )


def _release_record(row: Release) -> StoredRelease:
    return StoredRelease(
        key=ReleaseKey(
            account_id=row.charged_account_id,
            node=row.node,
            graph_version=row.graph_version,
            mode=row.mode,
            epsilon=row.epsilon,
        ),
        charge_id=row.charge_id,
        results=[RankedNode(str(node), float(score)) for node, score in row.results],
        mechanism=dict(row.mechanism),
        request_id=row.request_id,
    )


def _spent_curve(spend: Spend) -> RdpCurve:
    return RdpCurve.from_json(spend.rdp)


def _view(budget: Budget, spend: Spend, spent: RdpCurve | None = None) -> BudgetView:
    curve = _spent_curve(spend) if spent is None else spent
    spent_epsilon = curve.epsilon(budget.delta)
    return BudgetView(
        account_id=budget.account_id,
        spent_epsilon=spent_epsilon,
        cap_epsilon=budget.cap_epsilon,
        remaining_epsilon=max(0.0, budget.cap_epsilon - spent_epsilon),
        delta=budget.delta,
        charges=spend.charges,
    )


def _not_refunded() -> Any:
    return ~select(Refund.id).where(Refund.charge_id == Charge.id).exists()


class Ledger:
    """The ledger on one database. Thread-safe: every call uses its own session and pool slot."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._write_engine = write_engine(engine)
        self._sqlite = is_sqlite(engine)
        self._ledger_id: str | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, *, auto_migrate: bool = False) -> Ledger:
        """Open the ledger at ``url``; refuse a database that is not at the migrations' head.

        With ``auto_migrate`` an out-of-date database is migrated first. A database whose
        curves are on another order grid is always refused (that needs a migration).
        """
        engine = make_engine(url)
        try:
            try:
                check_migrated(engine)
            except LedgerGridMismatch:
                raise
            except LedgerNotMigrated:
                if not auto_migrate:
                    raise
                try:
                    upgrade_engine(engine)
                except CommandError as exc:
                    raise LedgerNotMigrated(f"cannot migrate the ledger database: {exc}") from exc
                check_migrated(engine)
        except OperationalError as exc:
            engine.dispose()
            where = engine.url.render_as_string(hide_password=True)
            raise LedgerUnavailable(
                f"cannot reach the ledger database {where}: {str(exc.orig).strip()}"
            ) from exc
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def ledger_id(self) -> str:
        """A random id written when this ledger database was created (stable for its life).

        Caches shared beyond one database (Redis) should namespace their keys with it, so a
        new or restored ledger never sees another ledger's releases.
        """
        if self._ledger_id is None:
            with self._reading() as session:
                value = session.get(LedgerMeta, META_LEDGER_ID)
                if value is None:  # pragma: no cover - written by migration 0001
                    raise LedgerNotMigrated("ledger_meta has no ledger_id: run the migrations")
                self._ledger_id = value.value
        return self._ledger_id

    def ping(self) -> bool:
        try:
            with self._engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    def dispose(self) -> None:
        self._engine.dispose()

    def _reading(self) -> AbstractContextManager[Session]:
        return _transaction(self._engine)

    def _writing(self) -> AbstractContextManager[Session]:
        """A write transaction: BEGIN IMMEDIATE on SQLite (takes the write lock up front)."""
        return _transaction(self._write_engine)

    # --- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _audit(
        session: Session,
        action: str,
        *,
        actor: int | None,
        target: int | None,
        details: dict[str, Any],
    ) -> None:
        session.add(
            AuditLog(
                created_at=utcnow(),
                actor_account_id=actor,
                action=action,
                target_account_id=target,
                details=details,
            )
        )

    @staticmethod
    def _account(session: Session, account_id: int) -> Account:
        row = session.get(Account, account_id)
        if row is None:
            raise UnknownAccount(
                f"account {account_id} does not exist", details={"account_id": account_id}
            )
        return row

    @staticmethod
    def _lock_spend(session: Session, account_id: int) -> Spend:
        """The account's spend row, locked until the transaction ends."""
        row = session.scalars(
            select(Spend).where(Spend.account_id == account_id).with_for_update()
        ).one_or_none()
        if row is None:
            raise UnknownAccount(
                f"account {account_id} does not exist", details={"account_id": account_id}
            )
        return row

    @staticmethod
    def _budget_row(session: Session, account_id: int) -> Budget:
        row = session.get(Budget, account_id)
        if row is None:
            raise UnknownAccount(
                f"account {account_id} does not exist", details={"account_id": account_id}
            )
        return row

    # --- accounts -----------------------------------------------------------------------------

    def create_account(
        self,
        type: AccountType,
        *,
        node_id: str | None = None,
        cap_epsilon: float,
        delta: float,
        label: str | None = None,
        allow_create_seed_accounts: bool = False,
        actor_account_id: int | None = None,
    ) -> AccountRecord:
        if type not in ACCOUNT_TYPES:
            raise InvalidParameter("type", f"must be one of {', '.join(ACCOUNT_TYPES)}")
        if type == "user":
            if not node_id:
                raise InvalidParameter("node_id", "a user account is bound to a seed node")
        elif node_id is not None:
            raise InvalidParameter("node_id", f"only user accounts have a node, not {type}")
        cap = _check_cap(cap_epsilon)
        dlt = _check_delta(delta)
        try:
            with self._writing() as session:
                now = utcnow()
                account = Account(
                    type=type,
                    node_id=node_id,
                    user_node_id=node_id if type == "user" else None,
                    label=label,
                    allow_create_seed_accounts=bool(allow_create_seed_accounts),
                    created_at=now,
                )
                session.add(account)
                session.flush()
                session.add(
                    Budget(account_id=account.id, cap_epsilon=cap, delta=dlt, updated_at=now)
                )
                zero = RdpCurve.zero()
                session.add(
                    Spend(
                        account_id=account.id,
                        rdp=zero.to_json(),
                        pure_epsilon=zero.pure,
                        grid_version=GRID_VERSION,
                        charges=0,
                        updated_at=now,
                    )
                )
                self._audit(
                    session,
                    "account.create",
                    actor=actor_account_id,
                    target=account.id,
                    details={
                        "type": type,
                        "node_id": node_id,
                        "label": label,
                        "cap_epsilon": cap,
                        "delta": dlt,
                        "allow_create_seed_accounts": bool(allow_create_seed_accounts),
                    },
                )
                session.flush()
                return _account_record(account)
        except IntegrityError as exc:
            existing = self.account_for_node(node_id) if node_id is not None else None
            if existing is not None:
                raise AccountExists(
                    f"node {node_id!r} already has a user account ({existing.account_id})",
                    details={"node_id": node_id, "account_id": existing.account_id},
                ) from exc
            raise

    def get_account(self, account_id: int) -> AccountRecord:
        with self._reading() as session:
            return _account_record(self._account(session, account_id))

    def list_accounts(
        self, *, type: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AccountRecord]:
        stmt = select(Account).order_by(Account.id).limit(limit).offset(offset)
        if type is not None:
            if type not in ACCOUNT_TYPES:
                raise InvalidParameter("type", f"must be one of {', '.join(ACCOUNT_TYPES)}")
            stmt = stmt.where(Account.type == type)
        with self._reading() as session:
            return [_account_record(row) for row in session.scalars(stmt)]

    def account_for_node(self, node_id: str) -> AccountRecord | None:
        with self._reading() as session:
            row = session.scalars(
                select(Account).where(Account.user_node_id == node_id)
            ).one_or_none()
            return None if row is None else _account_record(row)

    def user_account_for_node(
        self, node: str, *, create: bool, cap_epsilon: float, delta: float
    ) -> int:
        """The user account bound to ``node``, created on first use when ``create`` is set.

        Race-safe: of two concurrent creators one inserts, the other hits the UNIQUE
        constraint and reads the winner's account.
        """
        existing = self.account_for_node(node)
        if existing is not None:
            return existing.account_id
        if not create:
            raise UnknownAccount(
                f"no account for node {node!r}; an admin must create one "
                f"(python -m service accounts create --type user --node {node})",
                details={"node": node},
            )
        try:
            return self.create_account(
                "user",
                node_id=node,
                cap_epsilon=cap_epsilon,
                delta=delta,
                label="created on first charge",
            ).account_id
        except AccountExists:
            existing = self.account_for_node(node)
            if existing is None:  # pragma: no cover - the constraint said it exists
                raise
            return existing.account_id

    # --- API keys -----------------------------------------------------------------------------

    def create_api_key(
        self, account_id: int, *, actor_account_id: int | None = None
    ) -> tuple[str, ApiKeyRecord]:
        """A new key for the account; the plaintext is returned here and never stored."""
        api_key = generate_api_key()
        with self._writing() as session:
            self._account(session, account_id)
            row = ApiKey(
                account_id=account_id,
                key_hash=hash_api_key(api_key),
                prefix=key_prefix(api_key),
                created_at=utcnow(),
            )
            session.add(row)
            session.flush()
            self._audit(
                session,
                "api_key.create",
                actor=actor_account_id,
                target=account_id,
                details={"key_id": row.id, "prefix": row.prefix},
            )
            return api_key, _key_record(row)

    def authenticate(self, api_key: str) -> AccountRecord | None:
        if not isinstance(api_key, str) or not api_key:
            return None
        with self._reading() as session:
            row = session.scalars(
                select(Account)
                .join(ApiKey, ApiKey.account_id == Account.id)
                .where(ApiKey.key_hash == hash_api_key(api_key), ApiKey.revoked_at.is_(None))
            ).one_or_none()
            return None if row is None else _account_record(row)

    def revoke_api_key(self, key_id: int, *, actor_account_id: int | None = None) -> ApiKeyRecord:
        with self._writing() as session:
            row = session.get(ApiKey, key_id)
            if row is None:
                raise UnknownApiKey(f"API key {key_id} does not exist", details={"key_id": key_id})
            if row.revoked_at is None:
                row.revoked_at = utcnow()
                self._audit(
                    session,
                    "api_key.revoke",
                    actor=actor_account_id,
                    target=row.account_id,
                    details={"key_id": row.id, "prefix": row.prefix},
                )
                session.flush()
            return _key_record(row)

    def list_api_keys(self, account_id: int) -> list[ApiKeyRecord]:
        with self._reading() as session:
            self._account(session, account_id)
            rows = session.scalars(
                select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.id)
            )
            return [_key_record(row) for row in rows]

    # --- budgets ------------------------------------------------------------------------------

    def budget(self, account_id: int) -> BudgetView:
        with self._reading() as session:
            budget = self._budget_row(session, account_id)
            spend = session.get(Spend, account_id)
            assert spend is not None  # created with the budget row
            return _view(budget, spend)

    def account_delta(self, account_id: int) -> float:
        with self._reading() as session:
            return self._budget_row(session, account_id).delta

    def set_budget(
        self,
        account_id: int,
        *,
        cap_epsilon: float | None = None,
        delta: float | None = None,
        actor_account_id: int | None = None,
    ) -> BudgetView:
        """Change the cap and/or delta. The spend is an RDP curve, so a new delta re-converts
        it; a cap below the spend is allowed and simply refuses further queries."""
        cap = None if cap_epsilon is None else _check_cap(cap_epsilon)
        dlt = None if delta is None else _check_delta(delta)
        with self._writing() as session:
            spend = self._lock_spend(session, account_id)  # serialise with admissions
            budget = self._budget_row(session, account_id)
            changes: dict[str, Any] = {}
            if cap is not None and cap != budget.cap_epsilon:
                changes["cap_epsilon"] = {"old": budget.cap_epsilon, "new": cap}
                budget.cap_epsilon = cap
            if dlt is not None and dlt != budget.delta:
                changes["delta"] = {"old": budget.delta, "new": dlt}
                budget.delta = dlt
            if changes:
                budget.updated_at = utcnow()
                self._audit(
                    session,
                    "budget.set",
                    actor=actor_account_id,
                    target=account_id,
                    details=changes,
                )
                session.flush()
            return _view(budget, spend)

    # --- admission ----------------------------------------------------------------------------

    def admit_and_charge(
        self,
        *,
        charged_account_id: int,
        principal_account_id: int,
        seed: str,
        mechanism: str,
        mode: str,
        params: dict[str, Any],
        query_curve: RdpCurve,
        query_epsilon: float,
        graph_version: str,
        request_id: str,
        idempotency_key: str | None,
    ) -> ChargeReceipt:
        """Admit the query and commit its charge in one transaction, or refuse writing nothing.

        A charge already made under ``(principal_account_id, idempotency_key)`` is returned as
        ``reused`` without charging again; if that charge was refunded the key is spent and
        :class:`IdempotencyKeyFailed` is raised.
        """
        if not isinstance(query_curve, RdpCurve):
            raise TypeError("query_curve must be an RdpCurve")
        try:
            with self._writing() as session:
                spend = self._lock_spend(session, charged_account_id)
                if idempotency_key is not None:
                    earlier = self._charge_by_key(session, principal_account_id, idempotency_key)
                    if earlier is not None:
                        return self._reused(session, earlier)
                budget = self._budget_row(session, charged_account_id)
                spent = _spent_curve(spend)
                composed = spent + query_curve
                if composed.epsilon(budget.delta) > budget.cap_epsilon * (1.0 - ADMISSION_RTOL):
                    raise BudgetExhausted(_view(budget, spend, spent), float(query_epsilon))
                now = utcnow()
                charge = Charge(
                    created_at=now,
                    charged_account_id=charged_account_id,
                    principal_account_id=principal_account_id,
                    seed=seed,
                    mechanism=mechanism,
                    mode=mode,
                    params=params,
                    epsilon=float(query_epsilon),
                    rdp=query_curve.to_json(),
                    pure_epsilon=query_curve.pure,
                    grid_version=GRID_VERSION,
                    graph_version=graph_version,
                    request_id=request_id,
                    idempotency_key=idempotency_key,
                )
                session.add(charge)
                spend.rdp = composed.to_json()
                spend.pure_epsilon = composed.pure
                spend.grid_version = GRID_VERSION
                spend.charges = spend.charges + 1
                spend.updated_at = now
                session.flush()
                return ChargeReceipt(charge_id=charge.id, budget=_view(budget, spend, composed))
        except IntegrityError:
            # A concurrent twin with the same idempotency key committed first.
            if idempotency_key is None:
                raise
            with self._reading() as session:
                earlier = self._charge_by_key(session, principal_account_id, idempotency_key)
                if earlier is None:
                    raise
                return self._reused(session, earlier)

    @staticmethod
    def _charge_by_key(session: Session, principal: int, key: str) -> Charge | None:
        return session.scalars(
            select(Charge).where(
                Charge.principal_account_id == principal, Charge.idempotency_key == key
            )
        ).one_or_none()

    def _reused(self, session: Session, charge: Charge) -> ChargeReceipt:
        refunded = session.scalar(select(Refund.id).where(Refund.charge_id == charge.id))
        if refunded is not None:
            raise IdempotencyKeyFailed(
                IDEMPOTENCY_REFUNDED_MESSAGE,
                details={"charge_id": charge.id, "idempotency_key": charge.idempotency_key},
            )
        budget = self._budget_row(session, charge.charged_account_id)
        spend = session.get(Spend, charge.charged_account_id)
        assert spend is not None
        return ChargeReceipt(charge_id=charge.id, budget=_view(budget, spend), reused=True)

    def refund(self, charge_id: int, *, reason: str) -> BudgetView:
        """Compensate a charge whose noise was provably never released (idempotent)."""
        try:
            with self._writing() as session:
                charge = session.get(Charge, charge_id)
                if charge is None:
                    raise UnknownCharge(
                        f"charge {charge_id} does not exist", details={"charge_id": charge_id}
                    )
                account_id = charge.charged_account_id
                spend = self._lock_spend(session, account_id)
                budget = self._budget_row(session, account_id)
                done = session.scalar(select(Refund.id).where(Refund.charge_id == charge_id))
                if done is not None:
                    return _view(budget, spend)
                now = utcnow()
                session.add(Refund(charge_id=charge_id, created_at=now, reason=reason))
                session.flush()
                curves: list[dict[str, Any]] = list(
                    session.scalars(
                        select(Charge.rdp)
                        .where(Charge.charged_account_id == account_id, _not_refunded())
                        .order_by(Charge.id)
                    )
                )
                total = RdpCurve.zero()
                for data in curves:
                    total = total + RdpCurve.from_json(data)
                spend.rdp = total.to_json()
                spend.pure_epsilon = total.pure
                spend.grid_version = GRID_VERSION
                spend.charges = len(curves)
                spend.updated_at = now
                self._audit(
                    session,
                    "charge.refund",
                    actor=None,
                    target=account_id,
                    details={"charge_id": charge_id, "reason": reason, "epsilon": charge.epsilon},
                )
                session.flush()
                return _view(budget, spend, total)
        except IntegrityError:
            # A concurrent refund of the same charge won the UNIQUE(charge_id) race.
            with self._reading() as session:
                charge = session.get(Charge, charge_id)
                if charge is None:  # pragma: no cover
                    raise
            return self.budget(charge.charged_account_id)

    def list_charges(
        self, account_id: int | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ChargeRecord]:
        """Charges, newest first, with whether each was refunded."""
        stmt = (
            select(Charge, Refund.id)
            .outerjoin(Refund, Refund.charge_id == Charge.id)
            .order_by(Charge.id.desc())
            .limit(limit)
            .offset(offset)
        )
        if account_id is not None:
            stmt = stmt.where(Charge.charged_account_id == account_id)
        with self._reading() as session:
            return [
                _charge_record(charge, refund is not None)
                for charge, refund in session.execute(stmt)
            ]

    def count_charges(self, account_id: int | None = None) -> int:
        stmt = select(func.count(Charge.id))
        if account_id is not None:
            stmt = stmt.where(Charge.charged_account_id == account_id)
        with self._reading() as session:
            return int(session.scalar(stmt) or 0)

    def record_audit(
        self,
        actor_account_id: int | None,
        action: str,
        *,
        target_account_id: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Append an audit row for an action taken outside the ledger (e.g. a graph reload)."""
        with self._writing() as session:
            self._audit(
                session,
                action,
                actor=actor_account_id,
                target=target_account_id,
                details=dict(details or {}),
            )

    def list_audit(self, limit: int = 100) -> list[dict[str, Any]]:
        """Audit rows, newest first."""
        with self._reading() as session:
            rows = session.scalars(select(AuditLog).order_by(AuditLog.id.desc()).limit(limit))
            return [
                {
                    "id": row.id,
                    "created_at": iso(row.created_at),
                    "actor_account_id": row.actor_account_id,
                    "action": row.action,
                    "target_account_id": row.target_account_id,
                    "details": row.details,
                }
                for row in rows
            ]

    # --- releases -----------------------------------------------------------------------------

    def store_release(
        self,
        release: StoredRelease,
        *,
        idempotency_key: str | None,
        principal_account_id: int,
    ) -> None:
        """Keep a released answer for free replays (storing the same charge twice is a no-op)."""
        key = release.key
        try:
            with self._writing() as session:
                session.add(
                    Release(
                        charge_id=release.charge_id,
                        charged_account_id=key.account_id,
                        node=key.node,
                        graph_version=key.graph_version,
                        mode=key.mode,
                        epsilon=float(key.epsilon),
                        results=[[item.node, float(item.score)] for item in release.results],
                        mechanism=release.mechanism,
                        request_id=release.request_id,
                        principal_account_id=principal_account_id,
                        idempotency_key=idempotency_key,
                        created_at=utcnow(),
                    )
                )
        except IntegrityError:
            with self._reading() as session:
                if session.get(Release, release.charge_id) is None:
                    raise

    def find_release(self, key: ReleaseKey) -> StoredRelease | None:
        """The newest unrefunded release for ``key`` (epsilon compared exactly)."""
        stmt = (
            select(Release)
            .where(
                Release.charged_account_id == key.account_id,
                Release.node == key.node,
                Release.graph_version == key.graph_version,
                Release.mode == key.mode,
                Release.epsilon == float(key.epsilon),
                ~select(Refund.id).where(Refund.charge_id == Release.charge_id).exists(),
            )
            .order_by(Release.charge_id.desc())
            .limit(1)
        )
        with self._reading() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else _release_record(row)

    def release_for_idempotency_key(
        self, principal_account_id: int, idempotency_key: str
    ) -> StoredRelease | None:
        stmt = (
            select(Release)
            .where(
                Release.principal_account_id == principal_account_id,
                Release.idempotency_key == idempotency_key,
                ~select(Refund.id).where(Refund.charge_id == Release.charge_id).exists(),
            )
            .order_by(Release.charge_id.desc())
            .limit(1)
        )
        with self._reading() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else _release_record(row)
