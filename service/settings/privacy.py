"""Privacy limits beyond one account's own budget: what service accounts may charge to
others and receive (quota, read cap), whether they may create seed users' accounts, and the
graph-wide exposure cap and its delta. (Per-query bounds and new accounts' budgets are the
mechanism's settings, :mod:`service.settings.mechanism`.)"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PrivacySettings(BaseSettings):
    """Limits beyond one account's budget: service accounts, seed accounts, the graph-wide cap."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    create_seed_accounts: bool = Field(
        False,
        description="Service accounts granted may_create_seed_accounts may create a seed "
        "user's account on its first charge (both must allow it).",
    )
    service_quota_epsilon: float = Field(
        1000.0, gt=0.0,
        description="Default eps a service account may charge to other accounts per rolling "
        "24 h (per-account quota_epsilon overrides it).",
    )  # fmt: skip
    service_read_cap_epsilon: float | None = Field(
        None, gt=0.0,
        description="Default cap on a service account's read figure (the composition of every "
        "distinct release it received); unset: reported, not capped (per-account "
        "read_cap_epsilon overrides it).",
    )  # fmt: skip
    graph_cap_epsilon: float | None = Field(
        None, gt=0.0,
        description="Graph-wide cap on the composed exposure of all accounts; unset: no cap.",
    )  # fmt: skip
    exposure_delta: float | None = Field(
        None, gt=0.0, lt=1.0,
        description="Delta of the graph-wide exposure; unset: the smallest account delta.",
    )  # fmt: skip
