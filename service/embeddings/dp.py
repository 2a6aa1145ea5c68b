"""DP-IE (Epasto et al., Section 5): PushFlowCap, then InstantEmbedding, then Lap(sigma n / eps)^k.

1. p = PushFlowCap(G, s, alpha, R, sigma, mode) with the paper's proven thresholds
   T = sigma / (2 (2 - alpha)) (:mod:`service.mechanisms.pushflowcap`) and the floor
   ``EMBEDDING_FLOOR`` (:mod:`service.mechanisms.floored_pushflowcap`: a node keeps the first
   floor / n of PPR mass it receives before it pushes any): ||p - p'||_1 <= sigma for one edge
   (Theorem 4.3, whose proof holds with the floor, docs/privacy.md; `personalized` = joint:
   edges not incident to s, answer to s only).
2. w = InstantEmbedding(p, k) with the version's hash functions: ||w - w'||_1 <= sigma n
   (Theorem 5.1, natural log).
   Steps 1 and 2 run in float64: the computed p~ is within e_p of the exact p in l1
   (:func:`service.mechanisms.pushflowcap_rounding.pushflowcap_rounding_margin`, from n, R,
   beta and the public degree bound) and the computed w~ within e_w of InstantEmbedding(p~)
   (:func:`service.embeddings.instant.instant_embedding_rounding_margin`), so by Theorem 5.1
   (n-Lipschitz for any nonnegative vectors) ||w~ - w~'||_1 <= n (sigma + 2 e_p) + 2 e_w.
3. w~ is snapped to the fine grid h = :func:`snap_grid` (the largest power of two <=
   sigma n / 2^22): w_h = round_h(w~), a deterministic map, exact in float64. Each coordinate
   moves by at most h / 2, so ||w_h - w'_h||_1 <= n (sigma + 2 e_p) + 2 e_w + k h: the plan is
   calibrated on Delta = (n (sigma + 2 e_p) + 2 e_w + MAX_K h)(1 + 2^-40)
   (:func:`dp_ie_sensitivity`; the factor covers the roundings of Delta, Delta / eps and the
   charged Delta / b), b = Delta / eps rounded UP to six significant digits.
4. w_h + h N, N_j = round(L_j / gamma) drawn EXACTLY with gamma = h / b', b' = dyadic_scale(b)
   >= b (:func:`service.mechanisms.exact_laplace.grid_laplace`: uniform integers and exact
   comparisons only, from a fresh OS-entropy generator). Since w_h is a multiple of h, w_h + h N
   has exactly the law of round_h(w_h + Lap(b')^k): post-processing of the exact Laplace
   mechanism on w_h, pure (Delta / b')-DP with Delta / b' <= eps. The noise goes on the k
   coordinates once, never on p and never scaled by k. (gamma is about eps 2^-22; the exact
   sampler needs gamma >= 2^-50 and its denominator below 2^52, so eps below about 1e-8 is
   refused with ``invalid_parameter``.)
5. The released coordinates are rounded to the coarser grid ``score_grid(b)`` (the largest
   power of two <= b / 256), stated with the answer: post-processing.

Privacy cost of one release: pure eps-DP (joint in `personalized` mode), delta 0; its RDP
curve is the Laplace curve at eps (:func:`dp_instant_embedding_curve`), the same shape as
`common_neighbours`: a k-dimensional Laplace vector with l1 sensitivity Delta and scale b has
the one-dimensional curve at Delta / b (spec-embeddings.md, "Cost of one release").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.instant import instant_embedding, instant_embedding_rounding_margin
from service.embeddings.parameters import (
    DEFAULT_EMBEDDING_SIGMA,
    DEFAULT_K,
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    EMBEDDING_ROUNDS,
    MAX_K,
    MAX_SIGMA,
    MIN_SIGMA,
)
from service.errors import InvalidParameter
from service.graph.model import Graph
from service.graph.public_bounds import public_degree_bound
from service.mechanisms.exact_laplace import grid_laplace
from service.mechanisms.floored_pushflowcap import pushflowcap_with_floor
from service.mechanisms.postprocess import round_to_grid, score_grid
from service.mechanisms.pushflowcap_rounding import pushflowcap_rounding_margin
from service.mechanisms.randomness import fresh_generator
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.laplace import LaplacePlan, plan_laplace
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_EMBEDDING_SIGMA",
    "DEFAULT_K",
    "EMBEDDING_BETA",
    "EMBEDDING_FLOOR",
    "EMBEDDING_ROUNDS",
    "MAX_K",
    "MAX_SIGMA",
    "MIN_SIGMA",
    "SENSITIVITY_SLACK",
    "DpEmbedding",
    "dp_ie_sensitivity",
    "dp_instant_embedding",
    "dp_instant_embedding_curve",
    "exact_noisy_release",
    "plan_dp_instant_embedding",
    "plan_for_graph",
    "snap_grid",
]

#: The snapping grid h is at most sigma n / 2^SNAP_BITS: the snapping adds at most
#: MAX_K h <= sigma n 2^-10 to the sensitivity.
SNAP_BITS = 22
#: Delta is raised by this relative amount: its float64 sum, Delta / eps and the charged
#: Delta / b are fewer than 10 roundings of at most 2^-53 each, so the real sensitivity over
#: the drawn scale stays below the charged epsilon.
SENSITIVITY_SLACK = 2.0**-40


def check_sigma(sigma: float) -> float:
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


def snap_grid(sigma: float, n: int) -> float:
    """h: the largest power of two <= sigma n / 2^SNAP_BITS, the grid w is snapped to and the
    noise is drawn on."""
    return float(2.0 ** math.floor(math.log2(sigma * n) - SNAP_BITS))


def dp_ie_sensitivity(
    sigma: float, n: int, *, rounds: int, degree_bound: int, beta: float = EMBEDDING_BETA
) -> float:
    """The l1 sensitivity of the snapped embedding round_h(w~) as computed in float64, any
    k <= MAX_K (module docstring, steps 1-3):

        Delta = (n (sigma + 2 e_p) + 2 e_w + MAX_K h)(1 + SENSITIVITY_SLACK),

    sigma n from Theorems 4.3 and 5.1; e_p PushFlowCap's float64 rounding (R = ``rounds``,
    ``beta``, a public bound on every degree); e_w InstantEmbedding's; MAX_K h the snapping's.
    Public parameters only: never the graph's own degrees."""
    rounding = pushflowcap_rounding_margin(n, rounds, beta, degree_bound)
    if not rounding <= 1.0:  # e_w holds for ||p~||_1 <= 1 + e_p <= 2
        raise InvalidParameter("rounds", "PushFlowCap's float64 rounding margin exceeds 1")
    exact = n * (sigma + 2.0 * rounding) + 2.0 * instant_embedding_rounding_margin(n)
    return (exact + MAX_K * snap_grid(sigma, n)) * (1.0 + SENSITIVITY_SLACK)


def plan_dp_instant_embedding(
    epsilon: float,
    sigma: float,
    n: int,
    *,
    rounds: int,
    degree_bound: int,
    beta: float = EMBEDDING_BETA,
) -> LaplacePlan:
    """Laplace plan of sensitivity :func:`dp_ie_sensitivity` (sigma n (1 + at most 2^-10 + the
    rounding margins)): b = Delta / eps, rounded up. ``rounds``, ``beta`` and ``degree_bound``
    are those of the PushFlowCap the release runs (the degree bound public:
    :func:`plan_for_graph`)."""
    sigma = check_sigma(sigma)
    for name, value, low in (("n", n, 1), ("rounds", rounds, 1), ("degree_bound", degree_bound, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidParameter(name, f"must be an integer >= {low}, got {value!r}")
    if not (isinstance(beta, int | float) and math.isfinite(beta) and 0.0 < beta < 1.0):
        raise InvalidParameter("beta", f"must be in (0, 1), got {beta!r}")
    sensitivity = dp_ie_sensitivity(sigma, n, rounds=rounds, degree_bound=degree_bound, beta=beta)
    return plan_laplace(epsilon, sensitivity)


def plan_for_graph(
    epsilon: float, sigma: float, graph: Graph, *, rounds: int, beta: float = EMBEDDING_BETA
) -> LaplacePlan:
    """:func:`plan_dp_instant_embedding` for a release on ``graph``: its node count and its
    public degree bound (:func:`service.graph.public_bounds.public_degree_bound`)."""
    return plan_dp_instant_embedding(
        epsilon, sigma, graph.n, rounds=rounds, degree_bound=public_degree_bound(graph), beta=beta
    )


def exact_noisy_release(
    w: np.ndarray, plan: LaplacePlan, sigma: float, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """(released, grid): round_G(round_h(w) + h N) for every coordinate of ``w`` (any shape),
    N exact with gamma = h / dyadic_scale(plan.scale), h = :func:`snap_grid`, G =
    ``score_grid(plan.scale)`` (module docstring, steps 3-5)."""
    h = snap_grid(sigma, n)
    grid = score_grid(plan.scale)
    noise = grid_laplace(rng, plan.scale, h, count=w.size).reshape(w.shape)
    return round_to_grid(round_to_grid(w, h) + noise, grid), grid


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
    embedded: np.ndarray | None = None,
    floor: float = EMBEDDING_FLOOR,
) -> DpEmbedding:
    """DP-IE of ``seed`` (internal index). ``rng`` defaults to a fresh OS-entropy generator;
    the serving path never passes one. ``capped`` (the PushFlowCap vector of exactly these
    graph, seed, beta, rounds, sigma, mode and floor) skips recomputing it in evaluation loops;
    ``embedded`` (its InstantEmbedding under ``hashes``: :mod:`service.embeddings.noise_free`)
    skips both."""
    sigma = check_sigma(sigma)
    check_k(hashes.k)
    mode = Mode(mode)
    if hashes.buckets.shape[0] != graph.n:
        raise InvalidParameter("hashes", "were computed for a different node set")
    plan = plan_for_graph(epsilon, sigma, graph, rounds=rounds, beta=beta)
    if embedded is not None:
        w = np.asarray(embedded, dtype=np.float64)
        if w.shape != (hashes.k,):
            raise InvalidParameter("embedded", f"expected {hashes.k} entries, got {w.shape}")
    else:
        p = (
            capped
            if capped is not None
            else pushflowcap_with_floor(graph, seed, beta, rounds, sigma, mode, floor)
        )
        w = instant_embedding(p, hashes)
    rng = rng if rng is not None else fresh_generator()
    released, grid = exact_noisy_release(w, plan, sigma, graph.n, rng)
    return DpEmbedding(released, grid, plan, sigma, mode, hashes.salt_hex)
