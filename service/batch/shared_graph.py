"""A graph as plain arrays, for an object store that hands workers read-only zero-copy views.

Ray stores numpy arrays in its shared-memory object store and deserializes them as read-only
views of that memory, so every worker on a machine maps the same CSR arrays (``indptr``,
``indices``, ``degrees``) and the node ids (a fixed-width unicode array) without copying them.
What each worker still builds for itself is what :class:`Graph` needs as Python objects: the
ids as ``str`` and the id -> index dictionary (O(n), about 100 bytes per node), plus the walk
operator's float32 data (4 bytes per stored edge entry).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from service.graph.model import Graph, GraphStats
from service.graph.node_ids import ListedIds


@dataclass(frozen=True)
class SharedGraph:
    indptr: np.ndarray
    indices: np.ndarray
    degrees: np.ndarray
    node_ids: np.ndarray  # fixed-width unicode ("<U..."), not objects: zero-copy in the store
    version: str
    stats: GraphStats
    fingerprint: str = ""
    degree_bound: int | None = None

    @classmethod
    def of(cls, graph: Graph) -> SharedGraph:
        ids = np.asarray([str(x) for x in graph.node_ids.tolist()], dtype=np.str_)
        return cls(
            graph.indptr, graph.indices, graph.degrees, ids, graph.version, graph.stats,
            graph.fingerprint, graph.degree_bound,
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        return int(
            self.indptr.nbytes + self.indices.nbytes + self.degrees.nbytes + self.node_ids.nbytes
        )

    def graph(self) -> Graph:
        """The Graph over these arrays (the CSR arrays are used as they are, not copied)."""
        id_list: list[str] = self.node_ids.tolist()
        return Graph(
            indptr=self.indptr,
            indices=self.indices,
            degrees=self.degrees,
            ids=ListedIds(id_list),
            version=self.version,
            stats=self.stats,
            fingerprint=self.fingerprint,
            degree_bound=self.degree_bound,
        )


_graphs: dict[str, Graph] = {}
_lock = threading.Lock()


def graph_from_shared(shared: SharedGraph) -> Graph:
    """This process's Graph of ``shared`` (rebuilt once per version; the last one is kept)."""
    with _lock:
        graph = _graphs.get(shared.version)
        if graph is None:
            graph = shared.graph()
            _graphs.clear()
            _graphs[shared.version] = graph
        return graph
