"""Edge-mode DP-IE for many nodes at once: the computation behind an all-node release.

For every seed s in ``seeds``, exactly the pipeline of :func:`service.embeddings.dp.
dp_instant_embedding` in `edge` mode:

1. p_s = PushFlowCap(G, s, alpha, R, sigma, edge) with the paper's thresholds
   T = sigma / (2 (2 - alpha)) for every node, the seed included (non-joint);
2. w_s = InstantEmbedding(p_s, k) under the version's hash functions;
3. w_s snapped to the fine grid h, plus exact rounded Laplace noise at scale dyadic_scale(b) on
   it, b = Delta / eps rounded up with Delta = sigma n + MAX_K h
   (:func:`service.embeddings.dp.exact_noisy_release`, :func:`plan_dp_instant_embedding`),
   fresh noise per seed from one OS-entropy generator, rounded to the grid ``score_grid(b)``.

Steps 1-2 run in a compiled kernel that keeps, per seed, only the nodes the flow has reached:
a node with zero residual pushes nothing (Algorithm 2), and a node whose cap d(v) T is used up
never pushes again, so each round costs the edges of the nodes that still push, not the whole
graph. The arithmetic is Algorithm 2's, in float64; ``tests/test_embedding_all_node_release.py``
checks it against :func:`service.mechanisms.pushflowcap.pushflowcap` on every seed of a graph.

Each of the seeds' releases is pure eps-DP for one edge (any edge: Theorems 4.3 and 5.1 hold
for every R >= 1); what the set costs is the caller's business (:mod:`service.embeddings.
release` charges their composition).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_ROUNDS,
    check_k,
    check_sigma,
    exact_noisy_release,
    plan_dp_instant_embedding,
)
from service.embeddings.hashing import EmbeddingHashes
from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.pushflowcap import edge_threshold
from service.privacy.laplace import LaplacePlan

__all__ = ["MAX_ROUNDS", "edge_embeddings", "edge_instant_embeddings"]

#: Largest R accepted (the paper's R = 100 is the default).
MAX_ROUNDS = 1000

Progress = Callable[[int, int], None]


@njit(nogil=True, cache=True, fastmath=False)
def _instant_of_capped(
    indptr: Any,
    indices: Any,
    degrees: Any,
    cap: Any,
    buckets: Any,
    signs: Any,
    seeds: Any,
    alpha: float,
    rounds: int,
    out: Any,
) -> None:  # pragma: no cover - compiled
    n = degrees.shape[0]
    lazy = (1.0 - alpha) / 2.0
    residual = np.zeros(n)
    pushed = np.zeros(n)
    flow = np.zeros(n)
    listed = np.zeros(n, dtype=np.bool_)  # in ``active``
    touched = np.zeros(n, dtype=np.bool_)  # ever had residual: reset after the seed
    active = np.empty(n, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)
    seen = np.empty(n, dtype=np.int64)
    for row in range(seeds.shape[0]):
        s = seeds[row]
        residual[s] = 1.0
        active[0] = s
        listed[s] = True
        touched[s] = True
        seen[0] = s
        n_active = 1
        n_seen = 1
        for _ in range(rounds):
            if n_active == 0:
                break
            # f = min(r, max(cap - h, 0)) for every node, from the round's starting residual
            for i in range(n_active):
                v = active[i]
                room = cap[v] - pushed[v]
                if room < 0.0:
                    room = 0.0
                f = residual[v]
                if room < f:
                    f = room
                flow[v] = f
            n_next = 0
            for i in range(n_active):
                v = active[i]
                f = flow[v]
                flow[v] = 0.0
                if f > 0.0:
                    pushed[v] += f
                    residual[v] -= f
                    residual[v] += lazy * f  # degree > 0 here: a degree-0 node has cap 0
                    share = lazy * (f / degrees[v])
                    for jj in range(indptr[v], indptr[v + 1]):
                        u = indices[jj]
                        residual[u] += share
                        if not touched[u]:
                            touched[u] = True
                            seen[n_seen] = u
                            n_seen += 1
                        if not listed[u] and cap[u] - pushed[u] > 0.0:
                            listed[u] = True
                            nxt[n_next] = u
                            n_next += 1
                # a node keeps pushing while it has room and residual
                if listed[v] and residual[v] > 0.0 and cap[v] - pushed[v] > 0.0:
                    nxt[n_next] = v
                    n_next += 1
                else:
                    listed[v] = False
            for i in range(n_next):
                active[i] = nxt[i]
            n_active = n_next
        # InstantEmbedding: z_v = max(ln(n p_v), 0), p = alpha h; w_j += sgn(v) z_v
        for i in range(n_seen):
            v = seen[i]
            mass = alpha * pushed[v] * n
            if mass > 1.0:
                out[row, buckets[v]] += signs[v] * np.log(mass)
            residual[v] = 0.0
            pushed[v] = 0.0
            listed[v] = False
            touched[v] = False


def check_rounds(rounds: int) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise InvalidParameter("rounds", f"must be an integer in [1, {MAX_ROUNDS}], got {rounds!r}")
    return rounds


def edge_instant_embeddings(
    graph: Graph,
    hashes: EmbeddingHashes,
    seeds: np.ndarray,
    sigma: float,
    *,
    beta: float = EMBEDDING_BETA,
    rounds: int = EMBEDDING_ROUNDS,
    block: int = 1024,
    progress: Progress | None = None,
) -> np.ndarray:
    """InstantEmbedding of the edge-mode PushFlowCap vector of each seed (internal indices),
    one row per seed, BEFORE any noise: an exact function of the edges, never released."""
    sigma = check_sigma(sigma)
    rounds = check_rounds(rounds)
    check_k(hashes.k)
    if hashes.buckets.shape[0] != graph.n:
        raise InvalidParameter("hashes", "were computed for a different node set")
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.ndim != 1 or (seeds.size and (seeds.min() < 0 or seeds.max() >= graph.n)):
        raise InvalidParameter("seeds", f"must be internal indices in [0, {graph.n})")
    degrees = graph.degrees.astype(np.float64)
    cap = degrees * edge_threshold(beta, sigma)
    out = np.zeros((seeds.size, hashes.k), dtype=np.float64)
    signs = np.ascontiguousarray(hashes.signs, dtype=np.float64)
    for start in range(0, seeds.size, block):
        part = seeds[start : start + block]
        view = np.zeros((part.size, hashes.k), dtype=np.float64)
        _instant_of_capped(
            graph.indptr, graph.indices, degrees, cap, hashes.buckets, signs, part,
            1.0 - beta, rounds, view,
        )  # fmt: skip
        out[start : start + part.size] = view
        if progress is not None:
            progress(start + part.size, seeds.size)
    return out


def edge_embeddings(
    graph: Graph,
    hashes: EmbeddingHashes,
    seeds: np.ndarray,
    epsilon: float,
    sigma: float,
    rng: np.random.Generator,
    *,
    beta: float = EMBEDDING_BETA,
    rounds: int = EMBEDDING_ROUNDS,
    progress: Progress | None = None,
) -> tuple[np.ndarray, float, LaplacePlan]:
    """(released rows, grid, plan): edge-mode DP-IE of every seed, each with its own noise.

    The rows are multiples of ``grid`` (a power of two); as float32 they are exact while
    |value| < 2^24 grid (about 65,000 noise scales), which :mod:`service.embeddings.release`
    checks before it stores them as float32."""
    plan = plan_dp_instant_embedding(epsilon, sigma, graph.n)
    exact = edge_instant_embeddings(
        graph, hashes, seeds, sigma, beta=beta, rounds=rounds, progress=progress
    )
    released, grid = exact_noisy_release(exact, plan, sigma, graph.n, rng)
    return released, grid, plan
