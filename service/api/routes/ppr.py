"""``GET /v1/ppr/{node_id}``: one private PPR answer, admitted and charged before any noise."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from service.api.deps import EngineTurn, PrincipalDep, RuntimeDep
from service.api.direct_route import DirectRoute
from service.api.error_responses import DuplicateHeader
from service.api.models import Budget, ErrorResponse, PprAnswer, Reads
from service.api.observability import count_answer
from service.api.params import K_LIMIT, IdempotencyKeyHeader, NodeIdPath, QueryBool
from service.errors import Forbidden
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode
from service.serving.refresh import REFRESH_HELP, REFRESH_PATTERN, parse_refresh
from service.serving.schemas import QueryRequest

router = APIRouter(prefix="/v1", tags=["queries"], route_class=DirectRoute)

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "missing, malformed, unknown or revoked key"},
    403: {
        "model": ErrorResponse,
        "description": "`forbidden`, `budget_exhausted` or `read_cap_exhausted`",
    },
    404: {"model": ErrorResponse, "description": "`unknown_node` or `unknown_account`"},
    409: {"model": ErrorResponse, "description": "`request_in_progress`"},
    422: {"model": ErrorResponse, "description": "`invalid_parameter`, naming it"},
}


def one_header(request: Request, name: str) -> None:
    """Refuse a request that sends ``name`` more than once (which one would count?)."""
    if len(request.headers.getlist(name)) > 1:
        raise DuplicateHeader(name)


@router.get(
    "/ppr/{node_id:node}",
    operation_id="getPpr",
    response_model=PprAnswer,
    response_model_exclude_none=True,  # mechanism fields that do not apply are absent
    responses={
        **_ERRORS,
        503: {
            "model": ErrorResponse,
            "description": "`overloaded` (the engine's queue is full; see Retry-After) or "
            "`ledger_unavailable`",
        },
    },
)
async def ppr(
    request: Request,
    runtime: RuntimeDep,
    principal: PrincipalDep,
    _turn: EngineTurn,
    node_id: NodeIdPath,
    k: Annotated[
        int | None,
        Query(
            ge=1, le=K_LIMIT, description="Results to return (1..PPR_MAX_K, default PPR_DEFAULT_K)"
        ),
    ] = None,
    epsilon: Annotated[
        float | None,
        Query(gt=0, description="Per-query epsilon (PPR_EPSILON_MIN..PPR_EPSILON_MAX)"),
    ] = None,
    mode: Annotated[Mode, Query(description="`personalized` or `edge`")] = Mode.PERSONALIZED,
    mechanism: Annotated[
        RankingMechanism | None,
        Query(
            description="The ranking: `noisy_diffusion`, `popular`, `common_neighbours`, "
            "`friends_of_friends` or `blended` (the last three personalized mode only: 422 in "
            "edge mode). Default "
            "PPR_DEFAULT_MECHANISM (friends_of_friends), or noisy_diffusion in edge mode when the "
            "default is personalized-only."
        ),
    ] = None,
    fresh: Annotated[
        QueryBool, Query(description="Draw new noise even if a release exists")
    ] = False,
    refresh: Annotated[str | None, Query(description=REFRESH_HELP, pattern=REFRESH_PATTERN)] = None,
    exclude_neighbors: Annotated[
        QueryBool, Query(description="Drop the seed's own neighbours (personalized mode only)")
    ] = False,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """A ranked list of nodes close to `node_id`, from the chosen private ranking.

    The seed is never in the list. The answer is charged to the seed user's budget
    (`personalized`) or to the caller (`edge` by a service account); a repeated query returns
    the stored release with `replayed: true`, its `released_at` and `age_seconds`, and costs
    nothing unless `fresh=true` or the `refresh` policy says it is due (`max_age:7d`: a
    release at least 7 days old is drawn anew).
    `popular` ranks the graph version's one degree release: the charged account pays its
    epsilon once per version (with its first answer built on it), nothing per query. An
    `Idempotency-Key` binds to the first answer given under it, `popular` included: its
    retries return that answer, any other query under it is 422. The `mechanism` block names
    what was used.
    """
    one_header(request, "Idempotency-Key")
    settings = runtime.settings
    policy = parse_refresh(refresh, fresh=fresh)
    query = QueryRequest(
        principal=principal,
        node=node_id,
        k=settings.default_k if k is None else k,
        epsilon=epsilon,
        mode=mode,
        fresh=policy.always,
        exclude_neighbors=exclude_neighbors,
        idempotency_key=idempotency_key,
        request_id=request.state.request_id,
        mechanism=mechanism,
        max_age_seconds=policy.max_age_seconds,
    )
    if runtime.sandbox is not None:  # a synthetic release, paid for once per account
        answer = await run_in_threadpool(runtime.sandbox.answer, query)
    elif runtime.coalescer is not None:  # with the queries around it, on the event loop
        answer = await runtime.coalescer.answer(query)
    else:
        answer = await run_in_threadpool(runtime.queries.answer, query)
    count_answer(request, answer, mode, idempotency_key)
    if runtime.sandbox is not None:
        request.state.outcome = "synthetic"
    # Serialized here, once: the model is already validated (FastAPI would dump it, validate
    # the dump again and dump that; the schema still comes from response_model).
    shown = PprAnswer.of(answer)
    if runtime.sandbox is not None:
        shown.synthetic = True
    body = shown.model_dump_json(by_alias=True, exclude_none=True)
    return Response(content=body, media_type="application/json")


@router.get("/me/budget", operation_id="getMyBudget", response_model=Budget, responses=_ERRORS)
def my_budget(runtime: RuntimeDep, principal: PrincipalDep) -> Budget:
    """The caller's own budget: spend composed by the RDP accountant at the account's delta."""
    return Budget.of(runtime.ledger.budgets.budget(principal.account_id))


@router.get("/me/reads", operation_id="getMyReads", response_model=Reads, responses=_ERRORS)
def my_reads(runtime: RuntimeDep, principal: PrincipalDep) -> Reads:
    """A service account's read figure: what all the answers it received reveal about any one
    edge, composed over every distinct release (fresh or replayed; the degree release once
    per graph version), and the cap on it."""
    if principal.type != "service":
        raise Forbidden("only service accounts have a read figure; users see /v1/me/budget")
    return Reads.of(
        runtime.ledger.read_figures.read_view(
            principal.account_id, default_cap_epsilon=runtime.settings.service_read_cap_epsilon
        )
    )
