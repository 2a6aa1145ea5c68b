"""Reports on the ledger: verification, graph-wide exposure, listings and the audit log."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from service.errors import ServiceError
from service.ledger.exposure import ExposureReport, default_delta, exposure_report
from service.ledger.ledger_rows import (
    charge_record,
    valid_delta,
)
from service.ledger.records import (
    BudgetExhausted,
    ChargeRecord,
    GraphBudgetExhausted,
    ReadCapExhausted,
    ServiceQuotaExhausted,
)
from service.ledger.tables import (
    AuditLog,
    Charge,
    Refusal,
    iso,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerUnavailable,
)
from service.ledger.verification import VerifyReport, verify_ledger

log = logging.getLogger("service.ledger.ledger")

REFUSALS = cast(Table, Refusal.__table__)


class RefusalRow(NamedTuple):
    """One refused query, as the refusals table keeps it (nothing was charged)."""

    reason: str
    charged_account_id: int | None = None
    principal_account_id: int | None = None
    mode: str | None = None
    epsilon: float | None = None

    @classmethod
    def of(
        cls,
        refusal: ServiceError,
        charged_account_id: int,
        principal_account_id: int,
        mode: str,
        epsilon: float | None = None,
    ) -> RefusalRow:
        """The row of an admission's ``refusal`` (``epsilon`` None: the query epsilon the
        refusal names)."""
        if epsilon is None:
            epsilon = float(refusal.details.get("query_epsilon", 0.0))
        return cls(refusal.code, charged_account_id, principal_account_id, mode, epsilon)


#: The refusals of an admission the refusals table keeps a row of (a reused idempotency key is
#: bad input, not a refusal).
ADMISSION_REFUSALS = (
    BudgetExhausted, ServiceQuotaExhausted, GraphBudgetExhausted, ReadCapExhausted,
)  # fmt: skip


def insert_refusals(session: Session, refusals: Sequence[RefusalRow]) -> None:
    """The refusals, in the caller's transaction, in one multi-row INSERT."""
    now = utcnow()
    session.execute(
        insert(REFUSALS),
        [{**refusal._asdict(), "created_at": now} for refusal in refusals],
    )


class Reports(LedgerPart):
    """Checks and reports over the whole ledger, and the audit and refusal rows."""

    def verify(self) -> VerifyReport:
        """Recompute every derived value from the append-only rows (see ``verification``)."""
        try:
            return verify_ledger(self._transactions.engine)
        except (OperationalError, InterfaceError) as exc:
            raise LedgerUnavailable("the budget ledger database cannot be reached") from exc

    def exposure(
        self, *, delta: float | None = None, cap_epsilon: float | None = None
    ) -> ExposureReport:
        """The graph-wide exposure of every live charge and graph-wide release."""
        if delta is not None:
            valid_delta(delta)
        try:
            return exposure_report(self._transactions.engine, delta=delta, cap_epsilon=cap_epsilon)
        except (OperationalError, InterfaceError) as exc:
            raise LedgerUnavailable("the budget ledger database cannot be reached") from exc

    def smallest_delta(self) -> float:
        return default_delta(self._transactions.engine)

    def list_charges(
        self, account_id: int | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ChargeRecord]:
        """Charges, newest first, with their state."""
        stmt = select(Charge).order_by(Charge.id.desc()).limit(limit).offset(offset)
        if account_id is not None:
            stmt = stmt.where(Charge.charged_account_id == account_id)
        with self._reading() as session:
            return [
                charge_record(charge, charge.state == "refunded")
                for charge in session.scalars(stmt)
            ]

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

    def record_refusal(
        self,
        reason: str,
        *,
        charged_account_id: int | None = None,
        principal_account_id: int | None = None,
        mode: str | None = None,
        epsilon: float | None = None,
    ) -> None:
        """Keep a refused query (its own transaction; nothing was charged). Best effort: a
        refusal is answered even when this write fails."""
        self.record_refusals(
            [RefusalRow(reason, charged_account_id, principal_account_id, mode, epsilon)]
        )

    @contextmanager
    def recording_refusal(
        self,
        charged_account_id: int,
        principal_account_id: int,
        mode: str,
        epsilon: float | None = None,
    ) -> Iterator[None]:
        """Around one admission: a refusal it raises (:data:`ADMISSION_REFUSALS`) is kept in
        the refusals table (:meth:`record_refusals`, after the admission's transaction has
        rolled back) and raised on. The one way an admission records its refusal."""
        try:
            yield
        except ADMISSION_REFUSALS as refusal:
            self.record_refusals(
                [RefusalRow.of(refusal, charged_account_id, principal_account_id, mode, epsilon)]
            )
            raise

    def record_refusals(self, refusals: Sequence[RefusalRow]) -> None:
        """Keep many refused queries in one transaction, one multi-row INSERT (a batch whose
        items are refused costs one write, not one per item). Best effort, as
        :meth:`record_refusal`."""
        if not refusals:
            return
        try:
            with self._writing() as session:
                insert_refusals(session, refusals)
        except Exception:
            log.warning("could not record %d refusals", len(refusals), exc_info=True)

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
