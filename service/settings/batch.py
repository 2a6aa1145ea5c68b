"""The batch endpoint's settings (``POST /v1/ppr/batch``): how many seeds one call may carry
and how many items a process answers at once."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BatchSettings(BaseSettings):
    """The batch endpoint (POST /v1/ppr/batch)."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    batch_max_items: int = Field(
        1000, ge=1, le=100_000, description="Most seeds one POST /v1/ppr/batch call may carry."
    )
    batch_concurrency: int = Field(
        32, ge=1, le=1024, description="Batch items answered at once per process (all batches)."
    )
