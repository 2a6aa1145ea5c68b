"""What the embedding endpoints are asked and answer, inside the service: a DP-IE request, a
free-embedding request, and an embedding answer (DP-IE or free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.privacy.modes import Mode
from service.serving.schemas import ChargedAnswer, Principal

__all__ = ["EmbeddingAnswer", "EmbeddingRequest", "FreeEmbeddingRequest"]


@dataclass(frozen=True)
class EmbeddingRequest:
    principal: Principal
    node: str
    k: int | None = None  # None: PPR_EMBEDDING_DEFAULT_K
    sigma: float | None = None  # None: PPR_EMBEDDING_DEFAULT_SIGMA
    epsilon: float | None = None  # None: PPR_DEFAULT_EPSILON
    mode: Mode = Mode.PERSONALIZED
    fresh: bool = False
    idempotency_key: str | None = None
    request_id: str = ""


@dataclass(frozen=True)
class FreeEmbeddingRequest:
    """The free embedding of the stored release of the ranking query (node, mode, epsilon,
    mechanism) the caller may replay."""

    principal: Principal
    node: str
    k: int | None = None
    epsilon: float | None = None
    mode: Mode = Mode.PERSONALIZED
    mechanism: str | None = None  # None: the ranking default for the mode
    request_id: str = ""


@dataclass(frozen=True, kw_only=True)
class EmbeddingAnswer(ChargedAnswer):
    """An embedding: DP-IE's (charged, or replayed), or the free embedding of a stored ranking
    release (replayed: charged nothing)."""

    embedding: list[float]
    #: The free embedding: the stored release it was computed from.
    source: dict[str, Any] | None = None
