"""DP-IE embeddings for many seeds in one call (``POST /v1/embeddings/batch``).

Each item is answered with the checks and in the order of a ``GET /v1/embeddings/{node}``
(authorized, refused past a cap before anything is drawn, stored before it is answered,
replayed free, listed with mechanism ``dp_instant_embedding``), and the items go through the
ranking batch's group path (:meth:`EmbeddingQueryService.answer_many`): keyed replays bind
their keys in one ledger transaction, the items are admitted and charged in one (each
all-or-nothing, in order, so a budget that runs out mid-batch refuses exactly the items it
cannot pay for), drawn concurrently on the ranking batch's shared pool, stored in one, and no
item is answered before every release is stored. A failing item becomes that item's error,
never the call's, and charges nothing.

One Idempotency-Key for the batch gives every item its own key, derived exactly as the ranking
batch derives its items' keys (:func:`service.serving.batch.item_idempotency_key`), so a
retried batch charges each item at most once and answers it with the release it first got.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from service.errors import Forbidden
from service.privacy.modes import Mode
from service.serving.batch import BatchItem, batch_items, item_idempotency_key
from service.serving.embedding_query import (
    EmbeddingAnswer,
    EmbeddingQueryService,
    EmbeddingRequest,
)
from service.serving.pipeline.items import Run
from service.serving.schemas import Principal

__all__ = ["EmbeddingBatchItem", "EmbeddingBatchRequest", "answer_embedding_batch"]


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


#: One item's outcome: an embedding, or the error it alone failed with.
EmbeddingBatchItem: TypeAlias = BatchItem[EmbeddingAnswer]


def answer_embedding_batch(
    embeddings: EmbeddingQueryService, run_all: Run, request: EmbeddingBatchRequest
) -> list[EmbeddingBatchItem]:
    """Every item's outcome, in the order of ``request.nodes``.

    The parameters every item shares (k, sigma, epsilon) are checked once: a bad one is one
    error for the whole call, before any item is admitted. The items are admitted and
    charged in one ledger transaction and their releases stored in one
    (:meth:`EmbeddingQueryService.answer_many`); the draws run concurrently on ``run_all``.
    """
    if not request.nodes:
        return []
    if request.principal.type == "admin":
        raise Forbidden("admin accounts manage budgets and cannot query")
    embeddings.parameters(request.k, request.sigma, request.epsilon)
    items = [request.item(i) for i in range(len(request.nodes))]
    outcomes = embeddings.answer_many(items, run_all)
    return batch_items(request.nodes, request.request_id, outcomes)
