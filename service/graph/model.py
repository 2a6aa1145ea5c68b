"""The immutable in-memory graph every mechanism runs on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from service.errors import UnknownNode
from service.graph.node_ids import NodeIds

if TYPE_CHECKING:
    import scipy.sparse as sp


#: Graphs with at most this many nodes are walked through a 16-bit copy of their column
#: indices (:attr:`Graph.compact_indices`): the stream of indices a pass reads halves, and on a
#: graph the size of the held-out blog network (10,312 nodes, 667,966 entries) each thread's
#: half of it fits in its core's 1 MiB L2 cache. 94 width-1 passes there, split over two
#: threads: 57-62 against 44-49 ms. The sums are the same bit for bit (same entries, order).
COMPACT_INDEX_NODES = 1 << 16


@dataclass(frozen=True)
class GraphStats:
    """Summary numbers of a loaded graph (safe to show to admins; no per-node data).

    ``self_loops_dropped`` and ``duplicate_edges_dropped`` count input records (lines of an
    edge-list file, entries of an edge array); a repeat listed in the other direction (``v u``
    after ``u v``) counts as a duplicate. ``weights_ignored`` is set when the input had a third
    column, ``extra_columns_ignored`` when some line had more than three.
    """

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
    extra_columns_ignored: bool = False
    header_skipped: bool = False


@dataclass(frozen=True, eq=False)
class Graph:
    """Undirected simple graph in CSR form with external-id maps and a content version.

    ``indptr``/``indices`` hold the symmetric adjacency (each undirected edge stored in both
    directions, every neighbour list sorted ascending, no self-loops). ``indices`` is int32
    when the node count fits (always, in practice) and ``indptr`` has the same dtype unless the
    number of stored entries needs int64, so scipy can wrap both without a copy. ``degrees`` is
    int64 and equals ``np.diff(indptr)``. ``ids`` holds the external id of each internal index
    and maps ids back (:mod:`service.graph.node_ids`: in memory, or packed in a memory-mapped
    snapshot that every worker of a machine shares); ``node_ids[i]`` is the id of index ``i``
    as an object array of ``str``.

    ``fingerprint`` is a hash of the canonical edge set and node ids (see
    :func:`service.graph.build.graph_version`): the same graph always has the same fingerprint,
    whatever the file's line order, separators, duplicates or compression; a changed graph a
    new one. It is an exact function of the private edges, so it stays internal (admins may
    see it). ``version`` is what callers see: a builder sets it to the fingerprint, and the
    serving path replaces it with the opaque public id the ledger records against the
    fingerprint (:mod:`service.serving.graph_identity`) before the graph answers anything.
    ``degree_bound`` is the configured public bound on degrees (``PPR_MAX_DEGREE_BOUND``) the
    serving path checked the graph against; the float64 margin of the noise uses it, never
    the graph's own largest degree (None: not bound, e.g. in evaluation runs).
    Use :func:`service.graph.build.build_graph` (or the loader) to make one: it puts the nodes
    in canonical order and computes the fingerprint. Arrays are made read-only.
    """

    indptr: np.ndarray
    indices: np.ndarray
    degrees: np.ndarray
    ids: NodeIds = field(repr=False, compare=False)
    version: str
    stats: GraphStats
    derived: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    """Per-node float arrays precomputed elsewhere (a snapshot maps them; see below)."""
    fingerprint: str = ""
    degree_bound: int | None = None

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", self.version)
        if self.indptr.shape[0] != self.degrees.shape[0] + 1:
            raise ValueError("indptr must have one entry more than degrees")
        if len(self.ids) != self.degrees.shape[0]:
            raise ValueError("ids and degrees must have the same length")
        for array in (self.indptr, self.indices, self.degrees):
            if array.flags.writeable:
                array.setflags(write=False)

    @cached_property
    def node_ids(self) -> np.ndarray:
        """External id of every internal index (object array of ``str``; a packed table
        builds it on first use, so the serving path reads ``ids`` instead)."""
        return self.ids.as_array()

    def _mapped_or(self, name: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The derived array ``name`` mapped from a snapshot, else ``compute()`` made
        read-only."""
        mapped = self.derived.get(name)
        if mapped is not None:
            return mapped
        out = compute()
        out.setflags(write=False)
        return out

    @cached_property
    def float_degrees(self) -> np.ndarray:
        """``degrees`` as float64 (read-only; mapped from a snapshot when there is one)."""
        return self._mapped_or("float_degrees", lambda: self.degrees.astype(np.float64))

    @cached_property
    def compact_indices(self) -> np.ndarray:
        """The column indices the walk kernels read: a read-only uint16 copy of ``indices``
        (2 bytes an entry; mapped from a snapshot when there is one, so the workers share it)
        when the graph has at most :data:`COMPACT_INDEX_NODES` nodes, else ``indices``."""
        if self.n > COMPACT_INDEX_NODES:
            return self.indices
        return self._mapped_or("compact_indices", lambda: self.indices.astype(np.uint16))

    @cached_property
    def inverse_degrees(self) -> np.ndarray:
        """1 / degree, 0 for an isolated node (float64, read-only; mapped from a snapshot
        when there is one)."""

        def inverse() -> np.ndarray:
            d = self.float_degrees
            out: np.ndarray = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
            return out

        return self._mapped_or("inverse_degrees", inverse)

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
        import scipy.sparse as sp  # here: the commands that only read a graph's ids skip it

        data = np.ones(self.indices.shape[0], dtype=np.float64)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.n, self.n))

    def index_of(self, node: str) -> int:
        """Internal index of an external id; raises :class:`UnknownNode`."""
        index = self.ids.index(str(node))
        if index is None:
            raise UnknownNode(str(node))
        return index

    def has_node(self, node: str) -> bool:
        return self.ids.index(str(node)) is not None

    def external_ids(self, indices: np.ndarray) -> list[str]:
        """External ids of internal indices, in the same order."""
        return self.ids.names(np.asarray(indices, dtype=np.int64))

    def external_ids_utf8(self, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The same ids as concatenated UTF-8 bytes and their lengths (no string per id)."""
        return self.ids.utf8_names(np.asarray(indices, dtype=np.int64))

    def neighbors(self, index: int) -> np.ndarray:
        return self.indices[self.indptr[index] : self.indptr[index + 1]]

    def edge_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Each undirected edge once, as internal indices ``(u, v)`` with ``u < v``, sorted."""
        rows = np.repeat(np.arange(self.n, dtype=self.indices.dtype), self.degrees)
        upper = self.indices > rows
        return rows[upper], self.indices[upper]

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (not counting the id dictionary)."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.degrees.nbytes + self.ids.nbytes)
