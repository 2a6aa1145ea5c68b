"""The embedding calls as data (see :mod:`service.client.calls`): DP-IE for one seed or many,
the free embedding of a stored release, and similar nodes.

DP-IE calls are charged: each carries an Idempotency-Key (the caller's, or a fresh UUID per
call) that every retry reuses, so the service charges each seed at most once. The free
embedding and similar nodes charge nothing and are safe to send again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict, Unpack
from urllib.parse import quote

from service.client.calls import Call, Mode, NodeId, batch_call, charged_options
from service.client.embedding_models import EmbeddingAnswer, EmbeddingBatchAnswer, SimilarAnswer

FreeMechanism = Literal["noisy_diffusion", "common_neighbours", "friends_of_friends", "blended"]


class EmbeddingOptions(TypedDict, total=False):
    """The options of ``embedding`` and ``embedding_batch``; any left out takes the service's
    default.

    ``k``: the dimension (``PPR_EMBEDDING_DEFAULT_K``); ``sigma``: PushFlowCap's sensitivity
    (``PPR_EMBEDDING_DEFAULT_SIGMA``; the noise scale is sigma n / epsilon); ``epsilon``: per
    seed; ``mode``: ``"personalized"`` (the seed user's account is charged; the answer is for
    that user only) or ``"edge"`` (the caller is charged, counted in the graph-wide exposure);
    ``fresh``: draw new noise even where a release exists; ``idempotency_key``: the key every
    attempt of this call carries (a fresh UUID per call if not given).
    """

    k: int
    sigma: float
    epsilon: float
    mode: Mode
    fresh: bool
    idempotency_key: str


def _node(node: NodeId) -> str:
    return quote(str(node), safe="")


def embedding(node: NodeId, **options: Unpack[EmbeddingOptions]) -> Call[EmbeddingAnswer]:
    """``GET /v1/embeddings/{node}``: a DP-IE embedding of ``node``, charged at most once
    however many attempts it takes (see :class:`EmbeddingOptions`)."""
    params, key = charged_options(options)
    return Call(
        "GET",
        f"/v1/embeddings/{_node(node)}",
        EmbeddingAnswer.model_validate_json,
        params=params,
        idempotency_key=key,
    )


def embedding_batch(
    nodes: Sequence[NodeId], **options: Unpack[EmbeddingOptions]
) -> Call[EmbeddingBatchAnswer]:
    """``POST /v1/embeddings/batch``: one item per node, in order, each an embedding or its own
    error (``EmbeddingBatchItem.raise_for_error()``); a retry charges no item twice."""
    return batch_call(
        "/v1/embeddings/batch", nodes, options, EmbeddingBatchAnswer.model_validate_json
    )


def free_embedding(
    node: NodeId,
    *,
    epsilon: float | None = None,
    mode: Mode | None = None,
    mechanism: FreeMechanism | None = None,
    k: int | None = None,
) -> Call[EmbeddingAnswer]:
    """``GET /v1/embeddings/free/{node}``: the InstantEmbedding of the stored ranking release
    of ``GET /v1/ppr/{node}`` with these ``epsilon``, ``mode`` and ``mechanism``, which the
    caller may replay; charges nothing (``NoRelease`` if there is none). ``.source`` names the
    release."""
    params = {"epsilon": epsilon, "mode": mode, "mechanism": mechanism, "k": k}
    return Call(
        "GET",
        f"/v1/embeddings/free/{_node(node)}",
        EmbeddingAnswer.model_validate_json,
        params=params,
    )


def similar(node: NodeId, *, k: int | None = None) -> Call[SimilarAnswer]:
    """``GET /v1/embeddings/similar/{node}``: the nodes nearest to ``node`` in the all-node
    edge-mode embedding release (service accounts with edge mode; free; ``NoEmbeddingRelease``
    when there is none)."""
    return Call(
        "GET",
        f"/v1/embeddings/similar/{_node(node)}",
        SimilarAnswer.model_validate_json,
        params={"k": k},
    )
