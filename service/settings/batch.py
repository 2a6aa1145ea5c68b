"""The batch endpoints' settings (``POST /v1/ppr/batch``, ``POST /v1/embeddings/batch``): how
many seeds one call may carry and how many items a process answers at once."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BatchSettings(BaseSettings):
    """The batch endpoints (POST /v1/ppr/batch, POST /v1/embeddings/batch)."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    batch_max_items: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="Most seeds one POST /v1/ppr/batch (or /v1/embeddings/batch) call may carry.",
    )
    batch_concurrency: int = Field(
        32, ge=1, le=1024, description="Batch items answered at once per process (all batches)."
    )
