"""A service account's 24-hour quota, and the charge for a graph version's degree release."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.ledger_rows import (
    ADMISSION_RTOL,
    _aware,
    _set_spend,
    _spent_curve,
    _view,
)
from service.ledger.locked_rows import AdmissionWrites
from service.ledger.records import (
    BudgetExhausted,
    DegreeCharge,
    DegreeReceipt,
    ServiceQuotaExhausted,
)
from service.ledger.reports import Reports
from service.ledger.tables import (
    DEGREE_RELEASE_CHARGE,
    Charge,
    utcnow,
)
from service.ledger.unit_of_work import (
    LedgerPart,
    UnitOfWork,
)
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION

#: The rolling window of a service account's spending quota.
QUOTA_WINDOW = timedelta(hours=24)


class QuotaAndDegree(LedgerPart):
    """The principal's quota check, and each account's one charge per degree release."""

    def __init__(self, uow: UnitOfWork, reports: Reports) -> None:
        super().__init__(uow)
        self._reports = reports

    def _check_quota(
        self,
        session: Session,
        principal: int,
        quota: float,
        epsilon: float,
        now: Any,
        *,
        lock: bool = True,
    ) -> None:
        """Refuse when the principal's eps charged to others in the last 24 h would pass its
        quota. Locks the principal's spend row (unless the caller holds it), so the check and
        the charge are atomic."""
        if lock:
            self._lock_principal(session, principal)
        since = now - QUOTA_WINDOW
        rows = session.execute(
            select(Charge.created_at, Charge.epsilon)
            .where(
                Charge.principal_account_id == principal,
                Charge.charged_account_id != principal,
                Charge.state != "refunded",
                Charge.created_at > since,
            )
            .order_by(Charge.created_at)
        ).all()
        used = math.fsum(float(e) for _, e in rows)
        if used + epsilon <= quota * (1.0 + ADMISSION_RTOL):
            return
        # When will enough of the window have expired for this query to fit?
        excess, retry_after = used + epsilon - quota, QUOTA_WINDOW.total_seconds()
        freed = 0.0
        for created_at, eps in rows:
            freed += float(eps)
            if freed >= excess:
                expires = _aware(created_at) + QUOTA_WINDOW
                retry_after = max(1.0, (expires - now).total_seconds())
                break
        raise ServiceQuotaExhausted(
            f"this service account has charged {used:.4g} epsilon to other accounts in the "
            f"last 24 hours; its quota is {quota:.4g}. Retry after {math.ceil(retry_after)} s, "
            "or ask an admin to raise the quota",
            retry_after=math.ceil(retry_after),
            details={"used_epsilon": used, "quota_epsilon": quota, "query_epsilon": epsilon},
        )

    @staticmethod
    def _paid_degree(
        session: Session, account_id: int, degree: DegreeCharge, writes: AdmissionWrites
    ) -> bool:
        """Whether the account has a live charge for this degree release (read under the
        account's spend lock; the unique index ``uq_charges_degree_release_live`` backs it)."""
        key = (account_id, degree.graph_version, float(degree.epsilon))
        if key in writes.degree_paid:
            return True
        found = session.scalar(
            select(Charge.id)
            .where(
                Charge.charged_account_id == account_id,
                Charge.mechanism == DEGREE_RELEASE_CHARGE,
                Charge.graph_version == degree.graph_version,
                Charge.epsilon == float(degree.epsilon),
                Charge.state != "refunded",
            )
            .limit(1)
        )
        return found is not None

    @staticmethod
    def _add_degree_charge(
        writes: AdmissionWrites,
        account_id: int,
        principal_id: int,
        seed: str,
        mode: str,
        degree: DegreeCharge,
        request_id: str,
        now: Any,
    ) -> None:
        """The account's charge for the version's degree release. It is ``released`` at once
        (the release is stored in ``graph_releases`` before any answer built on it) and never
        refunded; it is not added to an exposure shard (the release is there once already)."""
        curve = degree.curve
        writes.add_charge(
            created_at=now,
            charged_account_id=account_id,
            principal_account_id=principal_id,
            seed=seed,
            mechanism=DEGREE_RELEASE_CHARGE,
            mode=mode,
            params=writes.json(degree, lambda: {"epsilon": float(degree.epsilon)}),
            epsilon=float(degree.epsilon),
            rdp=writes.json(curve, curve.to_json),
            pure_epsilon=curve.pure,
            grid_version=GRID_VERSION,
            graph_version=degree.graph_version,
            request_id=request_id,
            idempotency_key=None,
            state="released",
            release_key=None,
            exposure_shard=0,
        )
        writes.degree_paid.add((account_id, degree.graph_version, float(degree.epsilon)))

    def admit_degree_release(
        self,
        *,
        charged_account_id: int,
        principal_account_id: int,
        seed: str,
        mode: str,
        degree: DegreeCharge,
        request_id: str,
        quota_epsilon: float | None = None,
    ) -> DegreeReceipt:
        """Admit an answer built on the degree release alone (``popular``): free when the
        account has paid for this version's release, else its charge is admitted like any
        (the cap at the account's delta, the principal's quota) and committed, or refused
        with :class:`BudgetExhausted` writing nothing."""
        if not isinstance(degree.curve, RdpCurve):
            raise TypeError("degree.curve must be an RdpCurve")
        try:
            with self._writing() as session:
                account = self._lock_account(session, charged_account_id)
                writes = AdmissionWrites()
                if self._paid_degree(session, charged_account_id, degree, writes):
                    return DegreeReceipt(_view(account, account), charged=False)
                spent = _spent_curve(account)
                composed = spent + degree.curve
                if composed.epsilon(account.delta) > account.cap_epsilon * (1.0 - ADMISSION_RTOL):
                    raise BudgetExhausted(_view(account, account, spent), float(degree.epsilon))
                now = utcnow()
                if quota_epsilon is not None and principal_account_id != charged_account_id:
                    self._check_quota(
                        session, principal_account_id, quota_epsilon, float(degree.epsilon), now
                    )
                self._add_degree_charge(
                    writes, charged_account_id, principal_account_id, seed, mode, degree,
                    request_id, now,
                )  # fmt: skip
                _set_spend(account, account, composed, account.charges + 1)
                account.last_charge_at = now
                writes.changed_account(account)
                writes.finish(session)
                return DegreeReceipt(_view(account, account, composed), charged=True)
        except (BudgetExhausted, ServiceQuotaExhausted) as refusal:
            self._reports.record_refusal(
                refusal.code,
                charged_account_id=charged_account_id,
                principal_account_id=principal_account_id,
                mode=mode,
                epsilon=float(degree.epsilon),
            )
            raise
