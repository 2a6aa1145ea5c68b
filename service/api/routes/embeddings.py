"""``GET /v1/embeddings/{node_id}`` (DP-IE, charged), ``POST /v1/embeddings/batch`` (DP-IE for
many seeds, each item charged as the single query is) and ``GET /v1/embeddings/free/{node_id}``
(the InstantEmbedding of a stored release the caller may replay, free)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from service.api.deps import EngineTurn, PrincipalDep, RuntimeDep
from service.api.embedding_batch_models import EmbeddingBatchAnswer, EmbeddingBatchQuery
from service.api.models import EmbeddingAnswerModel, EmbeddingMechanism, ErrorResponse
from service.api.observability import count_answer
from service.api.params import K_LIMIT, IdempotencyKeyHeader, NodeIdPath, QueryBool
from service.api.routes.batch import check_batch_size, item_bodies
from service.api.routes.ppr import one_header
from service.api.runtime import Runtime
from service.api.strict import StrictRoute
from service.errors import Forbidden
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode
from service.serving.embedding_batch import EmbeddingBatchRequest, answer_embedding_batch
from service.serving.embedding_query import (
    EmbeddingAnswer,
    EmbeddingRequest,
    FreeEmbeddingRequest,
)

router = APIRouter(prefix="/v1/embeddings", tags=["embeddings"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "missing, malformed, unknown or revoked key"},
    403: {
        "model": ErrorResponse,
        "description": "`forbidden`, `mode_not_allowed`, `budget_exhausted`, "
        "`graph_budget_exhausted` or `read_cap_exhausted`",
    },
    404: {"model": ErrorResponse, "description": "`unknown_node` or `unknown_account`"},
    409: {"model": ErrorResponse, "description": "`request_in_progress`"},
    422: {"model": ErrorResponse, "description": "`invalid_parameter`, naming it"},
    503: {"model": ErrorResponse, "description": "`ledger_unavailable`"},
}

Dimension = Annotated[
    int | None,
    Query(
        ge=1, le=K_LIMIT,
        description="Dimension k (1..PPR_MAX_K and at most 4096, default "
        "PPR_EMBEDDING_DEFAULT_K)",
    ),
]  # fmt: skip
Epsilon = Annotated[
    float | None,
    Query(gt=0, description="Epsilon (PPR_EPSILON_MIN..PPR_EPSILON_MAX, default "
                            "PPR_DEFAULT_EPSILON)"),
]  # fmt: skip
ModeQuery = Annotated[Mode, Query(description="`personalized` or `edge`")]


def _not_in_sandbox(runtime: Runtime) -> None:
    if runtime.sandbox is not None:
        raise Forbidden(
            "this server answers on a synthetic release (a sandbox); embeddings "
            "are served by the service on its graph only"
        )


def _body(answer: EmbeddingAnswerModel) -> Response:
    return Response(
        content=answer.model_dump_json(exclude_none=True), media_type="application/json"
    )


@router.get(
    "/free/{node_id:node}",
    operation_id="getFreeEmbedding",
    response_model=EmbeddingAnswerModel,
    response_model_exclude_none=True,
    responses={
        **_ERRORS,
        404: {
            "model": ErrorResponse,
            "description": "`unknown_node`, or `no_release`: no stored release of that query "
            "that the caller may replay",
        },
    },
)
async def free_embedding(
    request: Request,
    runtime: RuntimeDep,
    principal: PrincipalDep,
    node_id: NodeIdPath,
    epsilon: Epsilon = None,
    mode: ModeQuery = Mode.PERSONALIZED,
    mechanism: Annotated[
        RankingMechanism | None,
        Query(
            description="The ranking whose stored release to embed (as in GET /v1/ppr/{node}; "
            "`popular` has none). Default as there."
        ),
    ] = None,
    k: Dimension = None,
) -> Response:
    """The InstantEmbedding of the stored release of `GET /v1/ppr/{node_id}` with these
    `epsilon`, `mode` and `mechanism`, for a caller who may replay it: negatives clipped
    (scores that are not PPR mass scaled to sum 1), hashed with the graph version's hash
    functions. Post-processing of an answer already charged: charges nothing. A stored
    release keeps its top `PPR_REPLAY_STORE_TOP` entries only; `source` names the release."""
    _not_in_sandbox(runtime)
    query = FreeEmbeddingRequest(
        principal=principal, node=node_id, k=k, epsilon=epsilon, mode=mode,
        mechanism=mechanism, request_id=request.state.request_id,
    )  # fmt: skip
    answer = await run_in_threadpool(runtime.embeddings.free, query)
    request.state.epsilon_charged = 0.0
    request.state.outcome = "free_embedding"
    return _body(EmbeddingAnswerModel.of(answer))


@router.get(
    "/{node_id:embedding_node}",
    operation_id="getEmbedding",
    response_model=EmbeddingAnswerModel,
    response_model_exclude_none=True,
    responses=_ERRORS,
)
async def dp_embedding(
    request: Request,
    runtime: RuntimeDep,
    principal: PrincipalDep,
    _turn: EngineTurn,
    node_id: NodeIdPath,
    k: Dimension = None,
    sigma: Annotated[
        float | None,
        Query(
            gt=0,
            description="PushFlowCap's sensitivity sigma (PPR_EMBEDDING_MIN_SIGMA.."
            "PPR_EMBEDDING_MAX_SIGMA, default PPR_EMBEDDING_DEFAULT_SIGMA); noise scale "
            "sigma n / eps",
        ),
    ] = None,
    epsilon: Epsilon = None,
    mode: ModeQuery = Mode.PERSONALIZED,
    fresh: Annotated[
        QueryBool, Query(description="Draw new noise even if a release exists")
    ] = False,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """A DP-IE node embedding of `node_id` (Epasto et al.): PushFlowCap, InstantEmbedding with
    the graph version's hash functions, Laplace noise of scale sigma n / eps on each of the k
    coordinates. Charged like a ranking: to the seed user (`personalized`, joint DP, the answer
    for the seed only) or to the caller (`edge`, counted in the graph-wide exposure); an
    identical request replays the stored release free unless `fresh=true`."""
    one_header(request, "Idempotency-Key")
    _not_in_sandbox(runtime)
    query = EmbeddingRequest(
        principal=principal, node=node_id, k=k, sigma=sigma, epsilon=epsilon, mode=mode,
        fresh=fresh, idempotency_key=idempotency_key, request_id=request.state.request_id,
    )  # fmt: skip
    answer = await run_in_threadpool(runtime.embeddings.answer, query)
    count_answer(request, answer, mode, idempotency_key)
    return _body(EmbeddingAnswerModel.of(answer))


_BATCH_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "missing, malformed, unknown or revoked key"},
    403: {"model": ErrorResponse, "description": "`forbidden` (admin accounts; a sandbox)"},
    422: {
        "model": ErrorResponse,
        "description": "`invalid_parameter` for the whole call (too many nodes, bad k, sigma or "
        "epsilon)",
    },
    503: {
        "model": ErrorResponse,
        "description": "`overloaded` (the engine's queue is full; see Retry-After)",
    },
}


@router.post(
    "/batch",
    operation_id="postEmbeddingsBatch",
    response_model=EmbeddingBatchAnswer,
    responses=_BATCH_ERRORS,
)
def dp_embedding_batch(
    request: Request,
    runtime: RuntimeDep,
    principal: PrincipalDep,
    _turn: EngineTurn,
    body: EmbeddingBatchQuery,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """DP-IE embeddings for many seeds, one item per node in the order given.

    Each item is answered exactly as `GET /v1/embeddings/{node}` would be (admitted, charged,
    stored, replayed free unless `fresh`); an item that fails (`budget_exhausted`,
    `unknown_node`, `unknown_account`, `forbidden`, `mode_not_allowed`, ...) carries its own
    `error` and charges nothing; the others are answered. With an `Idempotency-Key`, each
    item gets a key derived from it, its position and its node (as in `POST /v1/ppr/batch`),
    so a retried batch charges no item twice.
    """
    one_header(request, "Idempotency-Key")
    _not_in_sandbox(runtime)
    check_batch_size(body.nodes, runtime.settings.batch_max_items)
    items = answer_embedding_batch(
        runtime.embeddings,
        runtime.batch.run_all,
        EmbeddingBatchRequest(
            principal=principal,
            nodes=body.nodes,
            k=body.k,
            sigma=body.sigma,
            epsilon=body.epsilon,
            mode=body.mode,
            fresh=body.fresh,
            idempotency_key=idempotency_key,
            request_id=request.state.request_id,
        ),
    )
    out, charged = item_bodies(items, _embedding_fields, body.mode)
    request.state.epsilon_charged = charged
    request.state.outcome = "batch"
    answered = {"items": out, "request_id": request.state.request_id, "epsilon_charged": charged}
    content = json.dumps(answered, separators=(",", ":"), allow_nan=False)
    return Response(content=content, media_type="application/json")


def _embedding_fields(answer: EmbeddingAnswer) -> dict[str, Any]:
    mechanism = EmbeddingMechanism(**answer.mechanism).model_dump(exclude_none=True)
    return {
        "graph_version": answer.graph_version,
        "embedding": answer.embedding,
        "mechanism": mechanism,
    }
