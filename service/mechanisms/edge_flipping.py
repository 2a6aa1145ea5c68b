"""Edge flipping (randomized response on the adjacency matrix): an evaluation-only baseline.

Each unordered pair {u, v} (u != v) is, with probability p = 2 / (1 + e^eps), replaced by a
fair coin, and otherwise kept. The entry's likelihood ratio is (1 - p/2) / (p/2) = e^eps, so
the flipped graph is eps-DP for one edge. In `personalized` mode the pairs touching the seed
are kept as they are (the seed's own edges are not protected); in `edge` mode every pair is
randomized. Exact PPR on the flipped graph is post-processing.

O(n^2) time and, at small eps, a dense result (about n^2 / 4 edges): graphs above
``max_nodes`` are refused with :class:`GraphTooLarge`. Never exposed over HTTP.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from service.errors import GraphTooLarge, InvalidParameter
from service.graph.model import Graph
from service.mechanisms.exact import ppr_from_adjacency
from service.mechanisms.parameters import EDGE_FLIPPING_MAX_NODES
from service.mechanisms.randomness import fresh_generator
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_MAX_NODES",
    "check_size",
    "edge_flipping_ppr",
    "flip_edges",
    "flip_probability",
]

#: Largest graph (nodes) the O(n^2) baseline accepts by default (5000).
DEFAULT_MAX_NODES = EDGE_FLIPPING_MAX_NODES
#: Pairs randomized per block (bounds the block's float64 draws to ~32 MB).
BLOCK_PAIRS = 1 << 22


def flip_probability(epsilon: float) -> float:
    """p = 2 / (1 + e^eps): the probability that a pair is replaced by a fair coin."""
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, int | float)
        or not math.isfinite(epsilon)
        or epsilon <= 0
    ):
        raise InvalidParameter("epsilon", f"must be a finite number > 0, got {epsilon!r}")
    return 2.0 / (1.0 + math.exp(min(float(epsilon), 700.0)))


def check_size(graph: Graph, max_nodes: int = DEFAULT_MAX_NODES) -> None:
    """Raise :class:`GraphTooLarge` when the O(n^2) baseline would exceed ``max_nodes``."""
    if graph.n > max_nodes:
        raise GraphTooLarge(
            f"edge flipping is O(n^2) in time and memory: the graph has {graph.n} nodes, "
            f"the limit is {max_nodes} (raise max_nodes to run it anyway)",
            details={"nodes": graph.n, "max_nodes": max_nodes},
        )


def flip_edges(
    graph: Graph,
    seed: int,
    epsilon: float,
    mode: Mode = Mode.PERSONALIZED,
    rng: np.random.Generator | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> sp.csr_matrix:
    """The randomized-response graph as a symmetric 0/1 float64 CSR matrix without self-loops.

    The upper triangle is processed in row blocks (one uniform draw per pair: below p/2 the
    pair becomes an edge, in [p/2, p) a non-edge, otherwise it keeps its true value).
    ``rng`` defaults to a generator freshly seeded from the OS entropy source.
    """
    check_size(graph, max_nodes)
    n = graph.n
    if not 0 <= seed < n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {n})")
    mode = Mode(mode)
    p = flip_probability(epsilon)
    rng = rng if rng is not None else fresh_generator()
    adjacency = graph.adjacency
    rows_out: list[np.ndarray] = []
    cols_out: list[np.ndarray] = []
    lo = 0
    while lo < n - 1:
        width = n - lo  # columns lo..n-1; the pairs of row i are the columns j > i
        hi = min(n - 1, lo + max(1, BLOCK_PAIRS // width))
        true = adjacency[lo:hi, lo:].toarray() > 0
        draws = rng.random((hi - lo, width))
        flipped = np.where(draws < p, draws < p / 2.0, true)
        if mode is Mode.PERSONALIZED:
            if seed >= lo:
                flipped[:, seed - lo] = true[:, seed - lo]
            if lo <= seed < hi:
                flipped[seed - lo, :] = true[seed - lo, :]
        r, c = np.nonzero(np.triu(flipped, k=1))
        rows_out.append((r + lo).astype(np.int32))
        cols_out.append((c + lo).astype(np.int32))
        lo = hi
    rows = np.concatenate(rows_out) if rows_out else np.zeros(0, dtype=np.int32)
    cols = np.concatenate(cols_out) if cols_out else np.zeros(0, dtype=np.int32)
    data = np.ones(2 * rows.shape[0], dtype=np.float64)
    result = sp.csr_matrix(
        (data, (np.concatenate([rows, cols]), np.concatenate([cols, rows]))), shape=(n, n)
    )
    result.sort_indices()
    return result


def edge_flipping_ppr(
    graph: Graph,
    seed: int,
    beta: float,
    epsilon: float,
    mode: Mode = Mode.PERSONALIZED,
    rng: np.random.Generator | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
    tol: float = 1e-10,
) -> np.ndarray:
    """Exact PPR of ``seed`` (internal index) on an eps-DP edge-flipped copy of ``graph``."""
    flipped = flip_edges(graph, seed, epsilon, mode, rng, max_nodes)
    return ppr_from_adjacency(flipped, seed, beta, tol)
