"""``POST /v1/ppr/batch``: many seeds in one call, each charged as a single query would be."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request

from service.api.batch_models import BatchAnswer, BatchQuery
from service.api.compact_json import CompactJSONResponse
from service.api.deps import EngineTurn, PrincipalDep, RuntimeDep
from service.api.models import ErrorResponse
from service.api.observability import CHARGES, EPSILON_CHARGED, REFUSALS, REPLAYS
from service.api.params import IdempotencyKeyHeader
from service.api.routes.ppr import one_header
from service.api.strict import StrictRoute
from service.errors import InvalidParameter
from service.privacy.modes import Mode
from service.serving.batch import BatchItem, BatchRequest
from service.serving.refresh import parse_refresh
from service.serving.schemas import ChargedAnswer

router = APIRouter(prefix="/v1", tags=["queries"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "missing, malformed, unknown or revoked key"},
    403: {"model": ErrorResponse, "description": "`forbidden` (admin accounts cannot query)"},
    422: {
        "model": ErrorResponse,
        "description": "`invalid_parameter` for the whole call (too many nodes, bad k/epsilon)",
    },
    503: {
        "model": ErrorResponse,
        "description": "`overloaded` (the engine's queue is full; see Retry-After)",
    },
}


@router.post(
    "/ppr/batch", operation_id="postPprBatch", response_model=BatchAnswer, responses=_ERRORS
)
def ppr_batch(
    request: Request,
    runtime: RuntimeDep,
    principal: PrincipalDep,
    _turn: EngineTurn,
    body: BatchQuery,
    idempotency_key: IdempotencyKeyHeader = None,
) -> CompactJSONResponse:
    """Private PPR answers for many seeds, one item per node in the order given.

    Each item is admitted, charged and answered exactly as `GET /v1/ppr/{node}` would be
    (replays are free; `fresh` draws new noise). An item that fails (`budget_exhausted`,
    `unknown_node`, `unknown_account`, `forbidden`, ...) carries its own `error`; the others
    are answered. With an `Idempotency-Key`, each item gets a key derived from it and its
    position and node, so a retried batch charges no item twice.
    """
    one_header(request, "Idempotency-Key")
    settings = runtime.settings
    check_batch_size(body.nodes, settings.batch_max_items)
    policy = parse_refresh(body.refresh, fresh=body.fresh)
    answer_batch = runtime.batch.answer if runtime.sandbox is None else runtime.sandbox.answer_batch
    items = answer_batch(
        BatchRequest(
            principal=principal,
            nodes=body.nodes,
            k=settings.default_k if body.k is None else body.k,
            epsilon=body.epsilon,
            mode=body.mode,
            fresh=policy.always,
            exclude_neighbors=body.exclude_neighbors,
            mechanism=body.mechanism,
            max_age_seconds=policy.max_age_seconds,
            idempotency_key=idempotency_key,
            request_id=request.state.request_id,
        )
    )
    out, charged = item_bodies(
        items,
        lambda answer: {"results": [{"node": r.node, "score": r.score} for r in answer.results]},
        body.mode,
    )
    request.state.epsilon_charged = charged
    request.state.outcome = "batch"
    # Built directly (the schema above documents it): thousands of results per call are not
    # re-validated on the way out.
    answered: dict[str, Any] = {
        "items": out,
        "request_id": request.state.request_id,
        "epsilon_charged": charged,
    }
    if runtime.sandbox is not None:
        answered["synthetic"] = True
    return CompactJSONResponse(answered)


def check_batch_size(nodes: Sequence[str], most: int) -> None:
    """A batch carries at most ``most`` (PPR_BATCH_MAX_ITEMS) nodes: else 422 for the call."""
    if len(nodes) > most:
        raise InvalidParameter("nodes", f"at most {most} per call (PPR_BATCH_MAX_ITEMS)")


_A = TypeVar("_A", bound=ChargedAnswer)


def item_bodies(
    items: list[BatchItem[_A]],
    fields: Callable[[_A], dict[str, Any]],
    mode: Mode,
) -> tuple[list[dict[str, Any]], float]:
    """A batch's items as answered (``node``, the answer's ``fields``, ``replayed`` and
    ``epsilon_charged``; or ``node`` and ``error``) and the epsilon they were charged in total,
    counted in the metrics."""
    out: list[dict[str, Any]] = []
    charged = 0.0
    for item in items:
        answer = item.answer
        if answer is None:
            assert item.error is not None
            if item.error.code == "budget_exhausted":
                REFUSALS.labels(item.error.code).inc()
            out.append({"node": item.node, "error": item.error.to_dict()})
            continue
        out.append(
            {
                "node": item.node,
                **fields(answer),
                "replayed": answer.replayed,
                "epsilon_charged": answer.epsilon_charged,
            }
        )
        if answer.replayed:
            REPLAYS.labels("batch").inc()
        else:
            charged += answer.epsilon_charged
            CHARGES.labels(mode.value).inc()
            EPSILON_CHARGED.labels(mode.value).inc(answer.epsilon_charged)
    return out, charged
