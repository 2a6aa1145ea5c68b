"""Triangles for the edge-level generator: a bounded-sensitivity triangle statistic and the
affinity blocks (BTER-like) that put triangles into the synthetic graph.

**The released statistic.** Fix a priority order of the nodes drawn WITHOUT the data (a fresh
random permutation per run). Every node keeps its ``bound`` = D neighbours of smallest
priority, N_D(u). The projection H keeps the edge {u, v} iff v is in N_D(u) AND u is in
N_D(v); H has maximum degree D. The statistic is the number of triangles of H.

Sensitivity to one edge {x, y} (edge-level, any graph): only N_D(x) and N_D(y) can change, each
by y (resp. x) entering and at most one former member z (resp. z') leaving. So H changes by at
most three edges: {x, y} may appear, {x, z} and {y, z'} may disappear; every other pair keeps
its membership on both sides. In a graph of maximum degree D an edge lies in at most D - 1
triangles, so the count moves by at most D - 1 up (the new edge) and 2 (D - 1) down (the two
lost edges): **global l1 sensitivity 2 (D - 1)**, for every graph and every priority order
(``tests/unit/synthetic/test_triangles.py`` checks it by brute force on all graphs of 5 nodes).

The generator (service.synthetic.blocks) fits its affinity blocks so that the synthetic
graph's own truncated count (same D, the same priority order) matches the released one.

**The in-block edge count** along the public node order: the number of edges whose two ends
lie in the same run of ``size`` consecutive nodes (:func:`in_block_edges`). One edge is counted
at most once: **l1 sensitivity 1**, brute-forced in the same test.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def truncated_projection(
    indptr: np.ndarray, indices: np.ndarray, priority: np.ndarray, bound: int
) -> sp.csr_matrix:
    """H: the edges {u, v} with v among u's ``bound`` lowest-priority neighbours and u among
    v's (symmetric 0/1 CSR matrix of maximum degree ``bound``)."""
    n = int(indptr.size - 1)
    degrees = np.diff(indptr)
    rows = np.repeat(np.arange(n), degrees)
    cols = np.asarray(indices, dtype=np.int64)
    order = np.lexsort((priority[cols], rows))
    rank = np.arange(rows.size) - np.repeat(indptr[:-1], degrees)
    keep = rank < bound
    r, c = rows[order][keep], cols[order][keep]
    kept = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(n, n))
    mutual: sp.csr_matrix = kept.multiply(kept.T).tocsr()
    return mutual


def truncated_triangles(
    indptr: np.ndarray, indices: np.ndarray, priority: np.ndarray, bound: int
) -> float:
    """Triangles of the projection H (see the module docstring)."""
    h = truncated_projection(indptr, indices, priority, bound)
    return float((h @ h).multiply(h).sum() / 6.0)


def edges_to_csr(u: np.ndarray, v: np.ndarray, n: int) -> sp.csr_matrix:
    a = sp.csr_matrix((np.ones(u.size), (u, v)), shape=(n, n))
    out: sp.csr_matrix = (a + a.T).tocsr()
    out.data[:] = 1.0
    return out


def public_block_size(mean_degree: float, block_cap: int) -> int:
    """Size of the runs of the public order: the (released) mean degree + 1, in
    [3, ``block_cap``]."""
    return int(min(max(round(mean_degree) + 1, 3), max(block_cap, 3)))


def in_block_edges(indptr: np.ndarray, indices: np.ndarray, size: int) -> float:
    """Edges whose two ends lie in the same run of ``size`` consecutive nodes. One edge is
    counted at most once: l1 sensitivity 1."""
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    once = rows < indices
    return float(np.count_nonzero(rows[once] // size == indices[once] // size))
