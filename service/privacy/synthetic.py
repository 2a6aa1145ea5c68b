"""Privacy accounting of the synthetic-graph generators (pure functions).

Two generators, two DIFFERENT promises (docs/synthetic.md says which is which, side by side):

- ``privdpr`` (Zhang et al., KDD 2025, with spec-synthetic-graph.md's corrections) is (eps, delta)
  NODE-level DP, bounded relation (N public): a neighbouring graph replaces all of one node's
  edges. Every step adds (discrete) Gaussian noise to the batch sum of per-pair gradients of the
  embedding matrix V; the sum's norm is bounded uniformly over ALL graphs on N nodes, so the
  guarantee even holds between any two graphs with N nodes.
- ``communities`` (ours) is pure eps EDGE-level DP: neighbouring graphs differ in one edge. It is
  the composition of Laplace releases of counts whose l1 sensitivity to one edge is 2.

PrivDPR's calibration (spec, "Corrections [ours]" and step 5 "[ours, recommended]"):

    M       = (2(N-1) gamma^2 + 2 gamma + 2 gamma (1-gamma)/N) (1 + 1/gamma)      (Lemma 4.4)
    G_pair  = M * prod_l ||Wt_l||_2 = M s^-(L+1)    (L+1 matrices, EXACT spectral norms = 1/s)
    Delta_2 = 2 * B_max * G_pair,   B_max = b R_wn R_wl   (replace-one: factor 2; pairs, not b)
    std     = z * Delta_2,  z the smallest multiplier whose T-fold Gaussian RDP, T alpha/(2 z^2),
              converts to <= eps at delta with the ledger's conversion (rounded up).

The noise is an EXACT discrete Gaussian on an integer quantization of the sum [ours]
(:func:`privdpr_quantization`): each step releases q + Z, q = round(S / quantum) for the batch
sum S (every coordinate to the nearest integer), kept in the l2 ball of radius sqrt(R2) (set to
0 outside it), Z ~ N_Z(0, sigma^2)^d with sigma^2 = m 2^tau >= z^2 (2 sqrt(R2))^2. Two graphs'
q are within 2 sqrt(R2) =: Delta_int in l2, so each step is alpha / (2 z^2)-RDP (the discrete
Gaussian's curve is at most the continuous one's, service.privacy.discrete_gaussian) and the
run's curve is the same T alpha / (2 z^2). With S_max = B_max G_pair the largest norm of S and
quantum = S_max z / 2^51 (so the noise's scale is 2^52 quanta), ||q|| <= ||S|| / quantum +
sqrt(d) / 2 <= sqrt(R2): the ball is never reached, and the noise in S's units is quantum sigma
= z Delta_2 (1 + z sqrt(d) 2^-52) (1 + 2^-52): the continuous calibration's to ~1e-9.

The depth L is the paper's MINIMUM depth (Eq. 13): the smallest integer with
B_max M s^-(L+1) <= S_grad / T. With the noise calibrated to the actual Delta_2, L affects only
the numerics (and the signal-to-noise ratio, which is at most B_max G_pair / std), not privacy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from service.errors import InvalidParameter
from service.privacy.accountant import RdpCurve, rdp_to_epsilon
from service.privacy.curves import laplace_curve
from service.privacy.discrete_gaussian import discrete_gaussian_parameters
from service.privacy.orders import ORDERS

#: Noise multipliers are rounded up to this many significant digits.
_SIGNIFICANT_DIGITS = 6

#: Privacy units, as recorded with every synthetic release.
NODE_LEVEL = "node"
EDGE_LEVEL = "edge"

#: l1 sensitivity to one edge of a node-by-group count matrix (u's count towards v's group and
#: v's count towards u's group each move by 1) and of the degree vector.
GROUP_COUNT_SENSITIVITY = 2.0


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise InvalidParameter(name, f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def privdpr_pair_bound(n: int, gamma: float) -> float:
    """M of Lemma 4.4: a bound on |d loss/d f_i| + |d loss/d f_j| of one pair, for any degrees
    (d_j / d_i <= N - 1, never the data's maximum degree) and any f in (0, 1)."""
    if n < 2:
        raise InvalidParameter("nodes", f"PrivDPR needs at least 2 nodes, got {n}")
    if not 0.0 < gamma < 1.0:
        raise InvalidParameter("gamma", f"gamma must be in (0, 1), got {gamma}")
    return (2.0 * (n - 1) * gamma**2 + 2.0 * gamma + 2.0 * gamma * (1.0 - gamma) / n) * (
        1.0 + 1.0 / gamma
    )


def privdpr_min_depth(n: int, gamma: float, s: float, s_grad: float, pairs: int, steps: int) -> int:
    """Smallest L with ``pairs`` * M * s^-(L+1) <= S_grad / T (Eq. 13; a MINIMUM, not Thm 4.2's
    "maximum"). ``pairs`` is the number of pairs in a batch (B_max), not the start nodes."""
    if s <= 1.0:
        raise InvalidParameter("s", f"the normalisation s must be > 1, got {s}")
    m = privdpr_pair_bound(n, gamma)
    target = _positive("s_grad", s_grad) / (pairs * m * steps)
    depth = max(0, math.ceil(math.log(target) / math.log(1.0 / s) - 1.0 - 1e-12))
    while pairs * m * s ** (-(depth + 1)) > s_grad / steps:  # guard the float rounding
        depth += 1
    return depth


def privdpr_sensitivity(n: int, gamma: float, weight_norm_product: float, max_pairs: int) -> float:
    """Delta_2 = 2 * B_max * M * prod_l ||Wt_l||_2: the l2 distance the noised batch sum can
    move between two graphs on ``n`` nodes (replace-one: both sums have norm <= B_max G_pair)."""
    if max_pairs < 1:
        raise InvalidParameter("max_pairs", "a batch holds at least one pair")
    return 2.0 * max_pairs * privdpr_pair_bound(n, gamma) * float(weight_norm_product)


def gaussian_curve(multiplier: float, steps: int = 1) -> RdpCurve:
    """RDP of ``steps`` Gaussian mechanisms with noise std = multiplier * l2 sensitivity:
    steps * alpha / (2 z^2). Its pure-DP value is infinite."""
    z = _positive("noise multiplier", multiplier)
    return RdpCurve(steps * ORDERS / (2.0 * z * z), math.inf)


def gaussian_epsilon(multiplier: float, steps: int, delta: float) -> float:
    return rdp_to_epsilon(steps * ORDERS / (2.0 * multiplier**2), math.inf, delta)


def _round_up(value: float) -> float:
    digits = _SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(value))
    scale = 10.0**digits
    return math.ceil(value * scale) / scale


def calibrate_gaussian_multiplier(epsilon: float, delta: float, steps: int) -> float:
    """Smallest z (rounded up) whose ``steps``-fold Gaussian curve converts to <= epsilon."""
    epsilon = _positive("epsilon", epsilon)
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"delta must be in (0, 1), got {delta}")
    if steps < 1:
        raise InvalidParameter("steps", f"steps must be >= 1, got {steps}")
    low, high = 1e-3, 1.0
    while gaussian_epsilon(high, steps, delta) > epsilon:
        low, high = high, high * 2.0
        if high > 1e12:
            raise InvalidParameter("epsilon", f"epsilon {epsilon} is too small to calibrate")
    for _ in range(200):
        mid = 0.5 * (low + high)
        if gaussian_epsilon(mid, steps, delta) > epsilon:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    z = _round_up(high)
    assert gaussian_epsilon(z, steps, delta) <= epsilon
    return z


#: The discrete Gaussian's scale in units of the quantum is about 2^NOISE_BITS: the released
#: integers resolve the noise to 52 bits, as finely as float64 resolves it.
NOISE_BITS = 52
#: The largest sum / quantum (so that the integer sum plus the noise fits in 63 bits).
_MAX_SIGNAL = 2**60


def privdpr_quantization(
    sum_bound: float, coordinates: int, multiplier: float
) -> tuple[float, int]:
    """(quantum, R2) for a sum of l2 norm at most ``sum_bound`` over ``coordinates`` = d
    coordinates, noised at ``multiplier`` = z times its sensitivity: quantum = sum_bound /
    min(2^51 / z, 2^60), so the noise's scale z 2 sum_bound is about 2^52 quanta; R2 =
    floor((sum_bound / quantum + ceil(sqrt(d)) / 2)^2), exactly, the square of the largest norm
    round(S / quantum) can have (||round(x) - x||_2 <= sqrt(d) / 2)."""
    if not (math.isfinite(sum_bound) and sum_bound > 0) or coordinates < 1:
        raise InvalidParameter("coordinates", "a positive sum bound and >= 1 coordinate")
    z = Fraction(_positive("noise multiplier", multiplier))
    signal = min(Fraction(2 ** (NOISE_BITS - 1)) / z, Fraction(_MAX_SIGNAL))
    quantum = sum_bound / float(signal)
    radius = Fraction(sum_bound) / Fraction(quantum) + Fraction(math.isqrt(coordinates - 1) + 1, 2)
    return quantum, math.floor(radius * radius)


@dataclass(frozen=True)
class PrivdprPlan:
    """Everything PrivDPR's noise and the ledger need, fixed before any data is touched.

    ``sensitivity`` is Delta_2 in the gradient's units; the release is in units of
    ``quantum``: the quantized sum, kept within norm sqrt(``radius_squared``), plus the
    discrete Gaussian of variance ``noise_m`` 2^``noise_tau`` >= (multiplier Delta_int)^2,
    Delta_int = 2 sqrt(radius_squared) (``integer_sensitivity``)."""

    nodes: int
    steps: int
    depth: int
    max_pairs: int
    sensitivity: float
    multiplier: float
    noise_std: float  # in the gradient's units: quantum sqrt(noise_m 2^noise_tau)
    epsilon: float
    delta: float
    coordinates: int
    quantum: float
    radius_squared: int
    noise_m: int
    noise_tau: int

    @property
    def integer_sensitivity(self) -> float:
        return 2.0 * math.sqrt(self.radius_squared)

    @property
    def curve(self) -> RdpCurve:
        return gaussian_curve(self.multiplier, self.steps)


def privdpr_plan(
    *,
    nodes: int,
    epsilon: float,
    delta: float,
    gamma: float,
    s: float,
    s_grad: float,
    start_nodes: int,
    walks: int,
    walk_length: int,
    epochs: int,
    embedding_dim: int,
) -> PrivdprPlan:
    """The corrected calibration: T = epochs * floor(N / b) fixed in advance, L from Eq. 13
    with B = B_max, Delta_2 with the factor 2 and exact norms, z by the accountant; the
    quantization of the N x ``embedding_dim`` sum and the discrete Gaussian's variance."""
    if start_nodes < 1 or start_nodes > nodes:
        raise InvalidParameter("batch", f"start nodes per batch must be in [1, {nodes}]")
    if walks < 1 or walk_length < 1 or epochs < 1:
        raise InvalidParameter("walks", "walks, walk length and epochs must be >= 1")
    steps = epochs * (nodes // start_nodes)
    max_pairs = start_nodes * walks * walk_length
    depth = privdpr_min_depth(nodes, gamma, s, s_grad, max_pairs, steps)
    sensitivity = privdpr_sensitivity(nodes, gamma, s ** (-(depth + 1)), max_pairs)
    z = calibrate_gaussian_multiplier(epsilon, delta, steps)
    if embedding_dim < 1:
        raise InvalidParameter("embedding_dim", "the embedding has at least one dimension")
    coordinates = nodes * embedding_dim
    quantum, radius_squared = privdpr_quantization(sensitivity / 2.0, coordinates, z)
    # sigma^2 >= z^2 Delta_int^2 = z^2 4 R2, exactly (z is a binary fraction)
    m, tau = discrete_gaussian_parameters(Fraction(z) ** 2 * 4 * radius_squared)
    return PrivdprPlan(
        nodes=nodes,
        steps=steps,
        depth=depth,
        max_pairs=max_pairs,
        sensitivity=sensitivity,
        multiplier=z,
        noise_std=quantum * math.sqrt(m * 2.0**tau),
        epsilon=float(epsilon),
        delta=float(delta),
        coordinates=coordinates,
        quantum=quantum,
        radius_squared=radius_squared,
        noise_m=m,
        noise_tau=tau,
    )


#: l1 sensitivity of the edge count to one edge, and of the in-block edge count.
EDGE_COUNT_SENSITIVITY = 1.0
LOCALITY_SENSITIVITY = 1.0


def triangle_sensitivity(bound: int) -> float:
    """l1 sensitivity to one edge of the triangle count of the degree-``bound`` projection
    (service.synthetic.triangles): 2 (D - 1). One edge changes at most three edges of the
    projection (itself and one displaced neighbour at each end); an edge of a graph of maximum
    degree D lies in at most D - 1 triangles; at most one edge is added and two removed."""
    return 2.0 * max(int(bound) - 1, 0)


@dataclass(frozen=True)
class CommunityPlan:
    """The edge-level generator's budget, split before any data is read:

    - ``probe``: the edge count + Lap(1 / eps_probe) (sensitivity 1);
    - ``degrees``: the degree vector + Lap(2 / eps_degrees) (sensitivity 2);
    - ``triangles``: the triangle count of the degree-``triangle_bound`` projection
      + Lap(2 (D - 1) / eps_triangles) (sensitivity 2 (D - 1), :func:`triangle_sensitivity`);
    - ``locality``: the number of edges inside the blocks of consecutive nodes of the public
      order + Lap(1 / eps_locality) (sensitivity 1: an edge is counted at most once);
    - ``rounds``: each of ``rounds`` node-by-group count matrices + Lap(2 / eps_round)
      (sensitivity 2: one edge moves u's count towards v's group and v's towards u's).

    All pure DP, so the run is pure eps-DP with eps the sum (basic composition); the curve is the
    sum of the Laplace curves. When the probe says the graph is too sparse for communities, the
    rounds' budget goes to the degrees instead (decided on a DP output: post-processing).
    """

    probe_epsilon: float
    degree_epsilon: float
    round_epsilon: float
    rounds: int
    triangle_epsilon: float = 0.0
    triangle_bound: int = 0
    locality_epsilon: float = 0.0

    @property
    def epsilon(self) -> float:
        return (
            self.probe_epsilon
            + self.degree_epsilon
            + self.triangle_epsilon
            + self.locality_epsilon
            + self.rounds * self.round_epsilon
        )

    @property
    def triangle_sensitivity(self) -> float:
        return triangle_sensitivity(self.triangle_bound)

    def without_rounds(self) -> CommunityPlan:
        """The same total with the rounds' share moved to the degrees."""
        return replace(
            self,
            degree_epsilon=self.degree_epsilon + self.rounds * self.round_epsilon,
            round_epsilon=0.0,
            rounds=0,
        )

    @property
    def curve(self) -> RdpCurve:
        total = laplace_curve(self.probe_epsilon) + laplace_curve(self.degree_epsilon)
        if self.triangle_epsilon > 0.0:
            total = total + laplace_curve(self.triangle_epsilon)
        if self.locality_epsilon > 0.0:
            total = total + laplace_curve(self.locality_epsilon)
        if self.rounds:
            total = total + laplace_curve(self.round_epsilon) * self.rounds
        return total


def community_plan(
    epsilon: float,
    *,
    probe_share: float,
    degree_share: float,
    rounds: int,
    triangle_share: float = 0.0,
    triangle_bound: int = 0,
    locality_share: float = 0.0,
) -> CommunityPlan:
    """Split ``epsilon``: ``probe_share`` to the edge count, ``degree_share`` to the degrees,
    ``triangle_share`` to the truncated triangle count and ``locality_share`` to the in-block
    edge count (none when 0), the rest equally over ``rounds`` rounds of group counts."""
    epsilon = _positive("epsilon", epsilon)
    if not 0.0 < probe_share < 1.0 or not 0.0 < degree_share < 1.0:
        raise InvalidParameter("share", "budget shares must be in (0, 1)")
    if not 0.0 <= triangle_share < 1.0:
        raise InvalidParameter("triangle_share", "the triangle share must be in [0, 1)")
    if not 0.0 <= locality_share < 1.0:
        raise InvalidParameter("locality_share", "the locality share must be in [0, 1)")
    if triangle_share > 0.0 and triangle_bound < 2:
        raise InvalidParameter("triangle_bound", "the triangle degree bound must be >= 2")
    if rounds < 1:
        raise InvalidParameter("rounds", f"rounds must be >= 1, got {rounds}")
    rest = 1.0 - probe_share - degree_share - triangle_share - locality_share
    if rest <= 0.0:
        raise InvalidParameter("share", "the budget shares must sum to < 1")
    return CommunityPlan(
        probe_epsilon=epsilon * probe_share,
        degree_epsilon=epsilon * degree_share,
        round_epsilon=epsilon * rest / rounds,
        rounds=rounds,
        triangle_epsilon=epsilon * triangle_share,
        triangle_bound=triangle_bound if triangle_share > 0.0 else 0,
        locality_epsilon=epsilon * locality_share,
    )
