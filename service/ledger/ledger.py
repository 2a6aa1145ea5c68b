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
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from typing import Any

from alembic.util import CommandError
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from service.errors import ServiceError
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
from service.ledger.exposure_shards import ExposureShards, _NeedsExactCap
from service.ledger.graph_releases import GraphReleases
from service.ledger.graph_versions import GraphVersions
from service.ledger.group_reads import GroupReads, ReceiptOfNewCharge
from service.ledger.idempotency import (
    EarlierCharge,
    bound_charge,
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
    _graph_exhausted,
    _set_spend,
    _shard_total,
    _spent_curve,
    _view,
)
from service.ledger.locked_rows import (
    AdmissionWrites,
    LockedAccount,
    NewCharge,
    lock_all_shards,
)
from service.ledger.read_figures import (
    ReadFigures,
)
from service.ledger.records import (
    Admission,
    BudgetExhausted,
    BudgetView,
    ChargeReceipt,
    ChargeSettled,
    DegreeCharge,
    DegreeReceipt,
    GraphBudgetExhausted,
    GraphCap,
    LedgerNotMigrated,
    ReleaseKey,
    ServiceQuotaExhausted,
)
from service.ledger.reports import (
    Reports,
)
from service.ledger.settlement import Settlement
from service.ledger.stored_releases import StoredReleases
from service.ledger.tables import (
    DEGREE_RELEASE_CHARGE,
    EXPOSURE_SHARDS,
    META_LEDGER_ID,
    Charge,
    LedgerMeta,
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
        self.shards = ExposureShards(self._uow)
        self.graph_releases = GraphReleases(self._uow, self.shards)
        self.settlement = Settlement(self._uow, self.graph_releases)
        self.stored_releases = StoredReleases(self._uow)

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
    graph_release = delegate("graph_releases", GraphReleases.graph_release)
    refund = delegate("settlement", Settlement.refund)
    store_release = delegate("settlement", Settlement.store_release)
    store_releases = delegate("settlement", Settlement.store_releases)
    charge_state = delegate("settlement", Settlement.charge_state)
    reconcile = delegate("settlement", Settlement.reconcile)
    find_release = delegate("stored_releases", StoredReleases.find_release)
    release_for_charge = delegate("stored_releases", StoredReleases.release_for_charge)
    release_for_idempotency_key = delegate(
        "stored_releases", StoredReleases.release_for_idempotency_key
    )
    bind_idempotency_keys = delegate("stored_releases", StoredReleases.bind_idempotency_keys)
    admitted_charges_for_keys = delegate(
        "stored_releases", StoredReleases.admitted_charges_for_keys
    )
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
            lambda curve: self.shards._add_exposure(session, curve, graph_cap, exact_cap, writes),
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
