"""Edge-mode DP-IE for many nodes at once: the computation behind an all-node release.

For every seed s in ``seeds``, exactly the pipeline of :func:`service.embeddings.dp.
dp_instant_embedding` in `edge` mode:

1. p_s = PushFlowCap(G, s, alpha, R, sigma, edge) with the paper's thresholds
   T = sigma / (2 (2 - alpha)) for every node, the seed included (non-joint), and the floor
   (:mod:`service.mechanisms.floored_pushflowcap`);
2. w_s = InstantEmbedding(p_s, k) under the version's hash functions;
3. w_s snapped to the fine grid h, plus exact rounded Laplace noise at scale dyadic_scale(b) on
   it, b = Delta / eps rounded up with Delta = n (sigma + 2 e_p) + 2 e_w + MAX_K h (raised by
   2^-40) for these R and beta and the graph's public degree bound
   (:func:`service.embeddings.dp.exact_noisy_release`, :func:`plan_for_graph`),
   fresh noise per seed from one OS-entropy generator, rounded to the grid ``score_grid(b)``.

Step 1 runs :func:`service.embeddings.noise_free.capped_vectors`: with the floor, each seed's
local PushFlowCap, the single query's vector bit for bit; at floor 0 a block of seeds per pass
over the graph (:func:`service.mechanisms.pushflowcap.pushflowcap_block`, bit for bit the dense
Algorithm 2). Blocks of seeds run on ``threads`` threads (the kernels release the GIL); step 2
is :func:`service.embeddings.instant.instant_embedding` itself, per seed.

Each of the seeds' releases is pure eps-DP for one edge (any edge: Theorems 4.3 and 5.1 hold
for every R >= 1); what the set costs is the caller's business (:mod:`service.embeddings.
release` charges their composition).
"""

from __future__ import annotations

import numpy as np

from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    EMBEDDING_ROUNDS,
    check_k,
    check_sigma,
    exact_noisy_release,
    plan_for_graph,
)
from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.noise_free import (
    DEFAULT_BLOCK,
    Progress,
    noise_free_embeddings,
)
from service.errors import InvalidParameter
from service.graph.model import Graph
from service.privacy.laplace import LaplacePlan
from service.privacy.modes import Mode

__all__ = [
    "MAX_ROUNDS",
    "edge_embeddings",
    "edge_instant_embeddings",
]

#: Largest R accepted (the paper's R = 100 is the default).
MAX_ROUNDS = 1000


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
    floor: float = EMBEDDING_FLOOR,
    block: int = DEFAULT_BLOCK,
    threads: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """InstantEmbedding of the edge-mode PushFlowCap vector of each seed (internal indices),
    one row per seed, BEFORE any noise: an exact function of the edges, never released.
    Row i is bit for bit ``instant_embedding(pushflowcap_with_floor(graph, seeds[i], ...,
    floor), hashes)``, the single query's vector."""
    sigma = check_sigma(sigma)
    rounds = check_rounds(rounds)
    check_k(hashes.k)
    if hashes.buckets.shape[0] != graph.n:
        raise InvalidParameter("hashes", "were computed for a different node set")
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.ndim != 1 or (seeds.size and (seeds.min() < 0 or seeds.max() >= graph.n)):
        raise InvalidParameter("seeds", f"must be internal indices in [0, {graph.n})")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise InvalidParameter("block", f"must be an integer >= 1, got {block!r}")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise InvalidParameter("threads", f"must be an integer >= 1, got {threads!r}")
    return noise_free_embeddings(
        graph, hashes, seeds, sigma, Mode.EDGE, beta=beta, rounds=rounds, floor=floor,
        block=block, threads=threads, progress=progress,
    )  # fmt: skip


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
    threads: int | None = None,
    progress: Progress | None = None,
) -> tuple[np.ndarray, float, LaplacePlan]:
    """(released rows, grid, plan): edge-mode DP-IE of every seed, each with its own noise.

    The rows are multiples of ``grid`` (a power of two); as float32 they are exact while
    |value| < 2^24 grid (about 65,000 noise scales), which :mod:`service.embeddings.release`
    checks before it stores them as float32."""
    plan = plan_for_graph(epsilon, sigma, graph, rounds=rounds, beta=beta)
    exact = edge_instant_embeddings(
        graph, hashes, seeds, sigma, beta=beta, rounds=rounds, threads=threads, progress=progress
    )
    released, grid = exact_noisy_release(exact, plan, sigma, graph.n, rng)
    return released, grid, plan
