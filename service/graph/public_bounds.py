"""Public bounds a graph is checked against before it is served.

Anything the noise is calibrated with must be public: the float64 margin of the diffusion
(kappa, :mod:`service.privacy.floating`) and that of DP-IE's PushFlowCap
(:mod:`service.mechanisms.pushflowcap_rounding`) grow with the largest degree, so they are
computed from a configured bound on degrees (``PPR_MAX_DEGREE_BOUND``,
:func:`public_degree_bound`), and a graph that exceeds the bound is refused rather than served
with a margin that would not cover it. Likewise a configured bound
on the number of edges (``PPR_EDGE_COUNT_BOUND``), when delta is derived from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.errors import GraphLoadError

if TYPE_CHECKING:  # a type only: the settings read these bounds without loading scipy
    from service.graph.model import Graph

#: Default PPR_MAX_DEGREE_BOUND. kappa at 10,000 (eta 1e-7, beta 0.8) is 2.3e-4: the noise
#: grows by 0.023%; the demo graph (largest degree 266), ego-Facebook (1,045) and the
#: generated 100k-node/2M-edge bench graph (1,908; seed 0) fit well under it.
DEFAULT_MAX_DEGREE_BOUND = 10_000
#: Largest accepted PPR_MAX_DEGREE_BOUND: kappa is 0.22 at 100,000 (22% more noise), and it
#: grows as the cube of the bound.
MAX_DEGREE_BOUND_LIMIT = 100_000


def public_degree_bound(graph: Graph) -> int:
    """The degree bound the float64 margins (kappa, DP-IE's rounding margin) are computed from:
    the graph's public bound (PPR_MAX_DEGREE_BOUND, attached and checked by the serving path),
    never its own largest degree. A graph never checked against a bound (evaluation, the
    operator's ``query``) uses the default bound, or its own largest degree if that is higher
    (such a margin depends on the graph, so nothing served takes that branch)."""
    if graph.degree_bound is not None:
        return graph.degree_bound
    return max(DEFAULT_MAX_DEGREE_BOUND, graph.stats.degree_max)


def check_public_bounds(
    graph: Graph, *, max_degree_bound: int, edge_count_bound: int | None = None
) -> None:
    """Raise :class:`GraphLoadError` (naming the setting) if ``graph`` exceeds a bound."""
    source = graph.stats.source or "graph"
    if graph.stats.degree_max > max_degree_bound:
        raise GraphLoadError(
            source,
            f"a node has more than PPR_MAX_DEGREE_BOUND = {max_degree_bound} edges; raise "
            "the bound (a public setting) or load another graph",
        )
    if edge_count_bound is not None and graph.m > edge_count_bound:
        raise GraphLoadError(
            source,
            f"the graph has more than PPR_EDGE_COUNT_BOUND = {edge_count_bound} edges; raise "
            "the bound (a public setting) or load another graph",
        )
