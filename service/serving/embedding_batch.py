"""DP-IE embeddings for many seeds in one call (``POST /v1/embeddings/batch``).

Each item is exactly a ``GET /v1/embeddings/{node}``: it goes through
:meth:`EmbeddingQueryService.answer` (authorized, admitted and charged in its own ledger
transaction, refused past a cap before anything is drawn, stored before it is answered,
replayed free, listed with mechanism ``dp_instant_embedding``); there is no second charging
path. The items run concurrently on the ranking batch's shared pool. A failing item becomes
that item's error, never the call's, and charges nothing.

One Idempotency-Key for the batch gives every item its own key, derived exactly as the ranking
batch derives its items' keys (:func:`service.serving.batch.item_idempotency_key`), so a
retried batch charges each item at most once and answers it with the release it first got.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.errors import Forbidden, ServiceError
from service.privacy.modes import Mode
from service.serving.batch import InternalItemError, item_idempotency_key
from service.serving.embedding_query import (
    EmbeddingAnswer,
    EmbeddingQueryService,
    EmbeddingRequest,
)
from service.serving.schemas import Principal

__all__ = ["EmbeddingBatchItem", "EmbeddingBatchRequest", "answer_embedding_batch"]

log = logging.getLogger(__name__)

#: Runs thunks concurrently and returns each one's result or exception, in order
#: (:meth:`service.serving.batch.BatchQueryService.run_all`).
RunAll = Callable[[list[Callable[[], Any]]], list[Any]]


@dataclass(frozen=True)
class EmbeddingBatchRequest:
    principal: Principal
    nodes: Sequence[str]
    k: int | None = None
    sigma: float | None = None
    epsilon: float | None = None
    mode: Mode = Mode.PERSONALIZED
    fresh: bool = False
    idempotency_key: str | None = None
    request_id: str = ""

    def item(self, index: int) -> EmbeddingRequest:
        """Item ``index`` as the single request it is answered as."""
        node = self.nodes[index]
        key = self.idempotency_key
        return EmbeddingRequest(
            principal=self.principal,
            node=node,
            k=self.k,
            sigma=self.sigma,
            epsilon=self.epsilon,
            mode=self.mode,
            fresh=self.fresh,
            idempotency_key=None if key is None else item_idempotency_key(key, index, node),
            request_id=f"{self.request_id}.{index}",
        )


@dataclass(frozen=True)
class EmbeddingBatchItem:
    """One item's outcome: an embedding, or the error it alone failed with."""

    node: str
    answer: EmbeddingAnswer | None = None
    error: ServiceError | None = None


def answer_embedding_batch(
    embeddings: EmbeddingQueryService, run_all: RunAll, request: EmbeddingBatchRequest
) -> list[EmbeddingBatchItem]:
    """Every item's outcome, in the order of ``request.nodes``.

    The parameters every item shares (k, sigma, epsilon) are checked once: a bad one is one
    error for the whole call, before any item is admitted.
    """
    if not request.nodes:
        return []
    if request.principal.type == "admin":
        raise Forbidden("admin accounts manage budgets and cannot query")
    embeddings.parameters(request.k, request.sigma, request.epsilon)
    thunks: list[Callable[[], Any]] = [
        functools.partial(embeddings.answer, request.item(i)) for i in range(len(request.nodes))
    ]
    outcomes = run_all(thunks)
    return [_item(request, i, outcome) for i, outcome in enumerate(outcomes)]


def _item(request: EmbeddingBatchRequest, index: int, outcome: Any) -> EmbeddingBatchItem:
    node = request.nodes[index]
    if isinstance(outcome, EmbeddingAnswer):
        return EmbeddingBatchItem(node, answer=outcome)
    if isinstance(outcome, ServiceError):
        return EmbeddingBatchItem(node, error=outcome)
    log.error(
        "embedding batch item failed",
        exc_info=outcome if isinstance(outcome, BaseException) else None,
        extra={"request_id": f"{request.request_id}.{index}"},
    )
    return EmbeddingBatchItem(
        node,
        error=InternalItemError(
            "this item failed unexpectedly and returned no answer. Quote request id "
            f"{request.request_id}.{index} to the operator"
        ),
    )
