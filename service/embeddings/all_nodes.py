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

Step 1 runs :func:`service.mechanisms.pushflowcap.pushflowcap_block`: a block of seeds per
pass over the graph, each seed's vector bit for bit that of the dense PushFlowCap (the reference
of tests/test_pushflowcap_kernel.py), so each row here is bit for bit what the single query
computes before its noise. Blocks run on ``threads`` threads (the kernel releases the GIL);
step 2 is :func:`service.embeddings.instant.instant_embedding` itself, per seed.

Each of the seeds' releases is pure eps-DP for one edge (any edge: Theorems 4.3 and 5.1 hold
for every R >= 1); what the set costs is the caller's business (:mod:`service.embeddings.
release` charges their composition).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_ROUNDS,
    _check_sigma,
    check_k,
    exact_noisy_release,
    plan_dp_instant_embedding,
)
from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.instant import instant_embedding
from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.pushflowcap import pushflowcap_block
from service.privacy.laplace import LaplacePlan
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_BLOCK",
    "MAX_ROUNDS",
    "default_threads",
    "edge_embeddings",
    "edge_instant_embeddings",
]

#: Largest R accepted (the paper's R = 100 is the default).
MAX_ROUNDS = 1000
#: Seeds per pass over the graph: per seed, a block of 16 costs about a fifth of one seed
#: alone on the generated 100k/2M graph (docs/embeddings.md, "How fast"); the block's
#: state is 5 x 8 x 16 bytes per node (64 MB at 100,000 nodes) per thread.
DEFAULT_BLOCK = 16


def default_threads() -> int:
    """The cores this process may run on (``taskset`` limits them)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - not Linux


Progress = Callable[[int, int], None]


def _check_rounds(rounds: int) -> int:
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
    block: int = DEFAULT_BLOCK,
    threads: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """InstantEmbedding of the edge-mode PushFlowCap vector of each seed (internal indices),
    one row per seed, BEFORE any noise: an exact function of the edges, never released.
    Row i is bit for bit ``instant_embedding(pushflowcap(graph, seeds[i], ...), hashes)``."""
    sigma = _check_sigma(sigma)
    rounds = _check_rounds(rounds)
    check_k(hashes.k)
    if hashes.buckets.shape[0] != graph.n:
        raise InvalidParameter("hashes", "were computed for a different node set")
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.ndim != 1 or (seeds.size and (seeds.min() < 0 or seeds.max() >= graph.n)):
        raise InvalidParameter("seeds", f"must be internal indices in [0, {graph.n})")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise InvalidParameter("block", f"must be an integer >= 1, got {block!r}")
    threads = default_threads() if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidParameter("threads", f"must be an integer >= 1, got {threads!r}")
    out = np.zeros((seeds.size, hashes.k), dtype=np.float64)
    starts = range(0, seeds.size, block)
    lock = threading.Lock()
    done = 0

    def one_block(start: int) -> None:
        nonlocal done
        part = seeds[start : start + block]
        capped = pushflowcap_block(graph, part, beta, rounds, sigma, Mode.EDGE, skip_idle=True)
        for column in range(part.size):
            out[start + column] = instant_embedding(capped[:, column], hashes)
        with lock:
            done += part.size
            if progress is not None:
                progress(done, seeds.size)

    if threads == 1 or len(starts) <= 1:
        for start in starts:
            one_block(start)
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(starts))) as pool:
            for finished in [pool.submit(one_block, start) for start in starts]:
                finished.result()
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
    threads: int | None = None,
    progress: Progress | None = None,
) -> tuple[np.ndarray, float, LaplacePlan]:
    """(released rows, grid, plan): edge-mode DP-IE of every seed, each with its own noise.

    The rows are multiples of ``grid`` (a power of two); as float32 they are exact while
    |value| < 2^24 grid (about 65,000 noise scales), which :mod:`service.embeddings.release`
    checks before it stores them as float32."""
    plan = plan_dp_instant_embedding(epsilon, sigma, graph.n)
    exact = edge_instant_embeddings(
        graph, hashes, seeds, sigma, beta=beta, rounds=rounds, threads=threads, progress=progress
    )
    released, grid = exact_noisy_release(exact, plan, sigma, graph.n, rng)
    return released, grid, plan
