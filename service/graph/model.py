"""The immutable in-memory graph every mechanism runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from service.errors import UnknownNode


@dataclass(frozen=True)
class GraphStats:
    """Summary numbers of a loaded graph (safe to show to admins; no per-node data)."""

    nodes: int
    edges: int
    degree_min: int
    degree_mean: float
    degree_max: int
    isolated_nodes: int
    self_loops_dropped: int = 0
    duplicate_edges_dropped: int = 0
    weights_ignored: bool = False
    source: str = ""


@dataclass(frozen=True, eq=False)
class Graph:
    """Undirected simple graph in CSR form with external-id maps and a content version.

    ``indptr``/``indices`` hold the symmetric adjacency (each undirected edge stored in both
    directions). ``node_ids[i]`` is the external id (a string token) of internal index ``i``.
    ``version`` is a hash of the canonical edge set and node ids: the same graph always has
    the same version, a changed graph a new one.
    """

    indptr: np.ndarray
    indices: np.ndarray
    degrees: np.ndarray
    node_ids: np.ndarray
    version: str
    stats: GraphStats
    _index: dict[str, int] = field(repr=False, compare=False)

    @property
    def n(self) -> int:
        return int(self.degrees.shape[0])

    @property
    def m(self) -> int:
        """Number of undirected edges."""
        return int(self.indices.shape[0] // 2)

    @cached_property
    def adjacency(self) -> sp.csr_matrix:
        """0/1 symmetric adjacency as a float64 CSR matrix sharing the index arrays."""
        data = np.ones(self.indices.shape[0], dtype=np.float64)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.n, self.n))

    def index_of(self, node: str) -> int:
        """Internal index of an external id; raises :class:`UnknownNode`."""
        try:
            return self._index[str(node)]
        except KeyError:
            raise UnknownNode(str(node)) from None

    def has_node(self, node: str) -> bool:
        return str(node) in self._index

    def external_ids(self, indices: np.ndarray) -> list[str]:
        """External ids of internal indices, in the same order."""
        return [str(x) for x in self.node_ids[np.asarray(indices, dtype=np.int64)]]

    def neighbors(self, index: int) -> np.ndarray:
        return self.indices[self.indptr[index] : self.indptr[index + 1]]

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (not counting the id dictionary)."""
        return int(
            self.indptr.nbytes + self.indices.nbytes + self.degrees.nbytes + self.node_ids.nbytes
        )
