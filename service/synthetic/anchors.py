"""The anchored configuration model: triangles and long paths around hubs (post-processing).

In sparse real graphs the neighbours of a hub link mostly among themselves and to their own
neighbours, so a hub's second neighbourhood is far smaller than a configuration model with the
same degrees makes it (Cora: on average 157 nodes within distance 2 of a node of degree >= 20,
331 in the configuration model). The hubs' neighbourhoods closing on themselves are where the
triangles are, and why paths stay long although hubs exist. The model, on released degrees:

1. **anchors**: the nodes whose released degree is at least ``anchor_min`` (a public function
   of the released degrees, chosen by the caller);
2. every anchor stub is paired with a random stub of a non-anchor node (anchors do not link to
   each other here; stubs left over when one side runs out join step 4 as unanchored);
3. every non-anchor node paired with an anchor joins that anchor's group (one of its anchors
   at random when it has several);
4. every remaining stub is, with probability ``p``, paired with a random remaining stub of its
   node's group (if the node has one), and otherwise with a random remaining stub; self-loops
   and repeated pairs are dropped, and the stubs they cost are paired once more at random.

``p = 0`` is a configuration model without anchor-to-anchor edges; a larger ``p`` closes the
anchors' neighbourhoods: more triangles, smaller second neighbourhoods, longer paths. Each
stub's draw against ``p`` is a fixed uniform, and all other randomness comes from ``seed``, so
that a fit of ``p`` to a released count sees the statistic move nearly monotonically.
"""

from __future__ import annotations

import numpy as np

from service.synthetic.sampling import simple_edges

Edges = tuple[np.ndarray, np.ndarray]


def _pair_consecutive(stubs: np.ndarray) -> Edges:
    half = stubs.size // 2
    return stubs[0 : 2 * half : 2], stubs[1 : 2 * half : 2]


def anchored_configuration(degrees: np.ndarray, anchor_min: int, p: float, seed: int) -> Edges:
    """Simple edges (``u < v``) of the anchored configuration model on ``degrees``."""
    rng = np.random.default_rng(seed)
    n = degrees.size
    owner = np.repeat(np.arange(n), np.maximum(degrees, 0).astype(np.int64))
    is_anchor = degrees[owner] >= anchor_min
    anchor_stubs = rng.permutation(owner[is_anchor])
    other_stubs = rng.permutation(owner[~is_anchor])
    k = min(anchor_stubs.size, other_stubs.size)
    au, av = anchor_stubs[:k], other_stubs[:k]
    group = np.full(n, -1, np.int64)
    order = rng.permutation(k)
    group[av[order]] = au[order]  # the last write wins: one of the node's anchors at random
    remaining = np.concatenate([anchor_stubs[k:], other_stubs[k:]])
    draws = rng.random(remaining.size)
    shuffle = rng.random(remaining.size)
    local = (draws < p) & (group[remaining] >= 0)
    inside = remaining[local]
    inside = inside[np.lexsort((shuffle[local], group[inside]))]
    lu, lv = _pair_consecutive(inside)
    same = group[lu] == group[lv]  # a group with an odd count pairs its last stub elsewhere
    outside = np.concatenate([remaining[~local], lu[~same], lv[~same]])
    ou, ov = _pair_consecutive(outside[np.argsort(rng.random(outside.size))])
    u, v = simple_edges(np.concatenate([au, lu[same], ou]), np.concatenate([av, lv[same], ov]), n)
    # stubs lost to loops and repeated pairs (many in dense groups) are paired once more at
    # random, so that closing the groups does not cost the hubs their degree
    short = np.maximum(degrees - np.bincount(np.concatenate([u, v]), minlength=n), 0)
    eu, ev = _pair_consecutive(rng.permutation(np.repeat(np.arange(n), short)))
    return simple_edges(np.concatenate([u, eu]), np.concatenate([v, ev]), n)


def anchor_threshold(degrees: np.ndarray, factor: float) -> int:
    """The smallest anchor degree: ``factor`` times the mean released degree, at least 2."""
    mean = float(degrees.mean()) if degrees.size else 0.0
    return max(2, int(np.ceil(factor * mean)))
