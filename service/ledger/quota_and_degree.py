"""A service account's 24-hour quota, and the charges for the graph-wide releases an account
receives: a graph version's degree release (``popular``, ``blended``) and a synthetic release
(a sandbox's answers), each once per account."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import ServiceError
from service.ledger.budget_rule import fits_under_cap
from service.ledger.group_reads import GroupReads
from service.ledger.idempotency import PopularQuery, bound_query
from service.ledger.ledger_rows import (
    aware_utc,
    budget_view,
    set_spend,
    spent_curve,
)
from service.ledger.locked_rows import AdmissionWrites, NewCharge
from service.ledger.period_spend import PeriodAdmission, locked_view
from service.ledger.quota_buckets import oldest_freeing, window_sum
from service.ledger.records import (
    DegreeCharge,
    DegreeReceipt,
    IdempotencyKeyReused,
    QuotaWindow,
    ServiceQuotaExhausted,
    SyntheticCharge,
)
from service.ledger.reports import Reports
from service.ledger.tables import (
    DEGREE_RELEASE_CHARGE,
    POPULAR_BINDING,
    SYNTHETIC_RELEASE_CHARGE,
    Charge,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION

#: The rolling window of a service account's spending quota.
QUOTA_WINDOW = timedelta(hours=24)

#: An account's live charge for a degree release (built once: building the statement per
#: call cost more than running it).
_DEGREE_CHARGE_ID = (
    select(Charge.id)
    .where(
        Charge.charged_account_id == bindparam("account_id"),
        Charge.mechanism == DEGREE_RELEASE_CHARGE,
        Charge.graph_version == bindparam("graph_version"),
        Charge.epsilon == bindparam("epsilon"),
        Charge.state != "refunded",
    )
    .order_by(Charge.id)
    .limit(1)
)


class UnknownSyntheticRelease(ServiceError):
    """The synthetic release a sandbox serves is not a live release of this ledger."""

    code = "not_a_synthetic_release"
    status = 422


@dataclass(frozen=True)
class _DegreeAsk:
    """What :meth:`QuotaAndDegree.admit_degree_release` was asked, for each of its attempts."""

    charged_account_id: int
    principal_account_id: int
    seed: str
    mode: str
    degree: DegreeCharge
    request_id: str
    quota_epsilon: float | None
    idempotency_key: str | None

    @property
    def query(self) -> PopularQuery | None:
        """The query an Idempotency-Key binds to (None without a key)."""
        if self.idempotency_key is None:
            return None
        d = self.degree
        return PopularQuery(
            self.charged_account_id, d.graph_version, float(d.epsilon), self.seed, self.mode
        )


def add_degree_charge(
    writes: AdmissionWrites,
    account_id: int,
    principal_id: int,
    seed: str,
    mode: str,
    degree: DegreeCharge,
    request_id: str,
    now: Any,
) -> NewCharge:
    """The account's charge for the version's degree release. It is ``released`` at once
    (the release is stored in ``graph_releases`` before any answer built on it) and never
    refunded; it is not added to an exposure shard (the release is there once already)."""
    curve = degree.curve
    charge = writes.add_charge(
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
    writes.degree_paid.add(degree.paid_key(account_id))
    return charge


def bind_popular(
    writes: AdmissionWrites,
    principal: int,
    idempotency_key: str | None,
    charge: NewCharge | int,
    query: PopularQuery | None,
) -> None:
    """Bind a popular query's Idempotency-Key (if any) to the account's degree charge."""
    if idempotency_key is None or query is None:
        return
    popular = (query.seed, query.mode)
    writes.bind(principal, idempotency_key, charge, POPULAR_BINDING, utcnow(), popular)


class QuotaAndDegree(LedgerPart):
    """The principal's quota check, and each account's one charge per degree release."""

    def __init__(
        self, transactions: LedgerTransactions, reports: Reports, periods: PeriodAdmission
    ) -> None:
        super().__init__(transactions)
        self._reports = reports
        self._periods = periods

    def check_quota(
        self,
        session: Session,
        principal: int,
        quota: float,
        epsilon: float,
        now: Any,
        *,
        writes: AdmissionWrites,
        lock: bool = True,
        windows: dict[int, QuotaWindow] | None = None,
    ) -> None:
        """Refuse when the principal's eps charged to others in the last 24 h would pass its
        quota. Locks the principal's spend row (unless the caller holds it), so the check and
        the charge are atomic.

        The window's sum reads the principal's quota buckets (a minute each) and the charges
        of the one minute the window starts in (:func:`window_sum`), plus what this
        transaction has charged that its buckets do not hold yet (``writes``): a busy backend
        charges hundreds of thousands of queries a day, and a sum over the charges would read
        them all, under this lock. A refusal's ``Retry-After`` reads the same buckets in order,
        and the charges of the minute where enough is freed (:func:`oldest_freeing`).

        ``windows`` (a group's admission, which holds the principal's lock throughout): each
        principal's window as read at its first check in the group, to which the group adds
        what it charges (:meth:`AdmissionRules.admit_locked`), so a group of many queries
        reads it once, not once per query. A charge that leaves the window during the group's
        transaction (milliseconds) still counts in it until the group ends: the check errs
        toward refusing, never toward passing the quota."""
        if lock:
            self._lock_principal(session, principal)
        since = now - QUOTA_WINDOW
        window = None if windows is None else windows.get(principal)
        if window is None:
            window = QuotaWindow(
                window_sum(session, principal, since) + writes.quota_pending(principal)
            )
            if windows is not None:
                windows[principal] = window
        used = window.used
        if fits_under_cap(used + epsilon, quota):
            return
        excess = used + epsilon - quota
        retry_after = window.retry_after.get(excess)
        if retry_after is None:
            retry_after = self._seconds_until_freed(session, principal, since, excess, now)
            window.retry_after[excess] = retry_after
        raise ServiceQuotaExhausted(
            f"this service account has charged {used:.4g} epsilon to other accounts in the "
            f"last 24 hours; its quota is {quota:.4g}. Retry after {math.ceil(retry_after)} s, "
            "or ask an admin to raise the quota",
            retry_after=math.ceil(retry_after),
            details={"used_epsilon": used, "quota_epsilon": quota, "query_epsilon": epsilon},
        )

    @staticmethod
    def _seconds_until_freed(
        session: Session, principal: int, since: Any, excess: float, now: Any
    ) -> float:
        """Seconds until the oldest charges of the window, which together free ``excess``,
        have left it (the whole window where none do: the query alone passes the quota)."""
        oldest = oldest_freeing(session, principal, since, excess)
        if oldest is None:
            return QUOTA_WINDOW.total_seconds()
        expires = aware_utc(oldest) + QUOTA_WINDOW
        return max(1.0, float((expires - now).total_seconds()))

    @staticmethod
    def paid_degree(
        session: Session,
        account_id: int,
        degree: DegreeCharge,
        writes: AdmissionWrites,
        reads: GroupReads | None = None,
    ) -> bool:
        """Whether the account has a live charge for this degree release (read under the
        account's spend lock; the unique index ``uq_charges_degree_release_live`` backs it):
        charged in this transaction, else, in a group, as the group read it under its locks
        (``reads``), else read now."""
        if degree.paid_key(account_id) in writes.degree_paid:
            return True
        if reads is not None:
            return reads.degree_paid(account_id, degree)
        return QuotaAndDegree._degree_charge_id(session, account_id, degree) is not None

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
        idempotency_key: str | None = None,
    ) -> DegreeReceipt:
        """Admit an answer built on the degree release alone (``popular``): free when the
        account has paid for this version's release, else its charge is admitted like any
        (the cap at the account's delta, the principal's quota) and committed, or refused
        with :class:`BudgetExhausted` writing nothing.

        With an ``idempotency_key``, the key is bound in the same transaction (kind
        ``popular``: to the account's charge for this release, with ``seed`` and ``mode``):
        a key bound to this same query already is a replay (``replayed``, nothing charged),
        a key bound to any other query is :class:`IdempotencyKeyReused` (nothing written).
        Of two requests racing with one key, the unique index keeps one binding; the other
        transaction is rolled back and run again, and reads it."""
        if not isinstance(degree.curve, RdpCurve):
            raise TypeError("degree.curve must be an RdpCurve")
        ask = _DegreeAsk(
            charged_account_id, principal_account_id, seed, mode, degree, request_id,
            quota_epsilon, idempotency_key,
        )  # fmt: skip
        attempts = 3
        while True:
            attempts -= 1
            try:
                with self._reports.recording_refusal(
                    charged_account_id, principal_account_id, mode, float(degree.epsilon)
                ):
                    return self._admit_degree_release(ask)
            except IntegrityError:  # a concurrent request bound the key first: read it
                if idempotency_key is None or attempts == 0:
                    raise

    def _admit_degree_release(self, a: _DegreeAsk) -> DegreeReceipt:
        degree, query = a.degree, a.query
        with self._writing() as session:
            account = self._lock_account(session, a.charged_account_id)
            if a.idempotency_key is not None:
                held = bound_query(session, a.principal_account_id, a.idempotency_key)
                if held is not None:
                    if held != query:
                        raise IdempotencyKeyReused()
                    return DegreeReceipt(
                        budget_view(account, account), charged=False, replayed=True,
                        epsilon=float(degree.epsilon),
                    )  # fmt: skip
            writes = AdmissionWrites()
            now = self._periods.now(session, account, utcnow(), writes)
            paid = self._degree_charge_id(session, a.charged_account_id, degree)
            if paid is not None:
                bind_popular(writes, a.principal_account_id, a.idempotency_key, paid, query)
                writes.finish(session)
                return DegreeReceipt(
                    budget_view(account, account), charged=False, epsilon=float(degree.epsilon)
                )
            spent = spent_curve(account)
            composed = spent + degree.curve
            window = self._periods.admit(
                session, account, spent, composed, (degree.curve,), float(degree.epsilon), now,
                writes,
            )  # fmt: skip
            if a.quota_epsilon is not None and a.principal_account_id != a.charged_account_id:
                self.check_quota(
                    session, a.principal_account_id, a.quota_epsilon, float(degree.epsilon), now,
                    writes=writes,
                )  # fmt: skip
            charge = add_degree_charge(
                writes, a.charged_account_id, a.principal_account_id, a.seed, a.mode, degree,
                a.request_id, now,
            )  # fmt: skip
            bind_popular(writes, a.principal_account_id, a.idempotency_key, charge, query)
            set_spend(account, account, composed, account.charges + 1)
            account.last_charge_at = now
            account.period_spent = window
            writes.changed_account(account)
            writes.finish(session)
            return DegreeReceipt(
                locked_view(account, composed), charged=True, epsilon=float(degree.epsilon)
            )

    @staticmethod
    def _degree_charge_id(session: Session, account_id: int, degree: DegreeCharge) -> int | None:
        """The account's live charge for this degree release, if any (under its spend lock)."""
        return session.scalar(
            _DEGREE_CHARGE_ID,
            {
                "account_id": account_id,
                "graph_version": degree.graph_version,
                "epsilon": float(degree.epsilon),
            },
        )

    # -- a synthetic release ------------------------------------------------------------------

    def admit_synthetic_release(
        self,
        *,
        charged_account_id: int,
        principal_account_id: int,
        seed: str,
        mode: str,
        release: SyntheticCharge,
        request_id: str,
        quota_epsilon: float | None = None,
    ) -> DegreeReceipt:
        """Admit a sandbox answer computed from a synthetic release: free when the account has
        paid for this release, else the release's charge (its recorded curve) is admitted like
        any (the cap at the account's delta, the principal's quota) and committed, released
        at once, or refused with :class:`BudgetExhausted` writing nothing.

        The lookup runs under the account's spend-row lock and a partial unique index
        (``uq_charges_synthetic_release_live``) backs it, so concurrent requests on any number
        of workers charge the release once. Like a degree-release charge it is never refunded
        and not added to an exposure shard (the release is counted there once already)."""
        attempts = 3
        while True:
            attempts -= 1
            try:
                # the refusal's epsilon is the release's, read in the transaction
                with self._reports.recording_refusal(
                    charged_account_id, principal_account_id, mode
                ):
                    return self._admit_synthetic_release(
                        charged_account_id, principal_account_id, seed, mode, release,
                        request_id, quota_epsilon,
                    )  # fmt: skip
            except IntegrityError:  # a concurrent transaction charged it first: read it
                if attempts == 0:
                    raise

    def _admit_synthetic_release(
        self,
        charged_account_id: int,
        principal_account_id: int,
        seed: str,
        mode: str,
        release: SyntheticCharge,
        request_id: str,
        quota_epsilon: float | None,
    ) -> DegreeReceipt:
        with self._writing() as session:
            account = self._lock_account(session, charged_account_id)
            row = self._live_graph_release(session, release.graph_version, release.release_name)
            if row is None or row.state != "released":
                raise UnknownSyntheticRelease(
                    f"the synthetic release {release.release_name} is not a released graph "
                    "release of this ledger"
                )
            epsilon = float(row.epsilon)
            paid = session.scalar(
                select(Charge.id)
                .where(
                    Charge.charged_account_id == charged_account_id,
                    Charge.mechanism == SYNTHETIC_RELEASE_CHARGE,
                    Charge.graph_release_id == row.id,
                    Charge.state != "refunded",
                )
                .limit(1)
            )
            if paid is not None:
                return DegreeReceipt(budget_view(account, account), charged=False, epsilon=epsilon)
            curve = RdpCurve.from_json(row.rdp)
            spent = spent_curve(account)
            composed = spent + curve
            writes = AdmissionWrites()
            now = self._periods.now(session, account, utcnow(), writes)
            window = self._periods.admit(
                session, account, spent, composed, (curve,), epsilon, now, writes
            )
            if quota_epsilon is not None and principal_account_id != charged_account_id:
                self.check_quota(
                    session, principal_account_id, quota_epsilon, epsilon, now, writes=writes
                )
            writes.add_charge(
                created_at=now,
                charged_account_id=charged_account_id,
                principal_account_id=principal_account_id,
                seed=seed,
                mechanism=SYNTHETIC_RELEASE_CHARGE,
                mode=mode,
                params={"release": release.release_name, "epsilon": epsilon},
                epsilon=epsilon,
                rdp=curve.to_json(),
                pure_epsilon=curve.pure,
                grid_version=GRID_VERSION,
                graph_version=release.graph_version,
                request_id=request_id,
                idempotency_key=None,
                state="released",
                release_key=None,
                exposure_shard=0,
                graph_release_id=row.id,
            )
            set_spend(account, account, composed, account.charges + 1)
            account.last_charge_at = now
            account.period_spent = window
            writes.changed_account(account)
            writes.finish(session)
            return DegreeReceipt(locked_view(account, composed), charged=True, epsilon=epsilon)
