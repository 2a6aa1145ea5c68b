"""The edge-level generator's graph: two layers of dense local pairs, then a configuration model
of the degree left over. Pure post-processing of released numbers.

- **Band** (only when the released in-block edge count says the public node order is local):
  every pair of nodes at most ``size - 1`` apart in the public order, kept with probability
  rho_band * min(1, smaller degree / (2 (size - 1))). rho_band is fitted so that the synthetic
  graph's in-block edge count matches the released one.
- **Affinity blocks** (BTER: Seshadhri, Kolda and Pinar, Phys. Rev. E 2012): nodes sorted by
  released degree, cut into blocks of (the block's smallest degree + 1) nodes, at most
  ``block_cap``; every pair inside a block kept with probability rho_bter. rho_bter is fitted
  (after rho_band) so that the synthetic graph's truncated triangle count matches the released
  one.
- **The rest**: each node's released degree minus its layer edges goes to ``rest`` (the block
  configuration model); loops and repeated pairs are dropped. On sparse graphs it goes instead
  to the anchored configuration model (service.synthetic.anchors), whose closure p of the hubs'
  neighbourhoods carries the triangles before the affinity blocks do: p is fitted to the
  released triangle count when p = 1 reaches it; otherwise p = 1 and rho_bter is fitted to
  carry the rest.

Each fit is a bisection over [0, 1] with common random numbers (the same uniform draws and the
same seed for the rest at every step), so the statistic moves nearly monotonically with rho
(and p).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.synthetic.anchors import anchored_configuration
from service.synthetic.sampling import simple_edges
from service.synthetic.triangles import edges_to_csr, in_block_edges, truncated_triangles

Edges = tuple[np.ndarray, np.ndarray]
Rest = Callable[[np.ndarray, np.random.Generator], Edges]


def affinity_blocks(
    degrees: np.ndarray, block_cap: int, order: np.ndarray, groups: np.ndarray | None = None
) -> list[np.ndarray]:
    """BTER's blocks: nodes of degree >= 2 in ``order`` (ascending degree, within each group
    when ``groups`` is given), cut into consecutive blocks of (the block's smallest degree + 1)
    nodes, at most ``block_cap``; a block never spans two groups."""
    ranked = order[degrees[order] >= 2]
    key = np.zeros(degrees.size, np.int64) if groups is None else groups
    blocks: list[np.ndarray] = []
    i = 0
    while i < ranked.size:
        size = int(min(degrees[ranked[i]] + 1, block_cap))
        block = ranked[i : i + size]
        block = block[key[block] == key[block[0]]]
        blocks.append(block)
        i += block.size
    return [b for b in blocks if b.size >= 2]


def block_pairs(blocks: list[np.ndarray]) -> Edges:
    """Every pair inside every block."""
    us: list[np.ndarray] = [np.empty(0, np.int64)]
    vs: list[np.ndarray] = [np.empty(0, np.int64)]
    for block in blocks:
        iu, iv = np.triu_indices(block.size, 1)
        us.append(block[iu])
        vs.append(block[iv])
    return np.concatenate(us), np.concatenate(vs)


def band_pairs(n: int, width: int) -> Edges:
    """Every pair at most ``width`` apart in the public order."""
    base = np.arange(n, dtype=np.int64)
    steps = range(1, min(width, n - 1) + 1)
    return (
        np.concatenate([base[: n - k] for k in steps] or [base[:0]]),
        np.concatenate([base[k:] for k in steps] or [base[:0]]),
    )


@dataclass(frozen=True)
class Layer:
    """Candidate pairs and their uniform draws scaled by the pair's weight: a pair is kept at
    rho when ``draws < rho``."""

    u: np.ndarray
    v: np.ndarray
    draws: np.ndarray

    def kept(self, rho: float) -> Edges:
        chosen = self.draws < rho
        return self.u[chosen], self.v[chosen]


def _layer(pairs: Edges, weight: np.ndarray, rng: np.random.Generator) -> Layer:
    draws = rng.random(pairs[0].size) / np.maximum(weight, 1e-12)
    return Layer(pairs[0], pairs[1], draws)


@dataclass(frozen=True)
class Targets:
    """Released statistics the fit matches (None: that layer is off)."""

    triangles: float | None
    triangle_bound: int
    priority: np.ndarray
    in_block: float | None
    block_size: int
    #: Smallest released degree of an anchor (None: no anchored layer, the affinity blocks
    #: carry the triangles).
    anchor_min: int | None = None


def _bisect(statistic: Callable[[float], tuple[float, Edges]], target: float, steps: int) -> float:
    """The rho in [0, 1] whose statistic is closest to ``target`` among the points visited."""
    best_rho, best_gap = 0.0, abs(statistic(0.0)[0] - target)
    low, high = 0.0, 1.0
    for _ in range(steps):
        mid = 0.5 * (low + high)
        found = statistic(mid)[0]
        if abs(found - target) < best_gap:
            best_rho, best_gap = mid, abs(found - target)
        if found < target:
            low = mid
        else:
            high = mid
    return best_rho


def layered_graph(
    degrees: np.ndarray,
    targets: Targets,
    block_cap: int,
    rest: Rest,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
    steps: int = 12,
) -> tuple[Edges, dict[str, float]]:
    """The synthetic graph and the fitted (rho_band, rho_bter, p_anchor). Affinity blocks stay
    inside ``groups`` (the partition of the group-count rounds) when given.

    With ``targets.anchor_min`` set, the degree left after the band goes to the anchored
    configuration model (:mod:`service.synthetic.anchors`) instead of ``rest``, and the
    triangles are carried first by its closure p: fitted to the released count when p = 1
    reaches it, else p = 1 and the affinity blocks fitted to carry the rest. Every choice is
    made on released numbers only."""
    n = degrees.size
    d = degrees.astype(np.float64)
    seed = int(rng.integers(2**63))
    band = None
    if targets.in_block is not None:
        pairs = band_pairs(n, targets.block_size - 1)
        smaller = np.minimum(d[pairs[0]], d[pairs[1]])
        band = _layer(pairs, np.minimum(1.0, smaller / (2.0 * (targets.block_size - 1))), rng)
    group_key = np.zeros(n, np.int64) if groups is None else groups
    order = np.lexsort((rng.random(n), degrees, group_key))
    blocks = affinity_blocks(degrees, block_cap, order, groups)
    bter = _layer(block_pairs(blocks), np.ones(1), rng)

    def graph(rho_band: float, rho_bter: float, p_anchor: float | None = None) -> Edges:
        parts = [bter.kept(rho_bter)] + ([band.kept(rho_band)] if band is not None else [])
        lu = np.concatenate([p[0] for p in parts])
        lv = np.concatenate([p[1] for p in parts])
        lu, lv = simple_edges(lu, lv, n)
        used = np.bincount(np.concatenate([lu, lv]), minlength=n)
        left = np.maximum(degrees - used, 0)
        if p_anchor is None or targets.anchor_min is None:
            cu, cv = rest(left, np.random.default_rng(seed))
        else:
            cu, cv = anchored_configuration(left, targets.anchor_min, p_anchor, seed)
        return simple_edges(np.concatenate([lu, cu]), np.concatenate([lv, cv]), n)

    def truncated(edges: Edges) -> float:
        h = edges_to_csr(edges[0], edges[1], n)
        return truncated_triangles(h.indptr, h.indices, targets.priority, targets.triangle_bound)

    def in_block(rho: float) -> tuple[float, Edges]:
        edges = graph(rho, 0.0)
        h = edges_to_csr(edges[0], edges[1], n)
        return in_block_edges(h.indptr, h.indices, targets.block_size), edges

    rho_band = 0.0
    if band is not None and targets.in_block is not None:
        rho_band = _bisect(in_block, targets.in_block, steps)

    def anchored(p: float) -> tuple[float, Edges]:
        edges = graph(rho_band, 0.0, p)
        return truncated(edges), edges

    def triangles(rho: float) -> tuple[float, Edges]:
        edges = graph(rho_band, rho, p_anchor)
        return truncated(edges), edges

    fitted = {"band": rho_band, "affinity": 0.0, "anchored": -1.0}
    if targets.triangles is None:
        return graph(rho_band, 0.0), fitted
    p_anchor: float | None = None
    if targets.anchor_min is not None:
        if anchored(1.0)[0] >= targets.triangles:
            p_anchor = _bisect(anchored, targets.triangles, steps)
            fitted["anchored"] = p_anchor
            return graph(rho_band, 0.0, p_anchor), fitted
        p_anchor = 1.0
        fitted["anchored"] = 1.0
    if bter.u.size:
        fitted["affinity"] = _bisect(triangles, targets.triangles, steps)
    return graph(rho_band, fitted["affinity"], p_anchor), fitted
