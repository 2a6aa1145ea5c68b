"""DP-IE (Epasto et al., Section 5): PushFlowCap, then InstantEmbedding, then Lap(sigma n / eps)^k.

1. p = PushFlowCap(G, s, alpha, R, sigma, mode) with the paper's proven thresholds
   T = sigma / (2 (2 - alpha)) (:mod:`service.mechanisms.pushflowcap`): ||p - p'||_1 <= sigma
   for one edge (Theorem 4.3; `personalized` = joint: edges not incident to s, answer to s only).
2. w = InstantEmbedding(p, k) with the version's hash functions: ||w - w'||_1 <= sigma n
   (Theorem 5.1, natural log).
3. w + Y, Y_j i.i.d. Lap(b), b = sigma n / eps rounded UP to six significant digits (so the
   achieved epsilon never exceeds the target), drawn with the service's sampler
   (:func:`service.mechanisms.randomness.laplace_noise`) from a fresh OS-entropy generator. The
   noise goes on the k coordinates once, never on p and never scaled by k.
4. The released coordinates are rounded to the grid ``score_grid(b)`` (the largest power of two
   <= b / 256), stated with the answer: post-processing (privacy-spec, Floating point).

Privacy cost of one release: pure eps-DP (joint in `personalized` mode); its RDP curve is the
Laplace curve at eps (:func:`dp_instant_embedding_curve`), the same shape as
`common_neighbours`: a k-dimensional Laplace vector with l1 sensitivity Delta and scale b has
the one-dimensional curve at Delta / b (spec-embeddings.md, "Cost of one release").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.instant import instant_embedding
from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.postprocess import round_to_grid, score_grid
from service.mechanisms.pushflowcap import pushflowcap
from service.mechanisms.randomness import fresh_generator, laplace_noise
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.laplace import LaplacePlan, plan_laplace
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_EMBEDDING_SIGMA",
    "DEFAULT_K",
    "EMBEDDING_BETA",
    "EMBEDDING_ROUNDS",
    "MAX_K",
    "MAX_SIGMA",
    "MIN_SIGMA",
    "DpEmbedding",
    "dp_instant_embedding",
    "dp_instant_embedding_curve",
    "plan_dp_instant_embedding",
]

#: The paper's dimension (Section 6).
DEFAULT_K = 256
#: Default sigma, chosen by the sweep in docs/embeddings.md: on email-Eu-core at eps 5,
#: personalized DP-IE scores Micro-F1 0.137 +- 0.027 at 1e-3 and 0.147 +- 0.107 at 1e-2 (random
#: 0.041; 1e-4 and 1e-1 at random); 1e-3 has 10x less noise and the narrower interval. The
#: paper's 1e-6 empties the embedding (no node but the seed carries n p_v > 1).
DEFAULT_EMBEDDING_SIGMA = 1e-3
#: Largest dimension accepted (a k-vector per answer; the noise does not grow with k).
MAX_K = 4096
#: The paper's lazy teleport alpha = a_std / (2 - a_std) with a_std = 0.15 (footnote 4), as
#: the service's beta = 1 - alpha.
EMBEDDING_BETA = 1.0 - 0.15 / (2.0 - 0.15)
#: The paper's R = 100 rounds.
EMBEDDING_ROUNDS = 100
#: Bounds on sigma: below ~1e-5 nothing but the seed enters the embedding on graphs of a few
#: thousand nodes (spec-embeddings.md, finding 1); above 1 the cap never binds on PPR mass.
MIN_SIGMA = 1e-7
MAX_SIGMA = 1.0


def _check_sigma(sigma: float) -> float:
    if (
        isinstance(sigma, bool)
        or not isinstance(sigma, int | float)
        or not math.isfinite(sigma)
        or not MIN_SIGMA <= sigma <= MAX_SIGMA
    ):
        raise InvalidParameter("sigma", f"must be in [{MIN_SIGMA:g}, {MAX_SIGMA:g}], got {sigma!r}")
    return float(sigma)


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidParameter("k", f"must be an integer in [1, {MAX_K}], got {k!r}")
    return k


def plan_dp_instant_embedding(epsilon: float, sigma: float, n: int) -> LaplacePlan:
    """Laplace plan of sensitivity sigma n (Theorems 4.3, 5.1): b = sigma n / eps, rounded up."""
    sigma = _check_sigma(sigma)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    return plan_laplace(epsilon, sigma * n)


def dp_instant_embedding_curve(epsilon: float) -> RdpCurve:
    """RDP cost of one DP-IE release: the Laplace curve at epsilon (pure eps-DP)."""
    return laplace_curve(epsilon)


@dataclass(frozen=True)
class DpEmbedding:
    """One released DP-IE vector and what was used to make it."""

    values: np.ndarray  # k coordinates, multiples of ``grid``
    grid: float
    plan: LaplacePlan
    sigma: float
    mode: Mode
    salt_hex: str


def dp_instant_embedding(
    graph: Graph,
    seed: int,
    hashes: EmbeddingHashes,
    epsilon: float,
    sigma: float,
    mode: Mode = Mode.EDGE,
    beta: float = EMBEDDING_BETA,
    rounds: int = EMBEDDING_ROUNDS,
    rng: np.random.Generator | None = None,
    capped: np.ndarray | None = None,
) -> DpEmbedding:
    """DP-IE of ``seed`` (internal index). ``rng`` defaults to a fresh OS-entropy generator;
    the serving path never passes one. ``capped`` (the PushFlowCap vector of exactly these
    graph, seed, beta, rounds, sigma and mode) skips recomputing it in evaluation loops."""
    sigma = _check_sigma(sigma)
    check_k(hashes.k)
    mode = Mode(mode)
    if hashes.buckets.shape[0] != graph.n:
        raise InvalidParameter("hashes", "were computed for a different node set")
    plan = plan_dp_instant_embedding(epsilon, sigma, graph.n)
    p = capped if capped is not None else pushflowcap(graph, seed, beta, rounds, sigma, mode)
    w = instant_embedding(p, hashes)
    rng = rng if rng is not None else fresh_generator()
    grid = score_grid(plan.scale)
    released = round_to_grid(w + laplace_noise(rng, plan.scale, hashes.k), grid)
    return DpEmbedding(released, grid, plan, sigma, mode, hashes.salt_hex)
