"""Building the immutable :class:`Graph` from integer edge arrays.

Everything here is vectorised (numpy sorts and scatters, no Python loop over edges). The
same steps serve the file loader, the generator and the demo graph, so a graph has the same
``version`` however it was made.

Canonical form
--------------
* Node order: if every external id is a canonical decimal integer (``0`` or a digit string
  without a leading zero, at most 18 digits) the nodes are ordered by numeric value;
  otherwise by the ids' UTF-8 bytes (which is also Python's ``str`` order).
* Edges: self-loops dropped, each undirected edge kept once as ``(lo, hi)`` with ``lo < hi``.
* ``version``: the first :data:`VERSION_HEX_CHARS` hex characters of the SHA-256 of
  ``b"dp-ppr-graph/1\\n"``, ``f"{n} {m}\\n"``, the node ids in canonical order joined by
  ``"\\n"`` (UTF-8), a ``"\\n"``, and the sorted edge keys ``lo * n + hi`` as little-endian
  int64. It depends on nothing but the node-id set and the edge set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from service.graph.model import Graph, GraphStats
from service.graph.node_ids import ListedIds, is_canonical_int

VERSION_HEX_CHARS = 20
_VERSION_TAG = b"dp-ppr-graph/1\n"
_HASH_BLOCK = 1 << 22  # keys hashed in slices of 4M (32 MB) to avoid a second full copy
INT32_MAX = int(np.iinfo(np.int32).max)


def canonical_order(node_ids: Sequence[str]) -> np.ndarray:
    """Permutation putting ``node_ids`` in canonical order (numeric, else by UTF-8 bytes)."""
    if all(is_canonical_int(s) for s in node_ids):
        keys = np.fromiter((int(s) for s in node_ids), dtype=np.int64, count=len(node_ids))
        return np.argsort(keys, kind="stable")
    return np.array(sorted(range(len(node_ids)), key=node_ids.__getitem__), dtype=np.int64)


def index_dtype(n: int) -> np.dtype[np.signedinteger]:
    """int32 when indices below ``n`` fit in it, else int64."""
    return np.dtype(np.int32) if n <= INT32_MAX else np.dtype(np.int64)


def canonical_edge_keys(
    src: npt.ArrayLike, dst: npt.ArrayLike, n: int
) -> tuple[np.ndarray, int, int]:
    """Sorted unique keys ``lo * n + hi`` of the undirected edges, plus the counts of
    self-loop records and duplicate records dropped."""
    u = np.asarray(src)
    v = np.asarray(dst)
    if u.shape != v.shape or u.ndim != 1:
        raise ValueError("src and dst must be 1-d arrays of the same length")
    if u.size == 0:
        return np.empty(0, dtype=np.int64), 0, 0
    lo = np.minimum(u, v)
    hi = np.maximum(u, v)
    if int(lo.min()) < 0 or int(hi.max()) >= n:
        raise ValueError(f"edge endpoints must lie in [0, {n})")
    proper = lo != hi
    self_loops = int(u.size - np.count_nonzero(proper))
    keys = lo.astype(np.int64)
    del lo
    keys *= n
    keys += hi
    del hi
    if self_loops:
        keys = keys[proper]
    del proper
    keys = sorted_unique(keys)
    duplicates = int(u.size - self_loops - keys.size)
    return keys, self_loops, duplicates


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending; sorts ``values`` in place (faster and leaner than
    ``np.unique``, whose hash-based path is slow on large int64 arrays)."""
    values.sort()
    if values.size < 2:
        return values
    fresh = np.empty(values.size, dtype=bool)
    fresh[0] = True
    np.not_equal(values[1:], values[:-1], out=fresh[1:])
    return values[fresh]


def csr_from_keys(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric CSR ``(indptr, indices, degrees)`` from sorted unique edge keys.

    Row ``r`` lists first its neighbours below ``r`` then those above, each part sorted, so
    the whole row is sorted without a per-row sort: the "above" part is the keys in order, the
    "below" part the keys re-sorted by ``(hi, lo)``. Positions use the indptr dtype, so the
    temporaries stay small.
    """
    m = int(keys.size)
    idx = index_dtype(n)
    ptr = idx if 2 * m <= INT32_MAX else np.dtype(np.int64)
    lo = np.empty(m, dtype=idx)
    hi = np.empty(m, dtype=idx)
    np.floor_divide(keys, n, out=lo, casting="unsafe")  # no int64 temporaries
    np.remainder(keys, n, out=hi, casting="unsafe")
    below = np.bincount(hi, minlength=n)  # neighbours smaller than the row
    above = np.bincount(lo, minlength=n)
    degrees = (below + above).astype(np.int64)
    indptr = np.zeros(n + 1, dtype=ptr)
    np.cumsum(degrees, out=indptr[1:])
    indices = np.empty(2 * m, dtype=idx)
    if m == 0:
        return indptr, indices, degrees
    counter = np.arange(m, dtype=ptr)
    # "above" entries: row lo, column hi, already in (lo, hi) order; entry j of row r goes to
    # indptr[r] + below[r] + (j - first key of row r).
    first_above = np.cumsum(above) - above
    offset = (indptr[:-1] + below - first_above).astype(ptr)
    pos = offset[lo]
    pos += counter
    indices[pos] = hi
    # "below" entries: row hi, column lo, in (hi, lo) order; entry j of row r goes to
    # indptr[r] + (j - first such entry of row r).
    rev = hi.astype(np.int64)
    del hi
    rev *= n
    rev += lo
    del lo
    rev.sort()
    cols = np.empty(m, dtype=idx)
    rows = np.empty(m, dtype=idx)
    np.remainder(rev, n, out=cols, casting="unsafe")
    np.floor_divide(rev, n, out=rows, casting="unsafe")
    del rev
    first_below = np.cumsum(below) - below
    offset = (indptr[:-1] - first_below).astype(ptr)
    pos = offset[rows]
    pos += counter
    del rows, counter
    indices[pos] = cols
    return indptr, indices, degrees


def graph_version(node_ids: Sequence[str], keys: np.ndarray, n: int) -> str:
    """Content hash of a graph in canonical form (see the module docstring)."""
    h = hashlib.sha256(_VERSION_TAG)
    h.update(f"{n} {keys.size}\n".encode())
    h.update("\n".join(node_ids).encode("utf-8"))
    h.update(b"\n")
    little = keys.astype("<i8", copy=False)
    for start in range(0, little.size, _HASH_BLOCK):
        h.update(np.ascontiguousarray(little[start : start + _HASH_BLOCK]).tobytes())
    return h.hexdigest()[:VERSION_HEX_CHARS]


def assemble_graph(
    keys: np.ndarray,
    node_ids: list[str],
    *,
    self_loops_dropped: int = 0,
    duplicate_edges_dropped: int = 0,
    source: str = "",
    weights_ignored: bool = False,
    extra_columns_ignored: bool = False,
    header_skipped: bool = False,
) -> Graph:
    """The Graph of canonical edge keys over nodes already in canonical order."""
    n = len(node_ids)
    indptr, indices, degrees = csr_from_keys(keys, n)
    version = graph_version(node_ids, keys, n)
    m = int(keys.size)
    stats = GraphStats(
        nodes=n,
        edges=m,
        degree_min=int(degrees.min()) if n else 0,
        degree_mean=2.0 * m / n if n else 0.0,
        degree_max=int(degrees.max(initial=0)),
        isolated_nodes=int(np.count_nonzero(degrees == 0)),
        self_loops_dropped=self_loops_dropped,
        duplicate_edges_dropped=duplicate_edges_dropped,
        weights_ignored=weights_ignored,
        source=source,
        extra_columns_ignored=extra_columns_ignored,
        header_skipped=header_skipped,
    )
    return Graph(
        indptr=indptr,
        indices=indices,
        degrees=degrees,
        ids=ListedIds(list(node_ids)),
        version=version,
        stats=stats,
    )


def build_graph(
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    node_ids: Sequence[str] | None = None,
    *,
    num_nodes: int | None = None,
    source: str = "",
) -> Graph:
    """Undirected simple Graph from integer endpoint arrays.

    ``src[i]``-``dst[i]`` is an edge between positions in ``node_ids`` (external ids, which
    must be distinct). Without ``node_ids`` the nodes are ``"0" .. str(n - 1)`` with
    ``n = num_nodes`` or one more than the largest endpoint. Self-loops and repeated edges
    (either direction) are dropped and counted in ``stats``; nodes are put in canonical
    order, so the result equals the loaded graph of the same edge list, version included.
    """
    u = np.asarray(src)
    v = np.asarray(dst)
    for name, a in (("src", u), ("dst", v)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must hold integers, not {a.dtype}")
    if node_ids is None:
        top = int(max(u.max(initial=-1), v.max(initial=-1))) + 1
        n = top if num_nodes is None else int(num_nodes)
        if n < top:
            raise ValueError(f"num_nodes={n} but an endpoint is {top - 1}")
        ids = [str(i) for i in range(n)]
    else:
        ids = [str(s) for s in node_ids]
        n = len(ids)
        if num_nodes is not None and num_nodes != n:
            raise ValueError("num_nodes disagrees with len(node_ids)")
        if len(set(ids)) != n:
            raise ValueError("node_ids must be distinct")
        low = min(int(u.min(initial=0)), int(v.min(initial=0)))
        if low < 0 or max(int(u.max(initial=-1)), int(v.max(initial=-1))) >= n:
            raise ValueError(f"edge endpoints must lie in [0, {n})")
        order = canonical_order(ids)
        if not np.array_equal(order, np.arange(n)):
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n, dtype=np.int64)
            u = rank[np.asarray(u, dtype=np.int64)]
            v = rank[np.asarray(v, dtype=np.int64)]
            ids = [ids[i] for i in order.tolist()]
    keys, loops, dups = canonical_edge_keys(u, v, n)
    return assemble_graph(
        keys, ids, self_loops_dropped=loops, duplicate_edges_dropped=dups, source=source
    )
