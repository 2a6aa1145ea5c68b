"""One query's admission under its account's spend lock: earlier answers, the cap, the charge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from service.ledger.admission_reads import AdmissionReads
from service.ledger.group_reads import GroupReads, ReceiptOfNewCharge, twin_and_release
from service.ledger.idempotency import (
    EarlierCharge,
    bound_charge,
)
from service.ledger.ledger_rows import (
    aware_utc,
    budget_view,
    set_spend,
    spent_curve,
)
from service.ledger.locked_rows import (
    AdmissionWrites,
    LockedAccount,
    NewCharge,
)
from service.ledger.period_spend import PeriodAdmission, locked_view
from service.ledger.quota_and_degree import QuotaAndDegree, add_degree_charge
from service.ledger.records import (
    Admission,
    BudgetView,
    ChargeReceipt,
    IdempotencyKeyReused,
)
from service.ledger.tables import (
    Spend,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION


class StaleTwin(Exception):
    """Internal: an identical query's charge is still ``admitted`` past the stale bound;
    roll back, refund it on its own, and admit again."""

    def __init__(self, charge_id: int, age: float, stale_after_seconds: float) -> None:
        super().__init__(charge_id, age)
        self.charge_id = charge_id
        self.age = age
        self.stale_after_seconds = stale_after_seconds


def _refuse_stale_twin(charge_id: int, last_sign: Any, stale_after_seconds: float) -> None:
    """Raise :class:`StaleTwin` for an in-flight twin whose last sign of life (heartbeat,
    else admission) is older than the bound.

    It is refunded in a transaction of its own (:meth:`Admissions._reconcile_stale_twin`), then
    the admission starts again: refunding here would lock the twin's exposure shard after
    this admission's own, out of ascending order."""
    age = (utcnow() - aware_utc(last_sign)).total_seconds()
    if age > stale_after_seconds:
        raise StaleTwin(charge_id, age, stale_after_seconds)


class AdmissionRules(LedgerPart):
    """What admits a query, alone or in a group, under the locks the caller holds."""

    def __init__(
        self,
        transactions: LedgerTransactions,
        quota_and_degree: QuotaAndDegree,
        periods: PeriodAdmission,
    ) -> None:
        super().__init__(transactions)
        self._quota_and_degree = quota_and_degree
        self._periods = periods

    def admit_locked(
        self,
        session: Session,
        a: Admission,
        account: LockedAccount,
        add_exposure: Callable[[RdpCurve], int],
        stale_after_seconds: float,
        writes: AdmissionWrites,
        principal_locked: bool = False,
        reads: GroupReads | None = None,
        figures: AdmissionReads | None = None,
    ) -> ChargeReceipt | ReceiptOfNewCharge | tuple[NewCharge, BudgetView]:
        """Admission of ``a`` under its charged account's spend lock (``account``, held):
        a receipt when an earlier charge answers it (``reused`` / ``joined``), else the new
        charge (added to ``writes``, not yet written) and the budget after it.

        In a group, ``reads`` holds what the group's queries look for (read once, under the
        group's locks) and learns the charges the group adds; alone, each is read here.
        A refusal raises before anything is written, so a group transaction may go on with
        the next query after one is refused.

        With ``a.read`` (a service account receiving the release), the release is counted in
        its read figure in ``figures`` after the quota check, refused past its read cap
        (:mod:`service.ledger.admission_reads`); its spend row is locked here unless held.
        """
        query_curve = a.query_curve
        if not isinstance(query_curve, RdpCurve):
            raise TypeError("query_curve must be an RdpCurve")
        quota = a.quota_epsilon is not None and a.principal_account_id != a.charged_account_id
        if reads is None and (quota or a.idempotency_key is not None or a.release_key is not None):
            # alone: the charges this transaction added must be visible to the reads below. A
            # group's reads hold what it added (``reads``), its quota windows add what it
            # charged, and a period's window writes them itself before reading.
            writes.write_charges(session)
        release_key = a.release_key
        digest = release_key.digest() if release_key is not None else None
        earlier: ChargeReceipt | ReceiptOfNewCharge | None
        if reads is None:
            earlier = self._earlier_alone(session, a, account, digest, stale_after_seconds, writes)
        else:
            earlier = self._earlier_in_group(
                session, a, account, digest, stale_after_seconds, writes, reads
            )
        if earlier is not None:
            return earlier
        degree = a.degree
        if degree is not None and self._quota_and_degree.paid_degree(
            session, a.charged_account_id, degree, writes, reads
        ):
            degree = None
        spent = spent_curve(account)
        composed = spent + query_curve
        epsilon = float(a.query_epsilon)
        parts: tuple[RdpCurve, ...] = (query_curve,)
        if degree is not None:  # composed with the query's curve, admitted as one
            composed = composed + degree.curve
            epsilon += float(degree.epsilon)
            parts = (query_curve, degree.curve)
        now = self._periods.now(session, account, utcnow(), writes)
        period_window = self._periods.admit(
            session, account, spent, composed, parts, epsilon, now, writes
        )  # the budget rule on the lifetime cap and, with a period, the period cap
        if a.quota_epsilon is not None and a.principal_account_id != a.charged_account_id:
            self._quota_and_degree.check_quota(
                session, a.principal_account_id, a.quota_epsilon, epsilon, now, writes=writes,
                lock=not principal_locked,
                windows=None if reads is None else reads.quota_windows,
            )  # fmt: skip
        read = None
        if a.read is not None:
            if figures is None:
                raise ValueError("an admission with a read needs the transaction's reads")
            principal = a.principal_account_id
            if not principal_locked and principal != a.charged_account_id and not quota:
                self._lock_principal(session, principal)  # before the shards, as always
            rdp = writes.json(query_curve, query_curve.to_json)
            read = figures.check(
                session, principal, a.read, query_curve, float(a.query_epsilon), rdp
            )
        shard = add_exposure(query_curve)
        charge = writes.add_charge(
            created_at=now,
            charged_account_id=a.charged_account_id,
            principal_account_id=a.principal_account_id,
            seed=a.seed,
            mechanism=a.mechanism,
            mode=a.mode,
            params=writes.json(a.params, lambda: a.params),
            epsilon=float(a.query_epsilon),
            rdp=writes.json(query_curve, query_curve.to_json),
            pure_epsilon=query_curve.pure,
            grid_version=GRID_VERSION,
            graph_version=a.graph_version,
            request_id=a.request_id,
            idempotency_key=a.idempotency_key,
            state="admitted",
            release_key=digest,
            exposure_shard=shard,
        )
        charges = account.charges + 1
        if degree is not None:
            charge.degree_epsilon = float(degree.epsilon)
            add_degree_charge(
                writes, a.charged_account_id, a.principal_account_id, a.seed, a.mode, degree,
                a.request_id, now,
            )  # fmt: skip
            charges += 1
        if quota and reads is not None:  # what the group charged counts in its window
            window = reads.quota_windows.get(a.principal_account_id)
            if window is not None:  # as the sum would read: the query's, its degree charge
                window.add(float(a.query_epsilon))
                if degree is not None:
                    window.add(float(degree.epsilon))
        if read is not None and figures is not None:
            figures.keep(read, charge)
        if a.idempotency_key is not None:
            writes.bind(a.principal_account_id, a.idempotency_key, charge, "charged", now)
            if reads is not None:
                reads.bound(a.principal_account_id, a.idempotency_key, charge)
        set_spend(account, account, composed, charges)
        account.last_charge_at = now
        if period_window is not None:
            account.period_spent = period_window
        writes.changed_account(account)
        if reads is not None:
            reads.added(charge, a, digest)
        return charge, locked_view(account, composed)

    def _earlier_alone(
        self,
        session: Session,
        a: Admission,
        account: LockedAccount,
        digest: str | None,
        stale_after_seconds: float,
        writes: AdmissionWrites,
    ) -> ChargeReceipt | None:
        """The receipt of an earlier charge that answers ``a`` (its Idempotency-Key's, an
        in-flight twin's, a stored release's), read now; None: ``a`` is charged."""
        if a.idempotency_key is not None:
            earlier = bound_charge(session, a.principal_account_id, a.idempotency_key)
            if earlier is not None:
                return self.reused_receipt(session, earlier, writes)
        if a.release_key is not None and digest is not None:
            twin, released = twin_and_release(session, a.charged_account_id, digest, a.release_key)
            joined: int | None = None
            if twin is not None:
                _refuse_stale_twin(twin.id, twin.last_sign, stale_after_seconds)
                joined = twin.id
            elif released is not None and (
                a.released_after is None or released[1] > a.released_after
            ):  # a release too old for the query's refresh policy is not joined
                joined = released[0]
            if joined is not None:
                self._bind_joined(a, joined, a.charged_account_id, writes)
                return ChargeReceipt(
                    charge_id=joined, budget=budget_view(account, account), joined=True
                )
        return None

    def _earlier_in_group(
        self,
        session: Session,
        a: Admission,
        account: LockedAccount,
        digest: str | None,
        stale_after_seconds: float,
        writes: AdmissionWrites,
        reads: GroupReads,
    ) -> ChargeReceipt | ReceiptOfNewCharge | None:
        """As :meth:`_earlier_alone`, from what the group read up front and added since."""
        if a.idempotency_key is not None:
            holder = reads.holder(a.principal_account_id, a.idempotency_key)
            if isinstance(holder, NewCharge):
                locked = writes.account(int(holder.values["charged_account_id"]))
                assert locked is not None  # the group charged it, under its lock
                return ReceiptOfNewCharge(holder, budget_view(locked, locked), reused=True)
            if holder is not None:
                return self.reused_receipt(session, holder, writes)
        if a.release_key is not None and digest is not None:
            new_twin = reads.new_twin(a.charged_account_id, digest)
            if new_twin is not None:
                self._bind_joined(a, new_twin, a.charged_account_id, writes, reads)
                return ReceiptOfNewCharge(new_twin, budget_view(account, account), joined=True)
            twin = reads.twin(a.charged_account_id, digest)
            if twin is not None:
                _refuse_stale_twin(twin.id, twin.last_sign, stale_after_seconds)
                self._bind_joined(a, twin.id, a.charged_account_id, writes, reads)
                return ChargeReceipt(
                    charge_id=twin.id, budget=budget_view(account, account), joined=True
                )
            released = reads.released(a.release_key, a.released_after)
            if released is not None:
                self._bind_joined(a, released, a.charged_account_id, writes, reads)
                view = budget_view(account, account)
                return ChargeReceipt(charge_id=released, budget=view, joined=True)
        return None

    @staticmethod
    def _bind_joined(
        a: Admission,
        charge: NewCharge | int,
        charged_account_id: int,
        writes: AdmissionWrites,
        reads: GroupReads | None = None,
    ) -> None:
        """A keyed query answered by an identical query's charge binds its key to it, in the
        admission's transaction (so a retry gets that charge's release, never a newer one)."""
        if a.idempotency_key is None:
            return
        writes.bind(a.principal_account_id, a.idempotency_key, charge, "joined", utcnow())
        if reads is not None:
            held = charge if isinstance(charge, NewCharge) else EarlierCharge(
                charge, charged_account_id
            )  # fmt: skip
            reads.bound(a.principal_account_id, a.idempotency_key, held)

    def reused_receipt(
        self,
        session: Session,
        charge: EarlierCharge,
        writes: AdmissionWrites | None = None,
    ) -> ChargeReceipt:
        if charge.popular:  # the key answered a popular query: no charged query may take it
            raise IdempotencyKeyReused()
        locked = None if writes is None else writes.account(charge.charged_account_id)
        if locked is not None:
            # the spend as this transaction left it (a group may have charged it already)
            return ChargeReceipt(
                charge_id=charge.id, budget=budget_view(locked, locked), reused=True
            )
        budget = self._budget_row(session, charge.charged_account_id)
        spend = session.get(Spend, charge.charged_account_id)
        assert spend is not None
        return ChargeReceipt(charge_id=charge.id, budget=budget_view(budget, spend), reused=True)
