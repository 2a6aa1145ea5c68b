"""The embedding answers as the client reads them (tolerant, like :mod:`service.client.models`):
a DP-IE or free embedding, an embedding batch, and similar nodes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from service.client.models import BatchAnswerBase, BatchItemBase, Budget, Mechanism

__all__ = [
    "EmbeddingAnswer",
    "EmbeddingBatchAnswer",
    "EmbeddingBatchItem",
    "EmbeddingMechanism",
    "EmbeddingSource",
    "SimilarAnswer",
    "SimilarNode",
    "SimilarRelease",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class EmbeddingMechanism(_Model):
    """How an embedding was made. ``dp_instant_embedding`` (DP-IE, charged) states sigma, the
    noise scale and the grid; ``instant_embedding_of_release`` (free) states what it read."""

    name: str
    mode: str
    epsilon: float
    delta: float
    dimension: int
    hash_salt: str
    sigma: float | None = None
    sensitivity: float | None = None
    noise_scale: float | None = None
    score_grid: float | None = None
    alpha: float | None = None
    rounds: int | None = None
    normalized: bool | None = None
    entries: int | None = None
    store_top: int | None = None


class EmbeddingSource(_Model):
    """The stored ranking release a free embedding was computed from."""

    release_request_id: str
    node: str
    mode: str
    epsilon: float
    mechanism: Mechanism
    graph_version: str


class EmbeddingAnswer(_Model):
    """``GET /v1/embeddings/{node}`` (DP-IE) or ``GET /v1/embeddings/free/{node}``."""

    node: str
    graph_version: str
    embedding: list[float]
    mechanism: EmbeddingMechanism
    budget: Budget
    replayed: bool
    request_id: str
    epsilon_charged: float
    source: EmbeddingSource | None = None


class EmbeddingBatchItem(BatchItemBase):
    """One seed's embedding (``embedding``) or the error it alone failed with (``error``)."""

    graph_version: str | None = None
    embedding: list[float] | None = None
    mechanism: EmbeddingMechanism | None = None


class EmbeddingBatchAnswer(BatchAnswerBase[EmbeddingBatchItem]):
    """``POST /v1/embeddings/batch``."""


class SimilarNode(_Model):
    node: str
    similarity: float


class SimilarRelease(_Model):
    """The all-node edge-mode embedding release similar nodes are read from."""

    name: str
    graph_version: str
    method: str
    mode: str
    nodes: int
    epsilon_per_node: float
    epsilon: float
    k: int
    sigma: float
    privacy_unit: str | None = None


class SimilarAnswer(_Model):
    node: str
    graph_version: str
    results: list[SimilarNode]
    release: SimilarRelease
    index: str
    epsilon_charged: float
    cost: str
    request_id: str
