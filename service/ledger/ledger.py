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

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import timedelta
from typing import Any

import numpy as np
from alembic.util import CommandError
from sqlalchemy import Engine, insert, select, text, tuple_, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from service.errors import InvalidParameter, ServiceError
from service.ledger.accounts import Accounts
from service.ledger.api_keys import ApiKeys
from service.ledger.budgets import Budgets
from service.ledger.database import (
    DEFAULT_PING_IDLE_SECONDS,
    LedgerGridMismatch,
    check_migrated,
    make_engine,
    upgrade_engine,
)
from service.ledger.delegate import delegate
from service.ledger.graph_versions import GraphVersions
from service.ledger.group_reads import GroupReads, ReceiptOfNewCharge
from service.ledger.idempotency import (
    EarlierCharge,
    bound_charge,
    bound_charges,
    free_bindings,
    insert_unless_bound,
)
from service.ledger.ledger_rows import (
    ADMISSION_RTOL as ADMISSION_RTOL,
)
from service.ledger.ledger_rows import (
    MODES as MODES,
)
from service.ledger.ledger_rows import (
    _add_to_shard,
    _aware,
    _charge_record,
    _graph_exhausted,
    _release_record,
    _release_values,
    _remove_from_shard,
    _set_spend,
    _shard_total,
    _spent_curve,
    _view,
)
from service.ledger.locked_rows import (
    CHARGES,
    RELEASES,
    AdmissionWrites,
    LockedAccount,
    NewCharge,
    lock_all_shards,
    other_shards,
    settle,
)
from service.ledger.read_figures import (
    ReadFigures,
)
from service.ledger.records import (
    Admission,
    BudgetExhausted,
    BudgetView,
    ChargeReceipt,
    ChargeRecord,
    ChargeSettled,
    DegreeCharge,
    DegreeReceipt,
    GraphBudgetExhausted,
    GraphCap,
    LedgerNotMigrated,
    ReleaseKey,
    ServiceQuotaExhausted,
    StoredRelease,
)
from service.ledger.reports import (
    Reports,
)
from service.ledger.tables import (
    DEGREE_RELEASE_CHARGE,
    EXPOSURE_SHARDS,
    META_LEDGER_ID,
    Charge,
    GraphRelease,
    IdempotencyBinding,
    LedgerMeta,
    Refund,
    Release,
    Spend,
    utcnow,
)
from service.ledger.unit_of_work import (
    AccountExists as AccountExists,
)
from service.ledger.unit_of_work import (
    LedgerPart,
    UnitOfWork,
)
from service.ledger.unit_of_work import (
    LedgerUnavailable as LedgerUnavailable,
)
from service.ledger.unit_of_work import (
    UnknownApiKey as UnknownApiKey,
)
from service.ledger.unit_of_work import (
    UnknownCharge as UnknownCharge,
)
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION

#: The rolling window of a service account's spending quota.
QUOTA_WINDOW = timedelta(hours=24)

#: A charge whose twin waits on it but which is older than this is settled by the waiter.
DEFAULT_STALE_AFTER_SECONDS = 60.0


log = logging.getLogger(__name__)


# --- validation and conversion ----------------------------------------------------------------


class Ledger(LedgerPart):
    """The ledger on one database. Thread-safe: every call uses its own session and pool slot."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(UnitOfWork(engine))
        self._engine = engine
        self._write_engine = self._uow.write_engine
        self._sqlite = self._uow.sqlite
        self.reports = Reports(self._uow)
        self.read_figures = ReadFigures(self._uow)
        self._ledger_id: str | None = None
        self.api_keys = ApiKeys(self._uow)
        self.accounts = Accounts(self._uow)
        self.budgets = Budgets(self._uow, self.api_keys)
        self.graph_versions = GraphVersions(self._uow)

    # --- the parts' methods, by their old names --------------------------------------------

    create_api_key = delegate("api_keys", ApiKeys.create_api_key)
    authenticate_cached = delegate("api_keys", ApiKeys.authenticate_cached)
    recent_authentication = delegate("api_keys", ApiKeys.recent_authentication)
    authenticate = delegate("api_keys", ApiKeys.authenticate)
    revoke_api_key = delegate("api_keys", ApiKeys.revoke_api_key)
    list_api_keys = delegate("api_keys", ApiKeys.list_api_keys)
    create_account = delegate("accounts", Accounts.create_account)
    get_account = delegate("accounts", Accounts.get_account)
    list_accounts = delegate("accounts", Accounts.list_accounts)
    account_for_node = delegate("accounts", Accounts.account_for_node)
    user_account_for_node = delegate("accounts", Accounts.user_account_for_node)
    budget = delegate("budgets", Budgets.budget)
    account_delta = delegate("budgets", Budgets.account_delta)
    set_budget = delegate("budgets", Budgets.set_budget)
    set_scopes = delegate("budgets", Budgets.set_scopes)
    current_graph_version = delegate("graph_versions", GraphVersions.current_graph_version)
    current_graph_path = delegate("graph_versions", GraphVersions.current_graph_path)
    current_graph_configuration = delegate(
        "graph_versions", GraphVersions.current_graph_configuration
    )
    set_current_graph_version = delegate("graph_versions", GraphVersions.set_current_graph_version)
    public_graph_version = delegate("graph_versions", GraphVersions.public_graph_version)
    graph_fingerprint_of = delegate("graph_versions", GraphVersions.graph_fingerprint_of)
    verify = delegate("reports", Reports.verify)
    exposure = delegate("reports", Reports.exposure)
    smallest_delta = delegate("reports", Reports.smallest_delta)
    list_charges = delegate("reports", Reports.list_charges)
    count_charges = delegate("reports", Reports.count_charges)
    record_audit = delegate("reports", Reports.record_audit)
    record_refusal = delegate("reports", Reports.record_refusal)
    list_audit = delegate("reports", Reports.list_audit)
    record_reads = delegate("read_figures", ReadFigures.record_reads)
    read_view = delegate("read_figures", ReadFigures.read_view)

    # --- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        auto_migrate: bool = False,
        ping_idle_seconds: float = DEFAULT_PING_IDLE_SECONDS,
    ) -> Ledger:
        """Open the ledger at ``url``; refuse a database that is not at the migrations' head.

        With ``auto_migrate`` an out-of-date database is migrated first. A database whose
        curves are on another order grid is always refused (that needs a migration).
        """
        engine = make_engine(url, ping_idle_seconds=ping_idle_seconds)
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
        release_key: ReleaseKey | None = None,
        quota_epsilon: float | None = None,
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
        return self.admit(
            Admission(
                charged_account_id=charged_account_id,
                principal_account_id=principal_account_id,
                seed=seed,
                mechanism=mechanism,
                mode=mode,
                params=params,
                query_curve=query_curve,
                query_epsilon=query_epsilon,
                graph_version=graph_version,
                request_id=request_id,
                idempotency_key=idempotency_key,
                release_key=release_key,
                quota_epsilon=quota_epsilon,
            ),
            graph_cap=graph_cap,
            stale_after_seconds=stale_after_seconds,
        )

    def admit(
        self,
        a: Admission,
        *,
        graph_cap: GraphCap | None = None,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
    ) -> ChargeReceipt:
        """:meth:`admit_and_charge` for a query given as an :class:`Admission`."""
        if not isinstance(a.query_curve, RdpCurve):
            raise TypeError("query_curve must be an RdpCurve")
        exact_cap = False
        while True:
            try:
                with self._writing() as session:
                    return self._admit(session, a, graph_cap, exact_cap, stale_after_seconds)
            except _NeedsExactCap:
                exact_cap = True  # rolled back: start again, locking every shard
            except _StaleTwin as stale:
                self._reconcile_stale_twin(stale)  # rolled back: refund it, then start again
            except (BudgetExhausted, ServiceQuotaExhausted, GraphBudgetExhausted) as refusal:
                self._record_refused(a, refusal)
                raise
            except IntegrityError:
                # A concurrent request with the same idempotency key bound it first.
                if a.idempotency_key is None:
                    raise
                with self._reading() as session:
                    earlier = bound_charge(session, a.principal_account_id, a.idempotency_key)
                    if earlier is None:
                        raise
                    return self._reused(session, earlier)

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
        outcome = self._admit_locked(
            session,
            a,
            account,
            lambda curve: self._add_exposure(session, curve, graph_cap, exact_cap, writes),
            stale_after_seconds,
            writes,
        )
        if isinstance(outcome, ChargeReceipt):
            writes.finish(session)  # the key it bound, if any
            return outcome
        assert isinstance(outcome, tuple)  # alone, no charge of a group answers it
        charge, view = outcome
        writes.finish(session)
        return ChargeReceipt(charge_id=charge.id, budget=view, degree_epsilon=charge.degree_epsilon)

    def _admit_locked(
        self,
        session: Session,
        a: Admission,
        account: LockedAccount,
        add_exposure: Callable[[RdpCurve], int],
        stale_after_seconds: float,
        writes: AdmissionWrites,
        principal_locked: bool = False,
        reads: GroupReads | None = None,
    ) -> ChargeReceipt | ReceiptOfNewCharge | tuple[NewCharge, BudgetView]:
        """Admission of ``a`` under its charged account's spend lock (``account``, held):
        a receipt when an earlier charge answers it (``reused`` / ``joined``), else the new
        charge (added to ``writes``, not yet written) and the budget after it.

        In a group, ``reads`` holds what the group's queries look for (read once, under the
        group's locks) and learns the charges the group adds; alone, each is read here.
        A refusal raises before anything is written, so a group transaction may go on with
        the next query after one is refused.
        """
        query_curve = a.query_curve
        if not isinstance(query_curve, RdpCurve):
            raise TypeError("query_curve must be an RdpCurve")
        quota = a.quota_epsilon is not None and a.principal_account_id != a.charged_account_id
        reads_charges = quota or (
            reads is None and (a.idempotency_key is not None or a.release_key is not None)
        )
        if reads_charges:
            writes.write_charges(session)  # the charges this transaction added must be visible
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
        if degree is not None and self._paid_degree(session, a.charged_account_id, degree, writes):
            degree = None
        spent = _spent_curve(account)
        composed = spent + query_curve
        epsilon = float(a.query_epsilon)
        if degree is not None:  # composed with the query's curve, admitted as one
            composed = composed + degree.curve
            epsilon += float(degree.epsilon)
        if composed.epsilon(account.delta) > account.cap_epsilon * (1.0 - ADMISSION_RTOL):
            raise BudgetExhausted(_view(account, account, spent), epsilon)
        now = utcnow()
        if a.quota_epsilon is not None and a.principal_account_id != a.charged_account_id:
            self._check_quota(
                session, a.principal_account_id, a.quota_epsilon, epsilon, now,
                lock=not principal_locked,
            )  # fmt: skip
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
            self._add_degree_charge(
                writes, a.charged_account_id, a.principal_account_id, a.seed, a.mode, degree,
                a.request_id, now,
            )  # fmt: skip
            charges += 1
        if a.idempotency_key is not None:
            writes.bind(a.principal_account_id, a.idempotency_key, charge, "charged", now)
            if reads is not None:
                reads.bound(a.principal_account_id, a.idempotency_key, charge)
        _set_spend(account, account, composed, charges)
        account.last_charge_at = now
        writes.changed_account(account)
        if reads is not None:
            reads.added(charge, a, digest)
        return charge, _view(account, account, composed)

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
            self.record_refusal(
                refusal.code,
                charged_account_id=charged_account_id,
                principal_account_id=principal_account_id,
                mode=mode,
                epsilon=float(degree.epsilon),
            )
            raise

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
                return self._reused(session, earlier, writes)
        if a.release_key is not None and digest is not None:
            twin = self._twin(session, a.charged_account_id, digest, stale_after_seconds)
            if twin is None:
                released = self._release_row(session, a.release_key)
                twin = None if released is None else released.charge_id
            if twin is not None:
                self._bind_joined(a, twin, a.charged_account_id, writes)
                return ChargeReceipt(charge_id=twin, budget=_view(account, account), joined=True)
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
                return ReceiptOfNewCharge(holder, _view(locked, locked), reused=True)
            if holder is not None:
                return self._reused(session, holder, writes)
        if a.release_key is not None and digest is not None:
            new_twin = reads.new_twin(a.charged_account_id, digest)
            if new_twin is not None:
                self._bind_joined(a, new_twin, a.charged_account_id, writes, reads)
                return ReceiptOfNewCharge(new_twin, _view(account, account), joined=True)
            twin = reads.twin(a.charged_account_id, digest)
            if twin is not None:
                _refuse_stale_twin(twin.id, twin.created_at, stale_after_seconds)
                self._bind_joined(a, twin.id, a.charged_account_id, writes, reads)
                return ChargeReceipt(charge_id=twin.id, budget=_view(account, account), joined=True)
            released = reads.released(a.release_key)
            if released is not None:
                self._bind_joined(a, released, a.charged_account_id, writes, reads)
                view = _view(account, account)
                return ChargeReceipt(charge_id=released, budget=view, joined=True)
        return None

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
            except _StaleTwin as stale:
                self._reconcile_stale_twin(stale)  # rolled back: refund it, then start again
                continue
            break
        for a, result in zip(admissions, results, strict=True):
            if isinstance(result, (BudgetExhausted, ServiceQuotaExhausted, GraphBudgetExhausted)):
                self._record_refused(a, result)
        return results

    def _record_refused(self, a: Admission, refusal: ServiceError) -> None:
        """The refusal of admission ``a`` in the refusals table (its own transaction)."""
        self.record_refusal(
            refusal.code,
            charged_account_id=a.charged_account_id,
            principal_account_id=a.principal_account_id,
            mode=a.mode,
            epsilon=a.query_epsilon,
        )

    def _admit_group_once(
        self, admissions: list[Admission], graph_cap: GraphCap | None, stale_after_seconds: float
    ) -> list[ChargeReceipt | ServiceError]:
        with self._writing() as session:
            writes = AdmissionWrites()
            outcomes = self._admit_group(
                session, admissions, graph_cap, stale_after_seconds, writes
            )
            writes.finish(session)  # the charges' ids, the spend and the shards
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
            return self.admit(a, graph_cap=graph_cap, stale_after_seconds=stale_after_seconds)
        except (BudgetExhausted, ServiceQuotaExhausted, GraphBudgetExhausted) as refusal:
            return refusal

    def _admit_group(
        self,
        session: Session,
        admissions: list[Admission],
        graph_cap: GraphCap | None,
        stale_after_seconds: float,
        writes: AdmissionWrites,
    ) -> list[ChargeReceipt | ServiceError | ReceiptOfNewCharge | tuple[NewCharge, BudgetView]]:
        charged = sorted({a.charged_account_id for a in admissions})
        accounts = {account: self._lock_account(session, account) for account in charged}
        principals = sorted(
            {
                a.principal_account_id
                for a in admissions
                if a.quota_epsilon is not None and a.principal_account_id != a.charged_account_id
            }
            - set(charged)
        )
        for principal in principals:
            self._lock_principal(session, principal)
        # Every principal whose quota is checked is now locked (as a charged or a principal row).
        if graph_cap is None:
            shard_row = self._locked_shard(session, random.randrange(EXPOSURE_SHARDS))

            def add_exposure(curve: RdpCurve) -> int:
                _add_to_shard(shard_row, curve)
                writes.changed_shard(shard_row)
                return shard_row.shard
        else:
            cap = graph_cap
            rows = lock_all_shards(session)
            target = rows[random.randrange(len(rows))]

            def add_exposure(curve: RdpCurve) -> int:
                total = _shard_total(rows) + curve
                if total.epsilon(cap.delta) > cap.cap_epsilon * (1.0 - ADMISSION_RTOL):
                    raise _graph_exhausted(cap, _shard_total(rows))
                _add_to_shard(target, curve)
                writes.changed_shard(target)
                return target.shard

        # What the queries look for (keys, twins, releases), read once for the group under
        # its locks; one INSERT batch at the end instead of one per query (_admit_locked
        # writes the charges added so far only before a quota check, which must see them).
        reads = GroupReads.read(session, admissions)
        outcomes: list[
            ChargeReceipt | ServiceError | ReceiptOfNewCharge | tuple[NewCharge, BudgetView]
        ] = []
        for a in admissions:
            try:
                outcome = self._admit_locked(
                    session, a, accounts[a.charged_account_id], add_exposure,
                    stale_after_seconds, writes, principal_locked=True, reads=reads,
                )  # fmt: skip
            except (BudgetExhausted, ServiceQuotaExhausted, GraphBudgetExhausted) as refusal:
                outcomes.append(refusal)
                continue
            outcomes.append(outcome)
        return outcomes

    def _twin(
        self, session: Session, account_id: int, digest: str, stale_after_seconds: float
    ) -> int | None:
        """The in-flight charge of an identical query, if any (a stale one is reconciled)."""
        row = session.scalars(
            select(Charge)
            .where(
                Charge.charged_account_id == account_id,
                Charge.release_key == digest,
                Charge.state == "admitted",
            )
            .order_by(Charge.id.desc())
            .limit(1)
        ).one_or_none()
        if row is None:
            return None
        _refuse_stale_twin(row.id, row.created_at, stale_after_seconds)
        return row.id

    def _reconcile_stale_twin(self, stale: _StaleTwin) -> None:
        """Refund an in-flight twin that outlived ``stale_after_seconds`` without a release
        (its worker died between charge and answer), in its own transaction. If it was
        released meanwhile, the admission that starts again joins its release."""
        with suppress(ChargeSettled):
            self.refund(
                stale.charge_id, reason=f"reconciled: no release {stale.age:.0f} s after admission"
            )

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

    def _add_exposure(
        self,
        session: Session,
        curve: RdpCurve,
        cap: GraphCap | None,
        exact: bool,
        writes: AdmissionWrites,
    ) -> int:
        """Add ``curve`` to one exposure shard (returned), checking the graph-wide cap.

        Fast path: lock one shard, read all shards, admit if the total plus this curve plus
        ``EXPOSURE_SHARDS - 1`` copies of ``cap.max_charge`` (the most the other shards' lock
        holders can add concurrently, each having passed the same check) stays within the cap.
        Otherwise :class:`_NeedsExactCap` rolls the transaction back and it is retried locking
        every shard in ascending order, which reads the exact total.
        """
        if cap is None:
            row = self._locked_shard(session, random.randrange(EXPOSURE_SHARDS))
        elif exact:
            rows = lock_all_shards(session)
            total = _shard_total(rows) + curve
            if total.epsilon(cap.delta) > cap.cap_epsilon * (1.0 - ADMISSION_RTOL):
                raise _graph_exhausted(cap, _shard_total(rows))
            row = rows[random.randrange(len(rows))]
        else:
            shard = random.randrange(EXPOSURE_SHARDS)
            row = self._locked_shard(session, shard)
            within = bool(np.all(curve.rdp <= cap.max_charge.rdp))
            if not within or curve.pure > cap.max_charge.pure:
                raise _NeedsExactCap()
            total = _shard_total([row, *other_shards(session, shard)]) + curve
            margin = cap.max_charge * (EXPOSURE_SHARDS - 1)
            if (total + margin).epsilon(cap.delta) > cap.cap_epsilon * (1.0 - ADMISSION_RTOL):
                raise _NeedsExactCap()
        _add_to_shard(row, curve)
        writes.changed_shard(row)
        return row.shard

    def _reused(
        self,
        session: Session,
        charge: EarlierCharge,
        writes: AdmissionWrites | None = None,
    ) -> ChargeReceipt:
        locked = None if writes is None else writes.account(charge.charged_account_id)
        if locked is not None:
            # the spend as this transaction left it (a group may have charged it already)
            return ChargeReceipt(charge_id=charge.id, budget=_view(locked, locked), reused=True)
        budget = self._budget_row(session, charge.charged_account_id)
        spend = session.get(Spend, charge.charged_account_id)
        assert spend is not None
        return ChargeReceipt(charge_id=charge.id, budget=_view(budget, spend), reused=True)

    # --- settling a charge: released or refunded, exactly once ---------------------------------

    def refund(
        self, charge_id: int, *, reason: str, actor_account_id: int | None = None
    ) -> BudgetView:
        """Compensate a charge whose noise was provably never released (idempotent).

        Only an ``admitted`` charge can be refunded; refunding a released one raises
        :class:`ChargeSettled` (its answer may have left the process).
        """
        with self._writing() as session:
            charge = session.get(Charge, charge_id)
            if charge is None:
                raise UnknownCharge(
                    f"charge {charge_id} does not exist", details={"charge_id": charge_id}
                )
            account_id = charge.charged_account_id
            spend = self._lock_spend(session, account_id)
            budget = self._budget_row(session, account_id)
            session.refresh(charge)
            if charge.state == "refunded":
                return _view(budget, spend)
            if charge.state == "released":
                raise ChargeSettled(
                    f"charge {charge_id} was released: it cannot be refunded",
                    details={"charge_id": charge_id},
                )
            return self._refund_in(session, charge, reason=reason, actor=actor_account_id)

    def _refund_in(
        self, session: Session, charge: Charge, *, reason: str, actor: int | None
    ) -> BudgetView:
        """Refund an admitted charge inside a transaction that holds its account's spend lock.

        The state moves ``admitted -> refunded`` only if still admitted (so a concurrent
        release and a refund can never both win); the spend is recomputed as the left fold of
        the live charges, and the charge's curve leaves its exposure shard (rounded up).
        """
        account_id = charge.charged_account_id
        now = utcnow()
        moved = settle(session, charge.id, "refunded", now)
        spend = self._lock_spend(session, account_id)
        budget = self._budget_row(session, account_id)
        if moved != 1:
            session.refresh(charge)
            if charge.state == "released":
                raise ChargeSettled(
                    f"charge {charge.id} was released: it cannot be refunded",
                    details={"charge_id": charge.id},
                )
            return _view(budget, spend)
        session.add(Refund(charge_id=charge.id, created_at=now, reason=reason))
        free_bindings(session, charge.id, now)  # nothing was released under those keys
        curves: list[dict[str, Any]] = list(
            session.scalars(
                select(Charge.rdp)
                .where(Charge.charged_account_id == account_id, Charge.state != "refunded")
                .order_by(Charge.id)
            )
        )
        total = RdpCurve.zero()
        for data in curves:
            total = total + RdpCurve.from_json(data)
        _set_spend(spend, budget, total, len(curves))
        shard = self._lock_shard(session, charge.exposure_shard)
        _remove_from_shard(shard, RdpCurve.from_json(charge.rdp))
        self._audit(
            session,
            "charge.refund",
            actor=actor,
            target=account_id,
            details={"charge_id": charge.id, "reason": reason, "epsilon": charge.epsilon},
        )
        session.flush()
        return _view(budget, spend, total)

    def store_release(
        self,
        release: StoredRelease,
        *,
        idempotency_key: str | None,
        principal_account_id: int,
    ) -> None:
        """Store a released answer and mark its charge ``released``, in one transaction.

        This must commit before the answer leaves the process. Storing the same charge twice is
        a no-op; a charge already refunded (e.g. reconciled) raises :class:`ChargeSettled`, and
        the answer must then be discarded, never sent.
        """
        with self._writing() as session:
            now = utcnow()
            moved = settle(session, release.charge_id, "released", now)
            if moved != 1:
                state = session.scalar(select(Charge.state).where(Charge.id == release.charge_id))
                if state == "released":
                    return
                raise ChargeSettled(
                    f"charge {release.charge_id} is {state or 'missing'}: its answer is discarded",
                    details={"charge_id": release.charge_id, "state": state},
                )
            session.execute(
                insert(RELEASES),
                [_release_values(release, idempotency_key, principal_account_id, now)],
            )

    def store_releases(
        self, releases: Sequence[tuple[StoredRelease, str | None, int]]
    ) -> list[ChargeSettled | None]:
        """Store many released answers, each with its idempotency key and principal, and mark
        their charges ``released``, in ONE transaction: per release None (stored, or stored
        before) or :class:`ChargeSettled` (its charge was refunded: discard that answer).

        As :meth:`store_release` for each, and it must commit before any of them is answered.
        """
        if not releases:
            return []
        ids = [release.charge_id for release, _, _ in releases]
        with self._writing() as session:
            now = utcnow()
            moved = set(
                session.scalars(
                    update(CHARGES)
                    .where(CHARGES.c.id.in_(ids), CHARGES.c.state == "admitted")
                    .values(state="released", settled_at=now)
                    .returning(CHARGES.c.id)
                )
            )
            others = [charge_id for charge_id in ids if charge_id not in moved]
            states: dict[int, str] = {}
            if others:
                rows = session.execute(
                    select(CHARGES.c.id, CHARGES.c.state).where(CHARGES.c.id.in_(others))
                )
                states = {int(row.id): str(row.state) for row in rows}
            outcomes: list[ChargeSettled | None] = []
            stored: set[int] = set()
            new_rows: list[dict[str, Any]] = []
            for release, idempotency_key, principal in releases:
                if release.charge_id in stored:  # listed twice: stored once, by the first
                    outcomes.append(None)
                    continue
                if release.charge_id not in moved:
                    state = states.get(release.charge_id)
                    outcomes.append(
                        None if state == "released" else ChargeSettled(
                            f"charge {release.charge_id} is {state or 'missing'}: its answer "
                            "is discarded",
                            details={"charge_id": release.charge_id, "state": state},
                        )
                    )  # fmt: skip
                    continue
                stored.add(release.charge_id)
                new_rows.append(_release_values(release, idempotency_key, principal, now))
                outcomes.append(None)
            if new_rows:  # one multi-row INSERT, through Core: no ORM object per release
                session.execute(insert(RELEASES), new_rows)
        return outcomes

    def charge_state(self, charge_id: int) -> str:
        with self._reading() as session:
            state = session.scalar(select(Charge.state).where(Charge.id == charge_id))
        if state is None:
            raise UnknownCharge(
                f"charge {charge_id} does not exist", details={"charge_id": charge_id}
            )
        return str(state)

    def reconcile(
        self, *, older_than_seconds: float, actor_account_id: int | None = None
    ) -> list[int]:
        """Refund every charge still ``admitted`` (no release stored) that is older than the
        limit, with an audit row each, and settle graph-wide releases left without a payload.

        Sound because an answer leaves the process only after its release is stored, and a
        release can no longer be stored once its charge is refunded. Returns the refunded ids.
        """
        if not (math.isfinite(older_than_seconds) and older_than_seconds >= 0):
            raise InvalidParameter("older_than", f"must be >= 0 seconds, got {older_than_seconds}")
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        with self._reading() as session:
            ids = list(
                session.scalars(
                    select(Charge.id)
                    .where(Charge.state == "admitted", Charge.created_at < cutoff)
                    .order_by(Charge.id)
                )
            )
        refunded: list[int] = []
        for charge_id in ids:
            with self._writing() as session:
                charge = session.get(Charge, charge_id)
                assert charge is not None
                self._lock_spend(session, charge.charged_account_id)
                session.refresh(charge)
                if charge.state != "admitted":
                    continue
                self._refund_in(
                    session,
                    charge,
                    reason=f"reconciled: no release stored within {older_than_seconds:g} s",
                    actor=actor_account_id,
                )
                refunded.append(charge_id)
        self._reconcile_graph_releases(cutoff)
        return refunded

    # --- graph-wide releases -------------------------------------------------------------------

    def graph_release(
        self,
        graph_version: str,
        mechanism: str,
        *,
        epsilon: float,
        curve: RdpCurve,
        draw: Callable[[], bytes],
        wait_seconds: float = 30.0,
        cap: GraphCap | None = None,
    ) -> bytes:
        """The single release of ``mechanism`` about graph ``graph_version`` (e.g. noisy degrees).

        The first caller, in any process, commits its charge to the graph-wide exposure, then
        calls ``draw()`` and stores the bytes; every other caller gets those same bytes. If the
        drawing process died before storing, the release is reconciled (refunded) after
        ``wait_seconds`` and the next caller draws anew. With a graph-wide ``cap``, a release
        that would pass it is refused (:class:`GraphBudgetExhausted`) and nothing is drawn.
        """
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._reading() as session:
                row = self._live_graph_release(session, graph_version, mechanism)
                if row is not None and row.state == "released" and row.payload is not None:
                    return bytes(row.payload)
            if row is None:
                release_id = self._admit_graph_release(
                    graph_version, mechanism, epsilon, curve, cap
                )
                if release_id is not None:
                    try:
                        payload = draw()
                    except BaseException:
                        self._settle_graph_release(release_id, None)  # nothing was drawn/kept
                        raise
                    self._settle_graph_release(release_id, payload)
                    return payload
                continue  # a twin won the insert: read its release
            if time.monotonic() > deadline:
                self._reconcile_graph_releases(utcnow() - timedelta(seconds=wait_seconds))
                deadline = time.monotonic() + wait_seconds
            time.sleep(0.05)

    def _admit_graph_release(
        self, version: str, mechanism: str, epsilon: float, curve: RdpCurve, cap: GraphCap | None
    ) -> int | None:
        try:
            with self._writing() as session:
                # a one-time release: the exact cap check (every shard locked) is cheap enough
                writes = AdmissionWrites()
                shard = self._add_exposure(session, curve, cap, cap is not None, writes)
                writes.finish(session)
                row = GraphRelease(
                    graph_version=version,
                    mechanism=mechanism,
                    epsilon=float(epsilon),
                    rdp=curve.to_json(),
                    pure_epsilon=curve.pure,
                    state="admitted",
                    exposure_shard=shard,
                    created_at=utcnow(),
                )
                session.add(row)
                self._audit(
                    session, "graph_release.admit", actor=None, target=None,
                    details={"graph_version": version, "mechanism": mechanism, "epsilon": epsilon},
                )  # fmt: skip
                session.flush()
                return row.id
        except IntegrityError:
            return None

    def _settle_graph_release(self, release_id: int, payload: bytes | None) -> None:
        with self._writing() as session:
            row = session.get(GraphRelease, release_id)
            assert row is not None
            if row.state != "admitted":
                raise ChargeSettled(
                    f"graph release {release_id} is {row.state}", details={"id": release_id}
                )
            row.settled_at = utcnow()
            if payload is None:
                row.state = "refunded"
                _remove_from_shard(
                    self._lock_shard(session, row.exposure_shard), RdpCurve.from_json(row.rdp)
                )
            else:
                row.state = "released"
                row.payload = payload

    def _reconcile_graph_releases(self, cutoff: Any) -> None:
        with self._reading() as session:
            ids = list(
                session.scalars(
                    select(GraphRelease.id).where(
                        GraphRelease.state == "admitted", GraphRelease.created_at < cutoff
                    )
                )
            )
        for release_id in ids:
            try:
                self._settle_graph_release(release_id, None)
            except ChargeSettled:
                continue

    # --- reading charges, releases and the audit log -------------------------------------------

    def find_release(self, key: ReleaseKey) -> StoredRelease | None:
        """The newest release for ``key`` (epsilon compared exactly)."""
        with self._reading() as session:
            row = self._release_row(session, key)
            return None if row is None else _release_record(row)

    def release_for_charge(self, charge_id: int) -> StoredRelease | None:
        with self._reading() as session:
            row = session.get(Release, charge_id)
            return None if row is None else _release_record(row)

    def release_for_idempotency_key(
        self, principal_account_id: int, idempotency_key: str
    ) -> StoredRelease | None:
        """The release the key is bound to, once stored (None: the key is free, or bound to a
        charge still in flight)."""
        stmt = (
            select(Release)
            .join(IdempotencyBinding, IdempotencyBinding.charge_id == Release.charge_id)
            .join(Charge, Charge.id == Release.charge_id)
            .where(
                IdempotencyBinding.principal_account_id == principal_account_id,
                IdempotencyBinding.idempotency_key == idempotency_key,
                IdempotencyBinding.freed_at.is_(None),
                Charge.state == "released",
            )
        )
        with self._reading() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else _release_record(row)

    def bind_idempotency_keys(self, bindings: Sequence[tuple[int, str, int]]) -> list[int]:
        """Bind each ``(principal, idempotency key)`` to the released charge given, unless the
        key is bound already, in ONE transaction; per binding the charge the key is bound to
        after it: the one given, or the charge an earlier (or concurrent) request bound it to.

        For a keyed query answered from a stored release before admission: the release it
        returns must be the one the key is bound to. Only charges already ``released`` may be
        given (a stored release's), so the binding is permanent."""
        if not bindings:
            return []
        with self._writing() as session:
            now = utcnow()
            session.execute(
                insert_unless_bound(self._sqlite),
                [
                    {
                        "principal_account_id": principal, "idempotency_key": key,
                        "charge_id": charge_id, "kind": "replayed", "created_at": now,
                    }
                    for principal, key, charge_id in bindings
                ],
            )  # fmt: skip
            bound = bound_charges(session, {(p, k) for p, k, _ in bindings})
        return [bound[(principal, key)].id for principal, key, _ in bindings]

    def admitted_charges_for_keys(self, keys: list[tuple[int, str]]) -> list[ChargeRecord]:
        """The charges still ``admitted`` (no release stored) under any of the
        ``(principal_account_id, idempotency_key)`` pairs, oldest first.

        A batch job calls it for the seeds of a block whose previous attempt ended (its worker
        died, or the attempt failed): those charges can no longer be released by anyone, so
        they may be refunded.
        """
        if not keys:
            return []
        pairs = list(dict.fromkeys((int(p), str(k)) for p, k in keys))
        records: list[ChargeRecord] = []
        with self._reading() as session:
            for start in range(0, len(pairs), 500):
                chunk = pairs[start : start + 500]
                rows = session.scalars(
                    select(Charge)
                    .where(
                        tuple_(Charge.principal_account_id, Charge.idempotency_key).in_(chunk),
                        Charge.state == "admitted",
                    )
                    .order_by(Charge.id)
                )
                records.extend(_charge_record(row, False) for row in rows)
        return records


class _NeedsExactCap(Exception):
    """Internal: the fast graph-cap check could not admit; retry locking every shard."""


class _StaleTwin(Exception):
    """Internal: an identical query's charge is still ``admitted`` past the stale bound;
    roll back, refund it on its own, and admit again."""

    def __init__(self, charge_id: int, age: float) -> None:
        super().__init__(charge_id, age)
        self.charge_id = charge_id
        self.age = age


def _refuse_stale_twin(charge_id: int, created_at: Any, stale_after_seconds: float) -> None:
    """Raise :class:`_StaleTwin` for an in-flight twin admitted longer ago than the bound.

    It is refunded in a transaction of its own (:meth:`Ledger._reconcile_stale_twin`), then
    the admission starts again: refunding here would lock the twin's exposure shard after
    this admission's own, out of ascending order."""
    age = (utcnow() - _aware(created_at)).total_seconds()
    if age > stale_after_seconds:
        raise _StaleTwin(charge_id, age)
