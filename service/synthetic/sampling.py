"""Random-graph sampling shared by the generators: pure post-processing of released numbers.

Every function takes released (noisy) quantities and a generator and returns undirected simple
edges as internal indices ``(u, v)`` with ``u < v``: self-loops and repeated pairs are dropped.
"""

from __future__ import annotations

import numpy as np

from service.synthetic.deconvolve import deconvolved_degrees


def simple_edges(u: np.ndarray, v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Canonical ``u < v`` pairs without self-loops or duplicates, sorted."""
    lo = np.minimum(u, v).astype(np.int64)
    hi = np.maximum(u, v).astype(np.int64)
    keep = lo != hi
    keys = np.unique(lo[keep] * n + hi[keep])
    return keys // n, keys % n


def handed_out_by_rank(values: np.ndarray, key: np.ndarray) -> np.ndarray:
    """``values`` handed out to the nodes in the order of ``key``: the k-th smallest value to
    the node with the k-th smallest key (ties in ``key`` in node order)."""
    out: np.ndarray = np.empty(np.shape(values), dtype=np.float64)
    out[np.argsort(np.asarray(key), kind="stable")] = np.sort(values)
    return out


def denoise_degrees(
    noisy: np.ndarray,
    total: float | None,
    rng: np.random.Generator,
    floor: int = 0,
    noise_scale: float | None = None,
    rank_by: np.ndarray | None = None,
) -> np.ndarray:
    """Integer degrees from a noisy degree vector (post-processing only).

    The sorted noisy degrees are replaced by their isotonic (non-decreasing) least-squares fit
    (Hay et al., ICDM 2009: the sorted true degrees are non-decreasing), clipped at ``floor``
    (a public prior, e.g. 1 for a graph read from an edge list, where no node is isolated),
    given back to the nodes in the order of their noisy values, rescaled to ``total`` (e.g.
    twice a released edge count) when given, clipped at ``floor`` again, and rounded at random
    without bias.

    With ``noise_scale`` (the Laplace scale of the noisy values), the values are replaced
    instead by the quantiles of the deconvolved degree distribution at the nodes' ranks
    (:func:`service.synthetic.deconvolve.deconvolved_degrees`): the isotonic fit of values
    sorted by themselves is the identity, so it leaves the noise's spread in the distribution.

    With ``rank_by`` (one score per node, a function of released values and public data, e.g.
    :func:`service.synthetic.order_shrinkage.order_shrunk_degrees`) the same values are handed
    out in the order of ``rank_by`` instead of the noisy values': the largest value to the node
    with the largest score. The multiset of degrees (before the random rounding) is unchanged.
    """
    if noise_scale is not None:
        out = deconvolved_degrees(noisy, noise_scale, floor)
    else:
        from scipy.optimize import isotonic_regression  # imported here: scipy.optimize costs
        # every process that imports the synthetic package (each server) 0.14 s

        fitted = isotonic_regression(np.sort(noisy, kind="stable")).x
        out = handed_out_by_rank(np.maximum(fitted, float(floor)), noisy)
    if rank_by is not None:
        out = handed_out_by_rank(out, rank_by)
    if total is not None and out.sum() > 0:
        out = np.maximum(out * max(total, 0.0) / out.sum(), float(floor))
    low = np.floor(out)
    rounded: np.ndarray = (low + (rng.random(out.size) < out - low)).astype(np.int64)
    return rounded


def chung_lu(
    weights: np.ndarray, edges: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``edges`` draws of pairs with endpoints proportional to ``weights`` (clipped at 0)."""
    n = weights.size
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    if edges <= 0 or w.sum() <= 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    p = w / w.sum()
    return simple_edges(rng.choice(n, edges, p=p), rng.choice(n, edges, p=p), n)


def erdos_renyi(n: int, edges: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A uniform graph with ``edges`` distinct pairs (at most all of them)."""
    edges = int(min(max(edges, 0), n * (n - 1) // 2))
    u = np.empty(0, np.int64)
    v = np.empty(0, np.int64)
    while u.size < edges:
        need = edges - u.size
        a, b = rng.integers(0, n, 2 * need + 16), rng.integers(0, n, 2 * need + 16)
        u, v = simple_edges(np.concatenate([u, a]), np.concatenate([v, b]), n)
    pick = rng.permutation(u.size)[:edges]
    return simple_edges(u[pick], v[pick], n)


def block_configuration(
    degrees: np.ndarray, groups: np.ndarray, mixing: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A degree-corrected block configuration model.

    Node u has ``degrees[u]`` stubs; each goes to a target group drawn from
    ``mixing[groups[u]]`` (rows sum to 1). Stubs of g aimed at h are paired at random with stubs
    of h aimed at g; stubs left unpaired are paired at random among themselves.
    """
    n = degrees.size
    k = mixing.shape[0]
    owner = np.repeat(np.arange(n), degrees)
    source = groups[owner]
    cumulative = np.cumsum(mixing, axis=1)
    cumulative[:, -1] = 1.0
    target = (rng.random(owner.size)[:, None] > cumulative[source]).sum(axis=1)
    target = np.minimum(target, k - 1)
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    spare: list[np.ndarray] = []
    for g in range(k):
        for h in range(g, k):
            mine = rng.permutation(owner[(source == g) & (target == h)])
            if g == h:
                half = mine.size // 2
                left.append(mine[:half])
                right.append(mine[half : 2 * half])
                spare.append(mine[2 * half :])
                continue
            theirs = rng.permutation(owner[(source == h) & (target == g)])
            pairs = min(mine.size, theirs.size)
            left.append(mine[:pairs])
            right.append(theirs[:pairs])
            spare.extend([mine[pairs:], theirs[pairs:]])
    rest = rng.permutation(np.concatenate(spare)) if spare else np.empty(0, np.int64)
    half = rest.size // 2
    left.append(rest[:half])
    right.append(rest[half : 2 * half])
    return simple_edges(np.concatenate(left), np.concatenate(right), n)
