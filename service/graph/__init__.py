"""Graphs: the immutable :class:`Graph`, loading edge lists, the demo graph, a generator.

* :func:`load_edge_list` reads an edge-list file (plain/gzip/bzip2/xz) into a Graph.
* :func:`build_graph` makes a Graph from integer edge arrays.
* :func:`demo_graph` is the built-in graph of the embedded default (cached per process).
* :func:`generate_graph` / :func:`write_edge_list` make deterministic synthetic graphs and
  write edge lists (benchmarks, tests).
"""

from service.graph.build import build_graph
from service.graph.demo import demo_graph
from service.graph.generate import generate_graph, write_edge_list, write_generated_edge_list
from service.graph.loader import load_edge_list
from service.graph.model import Graph, GraphStats

__all__ = [
    "Graph",
    "GraphStats",
    "build_graph",
    "demo_graph",
    "generate_graph",
    "load_edge_list",
    "write_edge_list",
    "write_generated_edge_list",
]
