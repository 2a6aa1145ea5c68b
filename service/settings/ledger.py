"""The budget ledger's settings: its database, migrations at start-up, how a worker waits for
and keeps its connections, group commit, reconciling stale charges and the authentication
cache (an API key's account read from the ledger), and the heartbeat of a running graph-wide
release - a synthesis or an all-node embedding release - (which the reconciler reads)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.urls import check_database_url


class LedgerSettings(BaseSettings):
    """The budget ledger's database and how each worker uses it."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore", populate_by_name=True)

    database_url: str = Field("sqlite:///./ppr-ledger.db", description="SQLAlchemy URL.")
    auto_migrate: bool = Field(False, description="Run migrations at start-up.")
    ledger_connect_timeout_seconds: float = Field(
        60.0, ge=0.0,
        description="How long a starting worker waits for an unreachable ledger database "
        "before it starts serving without it: then it answers 503 ledger_unavailable (and "
        "/readyz 503) and keeps connecting in the background, with backoff, until the "
        "database answers (0: start serving at once).",
    )  # fmt: skip
    ledger_ping_idle_seconds: float = Field(
        10.0, ge=0.0,
        description="PostgreSQL: a pooled connection idle longer than this is pinged before "
        "use (0: before every transaction); a busy pool pays no ping round trip.",
    )  # fmt: skip
    ledger_group_max: int = Field(
        64, ge=1, le=10_000,
        description="Most queries a worker admits (or whose releases it stores) in one ledger "
        "transaction when they arrive while the previous one runs (group commit; each query "
        "stays all-or-nothing); 1: one transaction per query.",
    )  # fmt: skip
    reconcile_after_seconds: float = Field(
        60.0, ge=1.0,
        description="An admitted charge with no stored release and no sign of life (its "
        "heartbeat, else its admission) for this long is refunded.",
    )  # fmt: skip
    reconcile_interval_seconds: float = Field(
        30.0, ge=0.0, description="How often each worker reconciles; 0 turns it off."
    )
    release_heartbeat_seconds: float = Field(
        5.0, gt=0.0,
        # the name it had while only synthesis runs beat is still read
        validation_alias=AliasChoices(
            "PPR_RELEASE_HEARTBEAT_SECONDS", "PPR_SYNTHESIS_HEARTBEAT_SECONDS"
        ),
        description="How often a running graph-wide release (a synthesis job or command, an "
        "all-node embedding release) refreshes its heartbeat, and how often a worker "
        "refreshes the heartbeat of the admitted charges it is still answering; at most half of "
        "PPR_RECONCILE_AFTER_SECONDS (unset: 5, or a quarter of that limit if smaller).",
    )  # fmt: skip
    auth_cache_seconds: float = Field(
        1.0, ge=0.0,
        description="How long a worker reuses an API key's account (type, scopes, quota) "
        "without reading the ledger: a revoked key or changed scope takes effect in other "
        "workers within this bound (at once in the worker that made the change); 0: read "
        "on every request.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _heartbeat_under_reconcile(self) -> LedgerSettings:
        if "release_heartbeat_seconds" not in self.model_fields_set:
            # the default follows a short reconcile limit (tests, small deployments) instead of
            # refusing it: at most a quarter of the limit
            self.release_heartbeat_seconds = min(5.0, self.reconcile_after_seconds / 4)
        elif self.release_heartbeat_seconds * 2 > self.reconcile_after_seconds:
            raise ValueError(
                "PPR_RELEASE_HEARTBEAT_SECONDS must be at most half of "
                "PPR_RECONCILE_AFTER_SECONDS (a running synthesis or embedding release would be "
                "refunded)"
            )
        return self

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return check_database_url(value)
