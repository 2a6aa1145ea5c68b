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

:class:`Ledger` holds the parts, each owning one concern and its SQL, sharing the ledger's
engines (``transactions``: one transaction per call): accounts, API keys with the
authentication cache, budgets and scopes, admission (``admission``, ``admission_rules``,
``quota_and_degree``, ``exposure_shards``), settlement, stored releases and idempotency
bindings, graph-wide releases, graph versions, reports and read figures. Callers use the part
they need, by its one name: ``ledger.accounts.create_account(...)``,
``ledger.admission.admit_and_charge(...)``, ``ledger.budgets.budget(...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, text
from sqlalchemy.exc import InterfaceError, OperationalError

from service.bounds import AccountType
from service.ledger.accounts import Accounts
from service.ledger.admission import DEFAULT_STALE_AFTER_SECONDS as DEFAULT_STALE_AFTER_SECONDS
from service.ledger.admission import Admissions
from service.ledger.admission_rules import AdmissionRules
from service.ledger.api_keys import ApiKeys
from service.ledger.budgets import Budgets
from service.ledger.database import (
    DEFAULT_PING_IDLE_SECONDS,
    LedgerGridMismatch,
    check_migrated,
    make_engine,
    upgrade_engine,
)
from service.ledger.embedding_salts import EmbeddingSalts
from service.ledger.exposure_shards import ExposureShards
from service.ledger.graph_releases import GraphReleases
from service.ledger.graph_versions import GraphVersions
from service.ledger.ledger_rows import MODES as MODES
from service.ledger.period_spend import PeriodAdmission
from service.ledger.quota_and_degree import QUOTA_WINDOW as QUOTA_WINDOW
from service.ledger.quota_and_degree import QuotaAndDegree
from service.ledger.read_figures import ReadFigures
from service.ledger.records import LedgerNotMigrated, OpenedAccount
from service.ledger.reports import Reports
from service.ledger.settlement import Settlement
from service.ledger.stored_releases import StoredReleases
from service.ledger.synthesis_jobs import SynthesisJobs
from service.ledger.tables import (
    META_LEDGER_ID,
    LedgerMeta,
)
from service.ledger.transactions import AccountExists as AccountExists
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
)
from service.ledger.transactions import LedgerUnavailable as LedgerUnavailable
from service.ledger.transactions import UnknownApiKey as UnknownApiKey
from service.ledger.transactions import UnknownCharge as UnknownCharge
from service.settings.mechanism import MechanismSettings

# --- validation and conversion ----------------------------------------------------------------


class Ledger(LedgerPart):
    """The ledger on one database. Thread-safe: every call uses its own session and pool slot."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(LedgerTransactions(engine))
        self._engine = engine
        self._write_engine = self._transactions.write_engine
        self._sqlite = self._transactions.sqlite
        self._ledger_id: str | None = None
        # the parts, each after those it uses
        self.reports = Reports(self._transactions)
        self.read_figures = ReadFigures(self._transactions)
        self.api_keys = ApiKeys(self._transactions)
        self.accounts = Accounts(self._transactions)
        #: Budget periods' clock (``periods.clock``) and windows, shared by every admission.
        self.periods = PeriodAdmission()
        self.budgets = Budgets(self._transactions, self.api_keys, self.periods)
        self.graph_versions = GraphVersions(self._transactions)
        self.embedding_salts = EmbeddingSalts(self._transactions)
        self.shards = ExposureShards(self._transactions)
        self.graph_releases = GraphReleases(self._transactions, self.shards)
        self.synthesis = SynthesisJobs(self._transactions, self.graph_releases)
        self.settlement = Settlement(self._transactions, self.graph_releases, self.synthesis)
        self.stored_releases = StoredReleases(self._transactions)
        self.quota_and_degree = QuotaAndDegree(self._transactions, self.reports, self.periods)
        self.admission_rules = AdmissionRules(
            self._transactions, self.quota_and_degree, self.periods
        )
        self.admission = Admissions(
            self._transactions, self.admission_rules, self.shards, self.settlement, self.reports
        )

    def open_account(
        self,
        type: AccountType,
        *,
        defaults: MechanismSettings,
        node_id: str | None = None,
        cap_epsilon: float | None = None,
        delta: float | None = None,
        label: str | None = None,
        may_create_seed_accounts: bool = False,
        modes: Sequence[str] | None = None,
        quota_epsilon: float | None = None,
        actor_account_id: int | None = None,
    ) -> OpenedAccount:
        """Create an account and its first API key: what the admin API and ``accounts create``
        both do. What is not given takes the deployment's defaults (``defaults``: the cap of
        new accounts, the account delta; scopes: ``edge``)."""
        cap_epsilon = defaults.default_cap_epsilon if cap_epsilon is None else cap_epsilon
        delta = defaults.account_delta if delta is None else delta
        account = self.accounts.create_account(
            type,
            node_id=node_id,
            cap_epsilon=cap_epsilon,
            delta=delta,
            label=label,
            may_create_seed_accounts=may_create_seed_accounts,
            modes=tuple(modes) if modes is not None else ("edge",),
            quota_epsilon=quota_epsilon,
            actor_account_id=actor_account_id,
        )
        api_key, key = self.api_keys.create_api_key(
            account.account_id, actor_account_id=actor_account_id
        )
        return OpenedAccount(account, cap_epsilon, delta, api_key, key)

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
                from alembic.util import CommandError  # imported only to migrate

                try:
                    upgrade_engine(engine)
                except CommandError as exc:
                    raise LedgerNotMigrated(f"cannot migrate the ledger database: {exc}") from exc
                check_migrated(engine)
        except (OperationalError, InterfaceError) as exc:
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
