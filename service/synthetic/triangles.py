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
(``tests/test_synthetic_triangles.py`` checks it by brute force on all graphs of 5 nodes).

**The generator's use of it** (post-processing only): a BTER-like model (Seshadhri, Kolda and
Pinar, Phys. Rev. E 2012). Nodes are sorted by their released degree and cut into affinity
blocks of (smallest degree + 1) nodes; every pair inside a block is an edge with probability
rho; the degree a node has left over goes to the configuration model. rho is fitted so that the
synthetic graph's own truncated triangle count (same D, the same priority order) matches the
released one: the fit reads only released numbers and synthetic graphs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from service.synthetic.sampling import simple_edges

Edges = tuple[np.ndarray, np.ndarray]


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


def affinity_blocks(degrees: np.ndarray, block_cap: int, order: np.ndarray) -> list[np.ndarray]:
    """BTER's blocks: nodes of degree >= 2 in ascending degree (``order`` breaks ties), cut into
    consecutive blocks of (the block's smallest degree + 1) nodes, at most ``block_cap``."""
    ranked = order[degrees[order] >= 2]
    blocks: list[np.ndarray] = []
    i = 0
    while i < ranked.size:
        size = int(min(degrees[ranked[i]] + 1, block_cap))
        blocks.append(ranked[i : i + size])
        i += size
    return [b for b in blocks if b.size >= 2]


def block_pairs(blocks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every pair inside every block, as two index arrays."""
    us: list[np.ndarray] = [np.empty(0, np.int64)]
    vs: list[np.ndarray] = [np.empty(0, np.int64)]
    for block in blocks:
        iu, iv = np.triu_indices(block.size, 1)
        us.append(block[iu])
        vs.append(block[iv])
    return np.concatenate(us), np.concatenate(vs)


def bter_graph(
    degrees: np.ndarray,
    rho: float,
    pairs: tuple[np.ndarray, np.ndarray],
    draws: np.ndarray,
    rest: Callable[[np.ndarray], Edges],
) -> Edges:
    """Block pairs whose uniform ``draws`` fall below ``rho``, plus ``rest(excess degrees)``
    (the configuration model of what the blocks left over)."""
    n = degrees.size
    chosen = draws < rho
    bu, bv = pairs[0][chosen], pairs[1][chosen]
    used = np.bincount(np.concatenate([bu, bv]), minlength=n)
    excess = np.maximum(degrees - used, 0)
    cu, cv = rest(excess)
    return simple_edges(np.concatenate([bu, cu]), np.concatenate([bv, cv]), n)


def fit_affinity(
    degrees: np.ndarray,
    target: float,
    priority: np.ndarray,
    bound: int,
    block_cap: int,
    rest: Callable[[np.ndarray, np.random.Generator], Edges],
    rng: np.random.Generator,
    steps: int = 12,
) -> tuple[Edges, float]:
    """The BTER graph whose truncated triangle count is closest to ``target`` over rho in
    [0, 1] (bisection with common random numbers), and that rho. Post-processing: ``degrees``,
    ``target`` and ``priority`` are released or data-independent."""
    n = degrees.size
    order = np.lexsort((rng.random(n), degrees))
    pairs = block_pairs(affinity_blocks(degrees, block_cap, order))
    draws = rng.random(pairs[0].size)
    seed = int(rng.integers(2**63))

    def graph(rho: float) -> Edges:
        def excess(d: np.ndarray) -> Edges:
            return rest(d, np.random.default_rng(seed))

        return bter_graph(degrees, rho, pairs, draws, excess)

    def count(edges: Edges) -> float:
        h = edges_to_csr(edges[0], edges[1], n)
        return truncated_triangles(h.indptr, h.indices, priority, bound)

    best = graph(0.0)
    best_rho, best_gap = 0.0, abs(count(best) - target)
    if target <= count(best) or pairs[0].size == 0:
        return best, best_rho
    low, high = 0.0, 1.0
    for _ in range(steps):
        mid = 0.5 * (low + high)
        edges = graph(mid)
        found = count(edges)
        if abs(found - target) < best_gap:
            best, best_rho, best_gap = edges, mid, abs(found - target)
        if found < target:
            low = mid
        else:
            high = mid
    return best, best_rho
