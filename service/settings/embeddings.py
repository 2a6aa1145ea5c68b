"""Settings of the similar-nodes endpoint: where the all-node embedding release is, and how
deep its index is searched."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class EmbeddingSettings(BaseSettings):
    """The similar-nodes endpoint (GET /v1/embeddings/similar/{node})."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    embedding_release_dir: Path | None = Field(
        None,
        description="Directory an all-node embedding release was written to ('embeddings "
        "release --out'); GET /v1/embeddings/similar serves the release its current.json "
        "names. Unset: that endpoint answers 404 no_embedding_release.",
    )
    similar_ef: int = Field(
        128, ge=1, le=4096,
        description="Search depth (HNSW ef) of a similar-nodes answer (at least k + 1); the "
        "index is used only if the release measured recall@10 >= 0.95 at a depth no greater.",
    )  # fmt: skip
