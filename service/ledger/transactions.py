"""The ledger's transactions and what every part of the ledger shares.

:class:`LedgerTransactions` owns the engines: each call of a part runs in one transaction
(:func:`transaction`), a write transaction on the write engine (``BEGIN IMMEDIATE`` on SQLite).
:class:`LedgerPart` is the base of the ledger's parts (accounts, budgets, admission,
settlement, graph-wide releases, reports): their transactions and the row helpers and locks
they share (locks are always taken in the order charged spend row, principal spend row,
exposure shards by ascending shard).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, bindparam, select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from service.errors import ServiceError
from service.ledger.database import (
    autocommit_engine,
    is_sqlite,
    write_engine,
)
from service.ledger.locked_rows import (
    LockedAccount,
    LockedShard,
    lock_account,
    lock_accounts,
    lock_shard,
    lock_spend_row,
)
from service.ledger.records import (
    LedgerNotMigrated,
    ReleaseKey,
    UnknownAccount,
)
from service.ledger.tables import (
    Account,
    AuditLog,
    Budget,
    Charge,
    ExposureShard,
    GraphRelease,
    Release,
    Spend,
    utcnow,
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


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
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


RowT = TypeVar("RowT")


def unknown_account(account_id: int) -> UnknownAccount:
    return UnknownAccount(
        f"account {account_id} does not exist", details={"account_id": account_id}
    )


#: Built once: building the statement per call cost more than running it.
_LIVE_GRAPH_RELEASE = select(GraphRelease).where(
    GraphRelease.graph_version == bindparam("version"),
    GraphRelease.mechanism == bindparam("mechanism"),
    GraphRelease.state != "refunded",
)


def live_graph_release(session: Session, version: str, mechanism: str) -> GraphRelease | None:
    """The version's graph-wide release of ``mechanism`` that is not refunded, if any."""
    return session.scalars(
        _LIVE_GRAPH_RELEASE, {"version": version, "mechanism": mechanism}
    ).one_or_none()


def _known(row: RowT | None, account_id: int) -> RowT:
    """``row``, read for ``account_id``; None: :class:`UnknownAccount`."""
    if row is None:
        raise unknown_account(account_id)
    return row


def _migrated(row: RowT | None) -> RowT:
    """An exposure shard's row; None: the migrations (0002 creates the shards) have not run."""
    if row is None:  # pragma: no cover - created by migration 0002
        raise LedgerNotMigrated("exposure_shards is empty: run the migrations")
    return row


class LedgerTransactions:
    """The ledger database's engines; one transaction per :meth:`reading` / :meth:`writing`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.write_engine = write_engine(engine)
        self.sqlite = is_sqlite(engine)
        self.autocommit_engine = autocommit_engine(engine)

    def reading(self) -> AbstractContextManager[Session]:
        """A read, never a write or a lock: on PostgreSQL each statement in autocommit (no
        BEGIN and COMMIT round trips; :func:`autocommit_engine`)."""
        return transaction(self.autocommit_engine)

    def one_statement(self) -> AbstractContextManager[Session]:
        """PostgreSQL only: a session whose every statement commits on its own, for a write
        made in one statement (atomic by itself) and the reads around it."""
        if self.sqlite:
            raise RuntimeError("SQLite writes in transactions, not one statement at a time")
        return transaction(self.autocommit_engine)

    def writing(self) -> AbstractContextManager[Session]:
        """A write transaction: BEGIN IMMEDIATE on SQLite (takes the write lock up front)."""
        return transaction(self.write_engine)


class LedgerPart:
    """A part of the ledger: one concern, its SQL, on the ledger's shared transactions."""

    def __init__(self, transactions: LedgerTransactions) -> None:
        self._transactions = transactions

    @property
    def transactions(self) -> LedgerTransactions:
        """The engines this part runs its transactions on (shared by the ledger's parts)."""
        return self._transactions

    def _reading(self) -> AbstractContextManager[Session]:
        return self._transactions.reading()

    def _writing(self) -> AbstractContextManager[Session]:
        """A write transaction: BEGIN IMMEDIATE on SQLite (takes the write lock up front)."""
        return self._transactions.writing()

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
        return _known(session.get(Account, account_id), account_id)

    @staticmethod
    def _lock_spend(session: Session, account_id: int) -> Spend:
        """The account's spend row, locked until the transaction ends."""
        row = session.scalars(
            select(Spend).where(Spend.account_id == account_id).with_for_update()
        ).one_or_none()
        return _known(row, account_id)

    @staticmethod
    def _budget_row(session: Session, account_id: int) -> Budget:
        return _known(session.get(Budget, account_id), account_id)

    @staticmethod
    def _lock_account(session: Session, account_id: int) -> LockedAccount:
        """The account's spend and budget, its spend row locked (admission's Core path)."""
        return _known(lock_account(session, account_id), account_id)

    @staticmethod
    def _lock_accounts(session: Session, account_ids: list[int]) -> dict[int, LockedAccount]:
        """:meth:`_lock_account` for many accounts, in ascending id, a few statements."""
        locked = lock_accounts(session, account_ids)
        for account_id in account_ids:
            _known(locked.get(account_id), account_id)
        return locked

    @staticmethod
    def _lock_principal(session: Session, account_id: int) -> None:
        if not lock_spend_row(session, account_id):
            raise unknown_account(account_id)

    @staticmethod
    def _locked_shard(session: Session, shard: int) -> LockedShard:
        return _migrated(lock_shard(session, shard))

    @staticmethod
    def _lock_shard(session: Session, shard: int) -> ExposureShard:
        return _migrated(
            session.scalars(
                select(ExposureShard).where(ExposureShard.shard == shard).with_for_update()
            ).one_or_none()
        )

    _live_graph_release = staticmethod(live_graph_release)

    @staticmethod
    def _release_row(session: Session, key: ReleaseKey) -> Release | None:
        return session.scalars(
            select(Release)
            .join(Charge, Charge.id == Release.charge_id)
            .where(
                Release.charged_account_id == key.account_id,
                Release.node == key.node,
                Release.graph_version == key.graph_version,
                Release.mode == key.mode,
                Release.epsilon == float(key.epsilon),
                Release.mechanism_name == key.mechanism,
                Charge.state == "released",
            )
            .order_by(Release.charge_id.desc())
            .limit(1)
        ).one_or_none()
