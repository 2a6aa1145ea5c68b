"""The caches' settings: Redis (or in-process caches), where noise-free prefixes may live and
how much of them, the machine-wide prefix tables, and the replay cache."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.urls import check_redis_url


class CacheSettings(BaseSettings):
    """The caches: Redis or in process, noise-free prefixes and replays."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    redis_url: str | None = Field(None, description="Redis URL; unset: in-process caches.")
    allow_prefix_in_redis: bool = Field(
        False, description="Let Redis hold noise-free prefixes (as sensitive as the graph)."
    )
    prefix_cache_bytes: int = Field(
        256 * 2**20, ge=0,
        description="Bytes of noise-free prefixes kept in process memory per machine: each of "
        "the PPR_WORKERS workers keeps at most this / PPR_WORKERS.",
    )  # fmt: skip
    prefix_table_bytes: int = Field(
        2**29, ge=0,
        description="Bytes of machine-wide prefix tables (every seed's noise-free prefix, "
        "n x n float64 per mode, one file in the snapshot directory mapped by every worker): "
        "a graph's tables are built, edge mode first, while they fit together; 0: off (also "
        "off when PPR_GRAPH_SNAPSHOTS is false).",
    )  # fmt: skip
    replay_ttl_seconds: int = Field(7 * 24 * 3600, ge=60, description="Replay cache TTL.")
    replay_store_top: int = Field(1000, ge=1, description="Results kept for replays.")
    replay_recent_seconds: float = Field(
        1.0, ge=0.0, le=60.0,
        description="Releases a worker read or wrote in the last this many seconds are kept "
        "decoded in process (hot replays skip Redis); another worker's newer release for the "
        "same query is seen after at most this long; 0: off.",
    )  # fmt: skip
    replay_recent_items: int = Field(
        256, ge=0, le=100_000,
        description="Most releases each worker keeps decoded (PPR_REPLAY_RECENT_SECONDS); one "
        "of 1000 results is ~100 kB of Python objects.",
    )  # fmt: skip

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return None if value is None else check_redis_url(value)
