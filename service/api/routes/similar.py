"""``GET /v1/embeddings/similar/{node}``: a node's nearest neighbours among the released
edge-mode embeddings of the served graph version (service accounts only; free)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from service.api.deps import PrincipalDep, RuntimeDep
from service.api.models import EmbeddingReleaseInfo, ErrorResponse, SimilarAnswer, SimilarNode
from service.api.params import K_LIMIT, NodeIdPath
from service.api.runtime import Runtime
from service.api.strict import StrictRoute
from service.embeddings.similar import NoEmbeddingRelease
from service.errors import Forbidden, InvalidParameter, UnknownNode
from service.ledger.records import ModeNotAllowed
from service.serving.schemas import Principal

router = APIRouter(prefix="/v1", tags=["embeddings"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "missing, malformed, unknown or revoked key"},
    403: {
        "model": ErrorResponse,
        "description": "`forbidden` (not a service account), `mode_not_allowed` (no `edge` "
        "mode) or `read_cap_exhausted`",
    },
    404: {
        "model": ErrorResponse,
        "description": "`unknown_node`, `node_not_in_release` or `no_embedding_release` (none "
        "for the served graph version)",
    },
    422: {"model": ErrorResponse, "description": "`invalid_parameter`, naming it"},
    503: {"model": ErrorResponse, "description": "`ledger_unavailable`"},
}


def _answer(
    runtime: Runtime, principal: Principal, node: str, k: int, request_id: str
) -> SimilarAnswer:
    settings = runtime.settings
    if principal.type != "service":
        raise Forbidden(
            "similar nodes are for service accounts (they pool every node's embedding); a "
            "user queries its own rankings at /v1/ppr/{node}"
        )
    if "edge" not in principal.modes:
        raise ModeNotAllowed(
            "similar nodes come from edge-mode embeddings; this service account may query in "
            f"{', '.join(principal.modes)} mode only (accounts set-scopes --modes)",
            details={"mode": "edge", "modes": list(principal.modes)},
        )
    if k > settings.max_k:
        raise InvalidParameter("k", f"must be at most {settings.max_k} (PPR_MAX_K)")
    graph = runtime.graphs.current
    if not graph.has_node(node):
        raise UnknownNode(node)
    assert runtime.similar is not None
    index = runtime.similar.current(graph.version)
    release = index.release
    found = index.neighbours(node, k, settings.similar_ef)
    # The answer reveals (part of) the release: it counts in the reader's read figure once.
    runtime.ledger.read_figures.record_reads(
        principal.account_id,
        graph_release=(str(release["graph_version"]), str(release["release_name"])),
        default_cap_epsilon=settings.service_read_cap_epsilon,
    )
    params = release["parameters"]
    return SimilarAnswer(
        node=node,
        graph_version=graph.version,
        results=[SimilarNode(node=n, similarity=s) for n, s in found],
        release=EmbeddingReleaseInfo(
            name=release["release_name"],
            graph_version=release["graph_version"],
            method=release["method"],
            mode=release["mode"],
            privacy_unit=release["privacy_unit"],
            nodes=release["nodes"],
            epsilon_per_node=release["epsilon_per_node"],
            epsilon=release["epsilon"],
            k=params["k"],
            sigma=params["sigma"],
        ),
        index=(
            "exact search (usearch, cosine): the release measured its approximate index's "
            "recall@10 below 0.95"
            if index.exact(settings.similar_ef)
            else "approximate nearest neighbours (usearch HNSW, cosine; recall@10 against "
            "exact search measured at 0.95 or more when the release was made)"
        ),
        epsilon_charged=0.0,
        cost="free: post-processing of the all-node edge-mode embedding release named here, "
        "charged once to the graph-wide exposure when it was made",
        request_id=request_id,
    )


@router.get(
    "/embeddings/similar/{node_id:node}",
    operation_id="getSimilarNodes",
    response_model=SimilarAnswer,
    responses=_ERRORS,
)
async def similar_nodes(
    request: Request,
    runtime: RuntimeDep,
    principal: PrincipalDep,
    node_id: NodeIdPath,
    k: Annotated[
        int,
        Query(ge=1, le=K_LIMIT, description="Neighbours to return (1..PPR_MAX_K, default 10)"),
    ] = 10,
) -> SimilarAnswer:  # fmt: skip
    """The nodes whose released edge-mode embeddings are nearest to `node_id`'s (cosine, an
    approximate index), from the all-node embedding release of the served graph version.

    Service accounts with `edge` mode only. Free: the answer is post-processing of a release
    that was charged once to the graph-wide exposure when an admin made it (`embeddings
    release`); it counts once in the caller's read figure. 404 `no_embedding_release` when
    there is none for the served version.
    """
    request.state.outcome = "graph_release"
    return await run_in_threadpool(
        _answer, runtime, principal, node_id, k, request.state.request_id
    )


__all__ = ["NoEmbeddingRelease", "router"]
