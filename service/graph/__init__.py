"""Loading edge lists into the immutable :class:`Graph`."""

from service.graph.model import Graph, GraphStats

__all__ = ["Graph", "GraphStats"]
