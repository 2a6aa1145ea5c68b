"""Atomic admit-and-charge: single and grouped admissions, each in one transaction."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import ServiceError
from service.ledger.admission_reads import AdmissionReads
from service.ledger.admission_rules import AdmissionRules, StaleTwin
from service.ledger.exposure_shards import ExposureShards, NeedsExactCap
from service.ledger.group_reads import GroupReads, ReceiptOfNewCharge
from service.ledger.idempotency import bound_charge
from service.ledger.locked_rows import (
    AdmissionWrites,
    NewCharge,
)
from service.ledger.records import (
    Admission,
    BudgetView,
    ChargeReceipt,
    GraphCap,
    IdempotencyKeyReused,
)
from service.ledger.reports import ADMISSION_REFUSALS, RefusalRow, Reports, insert_refusals
from service.ledger.settlement import Settlement
from service.ledger.tables import utcnow
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)
from service.privacy.accountant import RdpCurve

#: A charge whose twin waits on it but which is older than this is settled by the waiter.
DEFAULT_STALE_AFTER_SECONDS = 60.0


class Admissions(LedgerPart):
    """Admits queries and commits their charges (or refuses writing nothing), alone or grouped."""

    def __init__(
        self,
        transactions: LedgerTransactions,
        rules: AdmissionRules,
        shards: ExposureShards,
        settlement: Settlement,
        reports: Reports,
    ) -> None:
        super().__init__(transactions)
        self._rules = rules
        self._shards = shards
        self._settlement = settlement
        self._reports = reports

    def admit_and_charge(
        self,
        a: Admission,
        *,
        graph_cap: GraphCap | None = None,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
    ) -> ChargeReceipt:
        """Admit the query and commit its charge in one transaction, or refuse writing nothing.

        Under the charged account's spend-row lock, in this order:

        * a live charge under ``(principal_account_id, idempotency_key)`` is returned as
          ``reused`` (nothing charged); a refunded one frees its key, so a retry charges anew;
        * with a ``release_key`` (a non-fresh query), an identical query already admitted and
          still in flight, or already released, is returned as ``joined`` (nothing charged);
          an in-flight twin older than ``stale_after_seconds`` is reconciled (refunded) first;
        * the budget (the spent curve plus this one, at the account's delta), the principal's
          24-hour quota when ``quota_epsilon`` is given (a service account charging another
          account; its own spend row is locked too), and the graph-wide cap when given.

        Locks are always taken in the order: charged spend row, principal spend row, exposure
        shard rows by ascending shard, so concurrent admissions never deadlock.
        """
        if not isinstance(a.query_curve, RdpCurve):
            raise TypeError("query_curve must be an RdpCurve")
        exact_cap = False
        while True:
            try:
                with (
                    self._reports.recording_refusal(
                        a.charged_account_id, a.principal_account_id, a.mode, a.query_epsilon
                    ),
                    self._writing() as session,
                ):
                    return self._admit(session, a, graph_cap, exact_cap, stale_after_seconds)
            except NeedsExactCap:
                exact_cap = True  # rolled back: start again, locking every shard
            except StaleTwin as stale:
                self._reconcile_stale_twin(stale)  # rolled back: refund it, then start again
            except IntegrityError:
                # A concurrent request with the same idempotency key bound it first.
                if a.idempotency_key is None:
                    raise
                with self._reading() as session:
                    earlier = bound_charge(session, a.principal_account_id, a.idempotency_key)
                    if earlier is None:
                        raise
                    return self._rules.reused_receipt(session, earlier)

    def _admit(
        self,
        session: Session,
        a: Admission,
        graph_cap: GraphCap | None,
        exact_cap: bool,
        stale_after_seconds: float,
    ) -> ChargeReceipt:
        account = self._lock_account(session, a.charged_account_id)
        writes = AdmissionWrites()
        figures = AdmissionReads()
        outcome = self._rules.admit_locked(
            session,
            a,
            account,
            lambda curve: self._shards.add_exposure(session, curve, graph_cap, exact_cap, writes),
            stale_after_seconds,
            writes,
            figures=figures,
        )
        if isinstance(outcome, ChargeReceipt):
            writes.finish(session)  # the key it bound, if any
            return outcome
        assert isinstance(outcome, tuple)  # alone, no charge of a group answers it
        charge, view = outcome
        writes.finish(session)
        figures.write(session)  # the principal's read of it, if it is a reader
        return ChargeReceipt(charge_id=charge.id, budget=view, degree_epsilon=charge.degree_epsilon)

    def admit_and_charge_many(
        self,
        admissions: list[Admission],
        *,
        graph_cap: GraphCap | None = None,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
    ) -> list[ChargeReceipt | ServiceError]:
        """Admit many queries in ONE transaction: per query, a receipt or its refusal.

        Each query's admission is all-or-nothing and exactly the check of
        :meth:`admit_and_charge` (budget, quota, graph-wide cap, idempotency, twins), made in
        list order against the spend the earlier queries of the list left; a refused query
        writes nothing and the others go on. The locks are taken up front in the single
        path's order: every charged account's spend row by ascending id, then the principals'
        (quota), then the exposure shards by ascending shard (one shard, or all of them when
        a graph-wide cap is set), so groups and single admissions never deadlock.

        If the group cannot commit as one (a concurrent twin took an idempotency key), every
        query is admitted on its own with :meth:`admit_and_charge` instead.
        """
        if not admissions:
            return []
        while True:
            try:
                results = self._admit_group_once(admissions, graph_cap, stale_after_seconds)
            except IntegrityError:
                return [self._admit_alone(a, graph_cap, stale_after_seconds) for a in admissions]
            except StaleTwin as stale:
                self._reconcile_stale_twin(stale)  # rolled back: refund it, then start again
                continue
            break
        return results

    def _admit_group_once(
        self, admissions: list[Admission], graph_cap: GraphCap | None, stale_after_seconds: float
    ) -> list[ChargeReceipt | ServiceError]:
        with self._writing() as session:
            writes = AdmissionWrites()
            figures = AdmissionReads()
            outcomes = self._admit_group(
                session, admissions, graph_cap, stale_after_seconds, writes, figures
            )
            writes.finish(session)  # the charges' ids, the spend and the shards
            figures.write(session)  # the service accounts' reads of them
            refused = [
                _refusal_row(a, outcome)
                for a, outcome in zip(admissions, outcomes, strict=True)
                if isinstance(outcome, ADMISSION_REFUSALS)
            ]
            if refused:  # in this transaction: a refused group costs one write, not one each
                insert_refusals(session, refused)
            results: list[ChargeReceipt | ServiceError] = []
            for outcome in outcomes:
                if isinstance(outcome, tuple):
                    charge, view = outcome
                    outcome = ChargeReceipt(
                        charge_id=charge.id, budget=view, degree_epsilon=charge.degree_epsilon
                    )
                elif isinstance(outcome, ReceiptOfNewCharge):
                    outcome = outcome.receipt()
                results.append(outcome)
        return results

    def _admit_alone(
        self, a: Admission, graph_cap: GraphCap | None, stale_after_seconds: float
    ) -> ChargeReceipt | ServiceError:
        try:
            return self.admit_and_charge(
                a, graph_cap=graph_cap, stale_after_seconds=stale_after_seconds
            )
        except (*ADMISSION_REFUSALS, IdempotencyKeyReused) as refusal:
            return refusal

    def _admit_group(
        self,
        session: Session,
        admissions: list[Admission],
        graph_cap: GraphCap | None,
        stale_after_seconds: float,
        writes: AdmissionWrites,
        figures: AdmissionReads,
    ) -> list[ChargeReceipt | ServiceError | ReceiptOfNewCharge | tuple[NewCharge, BudgetView]]:
        charged = sorted({a.charged_account_id for a in admissions})
        accounts = self._lock_accounts(session, charged)  # ascending, a few statements
        principals = sorted(
            {
                a.principal_account_id
                for a in admissions
                if (a.quota_epsilon is not None or a.read is not None)
                and a.principal_account_id != a.charged_account_id
            }
            - set(charged)
        )
        for principal in principals:
            self._lock_principal(session, principal)
        # Every principal whose quota is checked, or who reads what it is charged, is now
        # locked (as a charged or a principal row).
        add_exposure = self._shards.group_exposure(session, graph_cap, writes)

        # What the queries look for (keys, twins, releases, degree releases paid), read once
        # for the group under its locks; one INSERT batch at the end instead of one per query
        # (only a budget period's window, read once per account, writes the charges so far).
        reads = GroupReads.read(session, admissions)
        outcomes: list[
            ChargeReceipt | ServiceError | ReceiptOfNewCharge | tuple[NewCharge, BudgetView]
        ] = []
        for a in admissions:
            try:
                outcome = self._rules.admit_locked(
                    session, a, accounts[a.charged_account_id], add_exposure,
                    stale_after_seconds, writes, principal_locked=True, reads=reads,
                    figures=figures,
                )  # fmt: skip
            except ADMISSION_REFUSALS as refusal:
                outcomes.append(refusal)
                continue
            except IdempotencyKeyReused as reused:  # bad input: no refusal row, nothing charged
                outcomes.append(reused)
                continue
            outcomes.append(outcome)
        return outcomes

    def _reconcile_stale_twin(self, stale: StaleTwin) -> None:
        """Refund an in-flight twin whose last sign of life is older than
        ``stale_after_seconds`` without a release (its worker died between charge and answer),
        in its own transaction. If it was released (or beat) meanwhile, the admission that
        starts again joins it."""
        self._settlement.refund_if_stale(
            stale.charge_id,
            utcnow() - timedelta(seconds=stale.stale_after_seconds),
            reason=f"reconciled: no release {stale.age:.0f} s after admission",
        )


def _refusal_row(a: Admission, refusal: ServiceError) -> RefusalRow:
    return RefusalRow.of(
        refusal, a.charged_account_id, a.principal_account_id, a.mode, a.query_epsilon
    )
