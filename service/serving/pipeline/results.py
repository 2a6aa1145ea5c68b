"""A stored release's results as one query receives them: its top k, without the seed's
neighbours when the query asks (post-processing, free of privacy cost).

Fresh answers (:mod:`.answer`) and replays (:mod:`.replay`) both answer this way.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.graph.model import Graph
from service.mechanisms.postprocess import RankedNode
from service.serving.schemas import QueryRequest


def post_process(
    results: Sequence[RankedNode], req: QueryRequest, graph: Graph, seed: int
) -> list[RankedNode]:
    if req.exclude_neighbors:
        neighbours = set(graph.external_ids(graph.neighbors(seed)))
        results = [r for r in results if r.node not in neighbours]
    return list(results[: req.k])
