"""DP-PushFlowCap (Epasto et al., Algorithms 2 and 3): the baseline of privacy-spec.md Mechanism 2.

Push-flow PPR on the lazy walk with teleport alpha = 1 - beta, where every node v may push at
most d(v) * T_v of flow in total over all rounds (so at most T_v along each of its edges):

    T_u = sigma / (2 (2 - alpha))   for every u,   T_s = infinity in `personalized` (joint) mode.

Each of the R rounds pushes, for every node at once (the paper's "push all visited nodes"
variant), the flow f_v = min(r_v, d(v) T_v - h_v):

    h += f;  r -= f;  p += alpha f;  r += (1 - alpha)/2 f + (1 - alpha)/2 A (f / d)

(h = total flow pushed so far, p = alpha h by the paper's Observation 4.1). Nodes outside the
visited set have r = 0, so they push nothing and the set needs no bookkeeping. Theorem 4.3:
the output's L1 sensitivity is at most sigma to one edge not incident to s (joint mode) or to
any edge (non-joint), so adding Lap(sigma / eps) to every entry is pure eps-DP (Algorithm 3).

A node of degree 0 has cap 0 and never pushes, except the seed in personalized mode (cap
infinity): like the walk W, it then keeps the neighbours' share of its push (W e_s = e_s), so
with huge thresholds the output is the truncated series alpha sum_{k<R} ((1 - alpha) W)^k e_s.
"""

from __future__ import annotations

import math

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.parameters import PUSHFLOWCAP_SIGMA
from service.mechanisms.randomness import fresh_generator, laplace_noise
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_SIGMA",
    "add_laplace_noise",
    "dp_pushflowcap",
    "edge_threshold",
    "pushflowcap",
    "pushflowcap_curve",
]

#: The paper's experimental setting (Section 6): sigma = 1e-6 (service.mechanisms.parameters).
DEFAULT_SIGMA = PUSHFLOWCAP_SIGMA


def _finite_positive(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidParameter(name, f"must be a finite number > 0, got {value!r}")


def _check(graph: Graph, seed: int, beta: float, rounds: int, sigma: float) -> None:
    if not (isinstance(beta, int | float) and math.isfinite(beta) and 0.0 < beta < 1.0):
        raise InvalidParameter("beta", f"must be in (0, 1), got {beta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidParameter("rounds", f"must be an integer >= 1, got {rounds!r}")
    _finite_positive("sigma", sigma)
    if not 0 <= seed < graph.n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {graph.n})")


def edge_threshold(beta: float, sigma: float) -> float:
    """T = sigma / (2 (2 - alpha)) with alpha = 1 - beta: the cap on flow along one edge."""
    alpha = 1.0 - beta
    return sigma / (2.0 * (2.0 - alpha))


def pushflowcap(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float = DEFAULT_SIGMA,
    mode: Mode = Mode.PERSONALIZED,
) -> np.ndarray:
    """PUSHFLOWCAP (Algorithm 2), non-private: the capped push-flow PPR vector p (sum <= 1).

    ``mode``: `personalized` is the paper's joint type (T_s = infinity), `edge` its non-joint
    type (T_s = T). ``seed`` is an internal index. Vectorized: one sparse product per round.
    """
    _check(graph, seed, beta, rounds, sigma)
    mode = Mode(mode)
    alpha = 1.0 - beta
    lazy = (1.0 - alpha) / 2.0
    degrees = graph.degrees.astype(np.float64)
    cap = degrees * edge_threshold(beta, sigma)  # total flow a node may push: d(v) T_v
    if mode is Mode.PERSONALIZED:
        cap[seed] = math.inf
    inv_degree = np.divide(1.0, degrees, out=np.zeros_like(degrees), where=degrees > 0)
    keeps = (degrees == 0).astype(np.float64)  # degree-0 nodes keep the neighbours' share
    adjacency = graph.adjacency
    residual = np.zeros(graph.n)
    residual[seed] = 1.0
    pushed = np.zeros(graph.n)  # h: total flow pushed by each node so far
    for _ in range(rounds):
        flow = np.minimum(residual, np.maximum(cap - pushed, 0.0))
        pushed += flow
        residual -= flow
        residual += lazy * (flow * (1.0 + keeps) + adjacency @ (flow * inv_degree))
    return alpha * pushed


def add_laplace_noise(
    p: np.ndarray, sigma: float, epsilon: float, rng: np.random.Generator | None = None
) -> np.ndarray:
    """p + Lap(sigma / epsilon)^n (Algorithm 3's Laplace step; the SCALE is sigma / epsilon).

    ``rng`` defaults to a generator freshly seeded from the OS entropy source.
    """
    _finite_positive("sigma", sigma)
    _finite_positive("epsilon", epsilon)
    rng = rng if rng is not None else fresh_generator()
    values = np.asarray(p, dtype=np.float64)
    noise = laplace_noise(rng, sigma / epsilon, values.size).reshape(values.shape)
    out: np.ndarray = values + noise
    return out


def dp_pushflowcap(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float,
    epsilon: float,
    mode: Mode = Mode.PERSONALIZED,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """DPPUSHFLOWCAP (Algorithm 3): pure epsilon-DP (joint DP in `personalized` mode).

    ``rng`` defaults to a generator freshly seeded from the OS entropy source; tests may pass
    their own. The privacy cost is :func:`pushflowcap_curve` (epsilon).
    """
    _finite_positive("epsilon", epsilon)
    p = pushflowcap(graph, seed, beta, rounds, sigma, mode)
    return add_laplace_noise(p, sigma, epsilon, rng)


def pushflowcap_curve(epsilon: float) -> RdpCurve:
    """RDP cost of one DP-PushFlowCap release: the Laplace mechanism's curve at epsilon."""
    _finite_positive("epsilon", epsilon)
    return laplace_curve(epsilon)
