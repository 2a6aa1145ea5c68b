"""The ledger's schema as SQLAlchemy 2 typed declarative models (SQLite and PostgreSQL).

Migration ``0001_initial`` creates exactly this schema with Alembic operations; a test checks
that the two agree. Rows are never deleted: a refund is a compensating row, a revoked key keeps
its row with ``revoked_at`` set.

Portable choices:

* JSON is stored as TEXT (:func:`encode_json`: orjson, or :func:`json.dumps` for what orjson
  would not write the same way), so Python floats round-trip exactly (shortest round-trip
  digits) on both databases, including ``Infinity``.
* The "one account per seed node" rule is a plain UNIQUE on ``accounts.user_node_id``, a copy
  of ``node_id`` set only for user accounts (NULLs never collide on either database).
* Timestamps are ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL and naive UTC text on SQLite.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.ledger.json_text import CurveText, JsonText

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; naive values (SQLite) are UTC by construction."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC; naive values (SQLite) are UTC by construction."""
    if moment is None:
        return None
    return as_utc(moment).isoformat()


Timestamp = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Account(Base):
    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("type IN ('user', 'service', 'admin')", name="type"),
        CheckConstraint(
            "(type = 'user' AND node_id IS NOT NULL AND user_node_id = node_id)"
            " OR (type <> 'user' AND node_id IS NULL AND user_node_id IS NULL)",
            name="node_binding",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    node_id: Mapped[str | None] = mapped_column(String, nullable=True)
    user_node_id: Mapped[str | None] = mapped_column(String, nullable=True, unique=True)
    label: Mapped[str | None] = mapped_column(String, nullable=True)
    may_create_seed_accounts: Mapped[bool] = mapped_column(Boolean, nullable=False)
    #: Service accounts: the modes the account may query, comma-separated (default edge only).
    modes: Mapped[str] = mapped_column(String(64), nullable=False, server_default="edge")
    #: Service accounts: eps per rolling 24 h they may charge to other accounts; NULL: the
    #: configured default (``PPR_SERVICE_QUOTA_EPSILON``).
    quota_epsilon: Mapped[float | None] = mapped_column(Double, nullable=True)
    #: Service accounts: the most their composed read figure (what their answers reveal) may
    #: reach; NULL: the configured default (``PPR_SERVICE_READ_CAP_EPSILON``, unset: no cap).
    read_cap_epsilon: Mapped[float | None] = mapped_column(Double, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False, index=True)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)


class Budget(Base):
    __tablename__ = "budgets"
    __table_args__ = (
        CheckConstraint("cap_epsilon > 0", name="cap_positive"),
        CheckConstraint("delta > 0 AND delta < 1", name="delta_range"),
    )

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    cap_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    delta: Mapped[float] = mapped_column(Double, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    #: A cap per UTC ``day``, ``week`` or ``month`` on top of ``cap_epsilon`` (both NULL: none).
    period: Mapped[str | None] = mapped_column(String(8), nullable=True)
    period_cap_epsilon: Mapped[float | None] = mapped_column(Double, nullable=True)


class Spend(Base):
    """The composed RDP curve of an account's unrefunded charges: the row locked on admission."""

    __tablename__ = "spend"
    __table_args__ = (
        # the admin accounts table's default order (spent, then account id) without a sort
        Index("ix_spend_epsilon_account_id", "epsilon", "account_id"),
    )

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    rdp: Mapped[dict[str, Any]] = mapped_column(CurveText, nullable=False)
    pure_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    grid_version: Mapped[int] = mapped_column(Integer, nullable=False)
    charges: Mapped[int] = mapped_column(Integer, nullable=False)
    #: The spend converted at the account's delta, kept current by every charge, refund and
    #: budget change (so lists can sort and filter on it in SQL).
    epsilon: Mapped[float] = mapped_column(Double, nullable=False, server_default="0", index=True)
    last_charge_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


#: A charge's life: ``admitted`` (committed before any noise is drawn), then exactly one of
#: ``released`` (its answer is stored) or ``refunded`` (provably nothing left the process).
CHARGE_STATES = ("admitted", "released", "refunded")
_LIVE = "state <> 'refunded'"

#: The ``mechanism`` of the charge an account pays, once per graph version, for receiving
#: answers built on the version's DP degree release (``popular``, ``blended``). It is the
#: graph release's curve charged to the account; the release itself is counted once in the
#: graph-wide exposure (``graph_releases``), so these charges are not added to its shards.
DEGREE_RELEASE_CHARGE = "degree_release"
_DEGREE_LIVE = f"mechanism = '{DEGREE_RELEASE_CHARGE}' AND state <> 'refunded'"
#: The ``mechanism`` of the charge an account pays, once per synthetic release, for receiving
#: sandbox answers computed from it (``graph_release_id`` names the release). Like the degree
#: release's, its curve is the graph release's, counted once in the graph-wide exposure.
SYNTHETIC_RELEASE_CHARGE = "synthetic_release"
_SYNTHETIC_LIVE = f"mechanism = '{SYNTHETIC_RELEASE_CHARGE}' AND state <> 'refunded'"
#: The charges that pay for a graph-wide release an account received (no ``releases`` row of
#: their own; not added to the exposure shards: the graph release is there once already).
GRAPH_RELEASE_CHARGES = (DEGREE_RELEASE_CHARGE, SYNTHETIC_RELEASE_CHARGE)


class Charge(Base):
    """One admitted query's privacy cost (append-only but for its state)."""

    __tablename__ = "charges"
    __table_args__ = (
        CheckConstraint("state IN ('admitted', 'released', 'refunded')", name="state"),
        # An Idempotency-Key names one live charge; once refunded, a retry may charge anew.
        Index(
            "uq_charges_idempotency_live",
            "principal_account_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text(_LIVE),
            postgresql_where=text(_LIVE),
        ),
        Index("ix_charges_state_created_at", "state", "created_at"),
        Index("ix_charges_release_key", "charged_account_id", "release_key"),
        Index("ix_charges_principal_created_at", "principal_account_id", "created_at"),
        Index("ix_charges_created_at", "created_at"),
        Index("ix_charges_period", "charged_account_id", "period_start"),
        # An account pays for a graph version's degree release at most once (per scale).
        Index(
            "uq_charges_degree_release_live",
            "charged_account_id",
            "graph_version",
            "epsilon",
            unique=True,
            sqlite_where=text(_DEGREE_LIVE),
            postgresql_where=text(_DEGREE_LIVE),
        ),
        # An account pays for a synthetic release at most once.
        Index(
            "uq_charges_synthetic_release_live",
            "charged_account_id",
            "graph_release_id",
            unique=True,
            sqlite_where=text(_SYNTHETIC_LIVE),
            postgresql_where=text(_SYNTHETIC_LIVE),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    charged_account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id"), nullable=False, index=True
    )
    principal_account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False)
    seed: Mapped[str] = mapped_column(String, nullable=False)
    mechanism: Mapped[str] = mapped_column(String, nullable=False)
    mode: Mapped[str] = mapped_column(String, nullable=False)
    params: Mapped[dict[str, Any]] = mapped_column(JsonText, nullable=False)
    epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    rdp: Mapped[dict[str, Any]] = mapped_column(CurveText, nullable=False)
    pure_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    grid_version: Mapped[int] = mapped_column(Integer, nullable=False)
    graph_version: Mapped[str] = mapped_column(String, nullable=False)
    request_id: Mapped[str] = mapped_column(String, nullable=False)
    idempotency_key: Mapped[str | None] = mapped_column(String, nullable=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default="admitted")
    #: Digest of the release key of a non-fresh query: identical concurrent queries find their
    #: in-flight twin by it. NULL for ``fresh`` queries (they always draw new noise).
    release_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: Which graph-wide exposure shard row this charge was added to.
    exposure_shard: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    settled_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)
    #: ``synthetic_release`` charges: the graph release (the synthetic release) paid for.
    graph_release_id: Mapped[int | None] = mapped_column(
        ForeignKey("graph_releases.id"), nullable=True
    )
    #: The answering process's last sign of life while the charge is ``admitted`` (a long
    #: batch refreshes it while its items are drawn); the reconciler, and an identical query
    #: finding it in flight, refund an admitted charge only once this (or ``created_at``, if
    #: it never beat) is older than their limit.
    heartbeat_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)
    #: 00:00 UTC of the day of ``created_at`` (service/ledger/periods.py); set on every charge.
    period_start: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)


class Refund(Base):
    """A compensating row: the charge's noise was provably never released."""

    __tablename__ = "refunds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    charge_id: Mapped[int] = mapped_column(ForeignKey("charges.id"), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    reason: Mapped[str] = mapped_column(Text, nullable=False)


class Release(Base):
    """A released answer, kept so that replaying it is free (post-processing)."""

    __tablename__ = "releases"
    __table_args__ = (
        Index(
            "ix_releases_key",
            "charged_account_id",
            "node",
            "graph_version",
            "mode",
            "epsilon",
            "mechanism_name",
        ),
        Index("ix_releases_idempotency", "principal_account_id", "idempotency_key"),
    )

    charge_id: Mapped[int] = mapped_column(ForeignKey("charges.id"), primary_key=True)
    charged_account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False)
    node: Mapped[str] = mapped_column(String, nullable=False)
    graph_version: Mapped[str] = mapped_column(String, nullable=False)
    mode: Mapped[str] = mapped_column(String, nullable=False)
    epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    mechanism_name: Mapped[str] = mapped_column(
        String, nullable=False, server_default="noisy_diffusion"
    )
    results: Mapped[list[Any]] = mapped_column(JsonText, nullable=False)
    mechanism: Mapped[dict[str, Any]] = mapped_column(JsonText, nullable=False)
    request_id: Mapped[str] = mapped_column(String, nullable=False)
    principal_account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False)
    idempotency_key: Mapped[str | None] = mapped_column(String, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


#: How an Idempotency-Key came to name its charge: the keyed request was ``charged``, it
#: ``joined`` an identical query's charge (in flight or released) at admission, it was
#: ``replayed`` from a stored release before admission, or it was a ``popular`` answer (the
#: ranked degree release; the binding names the account's charge for that release, and the
#: query's ``seed`` and ``mode``, which only this kind records).
BINDING_KINDS = ("charged", "joined", "replayed", "popular")
POPULAR_BINDING = "popular"
_BOUND = "freed_at IS NULL"
_POPULAR_SHAPE = "(kind = 'popular') = (seed IS NOT NULL AND mode IS NOT NULL)"


class IdempotencyBinding(Base):
    """What an Idempotency-Key answers with: the charge whose release was (or will be) the
    first answer given under ``(principal_account_id, idempotency_key)``.

    Every keyed answer records its key here in the transaction that decides it, under one
    uniqueness rule, so a key names at most one charge. A binding is freed only when its charge
    is refunded (nothing was released under it): a retry may then be charged anew. A binding
    to a released charge is permanent."""

    __tablename__ = "idempotency_bindings"
    __table_args__ = (
        CheckConstraint("kind IN ('charged', 'joined', 'replayed', 'popular')", name="kind"),
        CheckConstraint(_POPULAR_SHAPE, name="popular_query"),
        Index(
            "uq_idempotency_bindings_bound",
            "principal_account_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text(_BOUND),
            postgresql_where=text(_BOUND),
        ),
        Index("ix_idempotency_bindings_charge_id", "charge_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    principal_account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String, nullable=False)
    charge_id: Mapped[int] = mapped_column(ForeignKey("charges.id"), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    freed_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)
    #: ``popular`` bindings only: the node and mode of the query answered (the charge named is
    #: the account's degree-release charge, shared by every popular answer of the version).
    seed: Mapped[str | None] = mapped_column(String, nullable=True)
    mode: Mapped[str | None] = mapped_column(String(16), nullable=True)


#: How many rows the graph-wide exposure is spread over: a charge updates one of them, so
#: concurrent charges of different accounts rarely wait for each other.
EXPOSURE_SHARDS = 16


class ExposureShard(Base):
    """A part of the graph-wide exposure: the composed curve of the live charges (and graph-wide
    releases) assigned to this shard. Their sum over shards bounds what all accounts together
    have learned about any one edge."""

    __tablename__ = "exposure_shards"

    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    rdp: Mapped[dict[str, Any]] = mapped_column(CurveText, nullable=False)
    pure_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    charges: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class GraphRelease(Base):
    """A release about the whole graph (e.g. noisy degrees), made once per graph version and
    mechanism and charged to the graph-wide exposure only (no account pays for it)."""

    __tablename__ = "graph_releases"
    __table_args__ = (
        CheckConstraint("state IN ('admitted', 'released', 'refunded')", name="state"),
        Index(
            "uq_graph_releases_live",
            "graph_version",
            "mechanism",
            unique=True,
            sqlite_where=text(_LIVE),
            postgresql_where=text(_LIVE),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    graph_version: Mapped[str] = mapped_column(String, nullable=False)
    mechanism: Mapped[str] = mapped_column(String, nullable=False)
    epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    rdp: Mapped[dict[str, Any]] = mapped_column(CurveText, nullable=False)
    pure_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    exposure_shard: Mapped[int] = mapped_column(Integer, nullable=False)
    # deferred: read only where the bytes are wanted (an all-node embedding release is tens of
    # megabytes; its state and curve are read on every similar-nodes answer)
    payload: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    settled_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)
    #: The drawing process's last sign of life (a long draw, e.g. a synthesis run, refreshes
    #: it); the reconciler refunds an ``admitted`` release only once this (or, for releases
    #: made before the column existed, ``created_at``) is older than its limit.
    heartbeat_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)


class SynthesisJob(Base):
    """One synthesis run (``synthesize`` on the command line or ``POST /v1/admin/synthetic``):
    the graph-wide release it is charged as, its method, parameters and privacy unit, and its
    progress. Any worker answers its status from here; a run whose process stopped sending
    heartbeats is marked ``failed`` and its release refunded by the reconciler."""

    __tablename__ = "synthesis_jobs"
    __table_args__ = (
        CheckConstraint("state IN ('running', 'done', 'failed')", name="state"),
        CheckConstraint("source IN ('cli', 'api')", name="source"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    release_id: Mapped[int] = mapped_column(
        ForeignKey("graph_releases.id"), nullable=False, unique=True
    )
    graph_version: Mapped[str] = mapped_column(String, nullable=False)
    method: Mapped[str] = mapped_column(String(32), nullable=False)
    privacy_unit: Mapped[str] = mapped_column(String(8), nullable=False)
    epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    delta: Mapped[float] = mapped_column(Double, nullable=False)
    parameters: Mapped[dict[str, Any]] = mapped_column(JsonText, nullable=False)
    source: Mapped[str] = mapped_column(String(8), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    progress: Mapped[float] = mapped_column(Double, nullable=False)
    actor_account_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id"), nullable=True
    )  # NULL: the operator on the command line
    nodes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    edges: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp, nullable=True)


class ServiceRead(Base):
    """One distinct release a service account received (fresh or replayed; a query's release,
    or a graph-wide release such as the degree vector): the terms of its read figure."""

    __tablename__ = "service_reads"
    __table_args__ = (
        CheckConstraint("(charge_id IS NULL) <> (graph_release_id IS NULL)", name="one_release"),
        # A release is counted once per reader, whatever worker recorded it (NULLs never
        # collide, on either database).
        Index("uq_service_reads_charge", "reader_account_id", "charge_id", unique=True),
        Index(
            "uq_service_reads_graph_release", "reader_account_id", "graph_release_id", unique=True
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reader_account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False)
    charge_id: Mapped[int | None] = mapped_column(ForeignKey("charges.id"), nullable=True)
    graph_release_id: Mapped[int | None] = mapped_column(
        ForeignKey("graph_releases.id"), nullable=True
    )
    epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    rdp: Mapped[dict[str, Any]] = mapped_column(CurveText, nullable=False)
    pure_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class ReadTotal(Base):
    """A service account's read figure: the composition of every distinct release it received
    (its ``service_reads``), kept current under the row lock that records them."""

    __tablename__ = "read_totals"

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    rdp: Mapped[dict[str, Any]] = mapped_column(CurveText, nullable=False)
    pure_epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    releases: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class QuotaBucket(Base):
    """A service account's live charges to other accounts, summed by the minute of their
    ``created_at`` (``service/ledger/quota_buckets.py``): the 24-hour quota reads at most
    1,440 of these rows and one minute's charges, not every charge of the day. Kept in the
    transaction that inserts a charge or refunds it."""

    __tablename__ = "quota_buckets"

    principal_account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    epsilon: Mapped[float] = mapped_column(Double, nullable=False)
    charges: Mapped[int] = mapped_column(Integer, nullable=False)


class Refusal(Base):
    """A query the ledger refused (budget, quota, graph-wide cap or mode): kept so admins see
    refusals by reason across every worker and restart. Nothing was charged. A group's
    refusals at admission are written in the admission's own transaction, those met while a
    group is prepared in one transaction at its end, a lone query's in one of its own."""

    __tablename__ = "refusals"
    __table_args__ = (Index("ix_refusals_created_at", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    reason: Mapped[str] = mapped_column(String(64), nullable=False)
    charged_account_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id"), nullable=True)
    principal_account_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id"), nullable=True
    )
    mode: Mapped[str | None] = mapped_column(String(32), nullable=True)
    epsilon: Mapped[float | None] = mapped_column(Double, nullable=True)


class AuditLog(Base):
    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_target_account_id", "target_account_id"),
        Index("ix_audit_log_action", "action"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    actor_account_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id"), nullable=True
    )  # NULL: the operator on the command line
    action: Mapped[str] = mapped_column(String, nullable=False)
    target_account_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id"), nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JsonText, nullable=False)


class GraphVersion(Base):
    """The public id of each graph version, recorded against its content fingerprint.

    Callers see ``public_id`` only: it is random, not a function of the edges. The first
    worker to load a graph inserts the row; every other worker, restart and replica reads the
    same id back, so the id changes only when the content does. Versions recorded before this
    table existed keep their old (already public) value as their id.
    """

    __tablename__ = "graph_versions"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    public_id: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class EmbeddingSalt(Base):
    """The salt of each graph version's embedding hash functions (16 bytes, as hex).

    Drawn from the OS entropy source by the first worker that embeds on the version, inserted
    if absent and read back, so every worker, restart and replica hashes alike; a new graph
    version gets a new salt. Never a function of the edges; it may be public.
    """

    __tablename__ = "embedding_salts"

    graph_version: Mapped[str] = mapped_column(String(64), primary_key=True)
    salt: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class LedgerMeta(Base):
    """Key/value facts about the stored data, e.g. the order grid the curves are on."""

    __tablename__ = "ledger_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)


META_GRID_VERSION = "grid_version"
META_GRID_FINGERPRINT = "grid_fingerprint"
META_LEDGER_ID = "ledger_id"
#: The graph version every worker and replica serves; a load or reload sets it.
META_CURRENT_GRAPH_VERSION = "current_graph_version"
META_CURRENT_GRAPH_PATH = "current_graph_path"
META_CURRENT_GRAPH_CONFIGURATION = "current_graph_configuration"
