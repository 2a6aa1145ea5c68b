"""What callers may see of a graph version: an opaque public id, never its content hash.

A graph's content fingerprint (:func:`service.graph.build.graph_version`) is an exact function
of the private edges: shown to callers, it would let anyone who knows the rest of the graph test
an edge with certainty, and tell them whether a reload changed anything. So the serving path
swaps it for a public id that the ledger records against the fingerprint: random when the
fingerprint is new, the recorded one otherwise (insert-if-absent, then read back: every worker,
restart and replica agrees because the database decides). Before that, the graph is checked
against the configured public bounds (:mod:`service.graph.public_bounds`), and the degree bound is
attached: the diffusion's float64 margin is computed from it, not from the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from service.graph.model import Graph
from service.graph.public_bounds import check_public_bounds

if TYPE_CHECKING:
    from service.config import Settings


class GraphIdentities(Protocol):
    """Where public graph ids are recorded (the ledger database)."""

    def public_graph_version(self, fingerprint: str) -> str: ...


def as_served(
    graph: Graph,
    identities: GraphIdentities,
    *,
    max_degree_bound: int,
    edge_count_bound: int | None = None,
) -> Graph:
    """``graph`` checked against the public bounds, with its public id as ``version`` and
    the degree bound attached. Raises :class:`~service.errors.GraphLoadError` if a bound is
    exceeded (the caller keeps serving what it had)."""
    check_public_bounds(graph, max_degree_bound=max_degree_bound, edge_count_bound=edge_count_bound)
    public = identities.public_graph_version(graph.fingerprint)
    return dataclasses.replace(graph, version=public, degree_bound=max_degree_bound)


def serving_loader(
    settings: Settings, identities: GraphIdentities
) -> Callable[[Path | None], Graph]:
    """The loader of a serving process: the configured graph (or ``path``) with its node list,
    snapshot and public identity."""
    from service.graph.configured import load_configured_graph

    snapshot_dir = settings.snapshot_directory

    def load(path: Path | None) -> Graph:
        graph = load_configured_graph(path, snapshot_dir, settings.nodes_path)
        return as_served(
            graph, identities,
            max_degree_bound=settings.max_degree_bound,
            edge_count_bound=settings.edge_count_bound,
        )  # fmt: skip

    return load
