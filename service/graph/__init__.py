"""Graphs: the immutable :class:`Graph`, loading edge lists, the demo graph, a generator.

* :func:`load_edge_list` reads an edge-list file (plain/gzip/bzip2/xz) into a Graph.
* :func:`build_graph` makes a Graph from integer edge arrays.
* :func:`demo_graph` is the built-in graph of the embedded default (cached per process).
* :func:`generate_graph` / :func:`write_edge_list` make deterministic synthetic graphs and
  write edge lists (benchmarks, tests).

Each is imported from its module (``service.graph.model``, ``.build``, ``.loader``, ``.demo``,
``.generate``): the package itself imports nothing, so a process that reads only node ids or
public bounds (a ledger command) does not load scipy.
"""
