"""The float64 rounding margin of DP-IE's PushFlowCap: ||p~ - p||_1 <= e_p from public parameters.

Theorem 4.3 bounds ||p(G) - p(G')||_1 <= sigma for the exact-arithmetic recursion

    h^(i) = phi(e_s + P h^(i-1)),  h^(0) = 0,  p = alpha h^(R),
    phi_v(a) = min(max(a - tau, 0), c_v),  c_v = d(v) sigma / (2 (2 - alpha))  (c_s = inf in
    `personalized` mode),  P = lambda (I + K + A D^-1),  lambda = (1 - alpha) / 2,

where alpha = fl(1 - beta) and tau are the floats the kernels use (any tau >= 0 that does not
depend on the edges will do). The kernels compute p~ in float64 instead: Algorithm 2's dense
rounds at floor 0 (:mod:`service.mechanisms.pushflowcap`) and the incremental floored rounds
(:mod:`service.mechanisms.floored_pushflowcap`). :func:`pushflowcap_rounding_margin` bounds
||p~ - p||_1 for both kernels, both modes and every floor by a function of n, R, beta and the
public degree bound only (docs/privacy.md, "PushFlowCap's float64 rounding"). The proof, in
short (u = 2^-53, gamma_m = m u / (1 - m u), D the degree bound plus one, for the neighbour
graph's extra edge):

1. lambda = (1 - alpha) / 2 exactly (1 - fl(1 - beta) is exact by Sterbenz's lemma), so
   ||P||_1 = 1 - alpha and phi is 1-Lipschitz per coordinate: h -> phi(e_s + P h) is a
   (1 - alpha)-contraction in l1.
2. Let H_i be the computed h after round i and J_i the computed inflow e_s + P h (the
   incremental kernel keeps it; for the dense kernel J_i = r~_i + H_i, residual plus pushed,
   a real number the analysis reads off the floats). If, for every round,
   (a) ||H_i - phi(J_{i-1})||_1 <= c1 ||H_i||_1,  (b) ||J_i - (e_s + P H_i)||_1 <= E*,
   (c) ||H_i||_1 <= M*, then with e_i = ||H_i - h^(i)||_1,
   e_i <= (1 - alpha) e_{i-1} + c1 M* + E*, so e_R <= min(R, 1 / alpha) (c1 M* + E*), and
   p~ = fl(alpha H_R) gives

       e_p = min(alpha R, 1) (c1 M* + E*) + u alpha M*.

3. c1 = gamma_8 for both kernels (one subtraction and the computed cap c~ = c (1 + theta_3)).
4. Floored kernel: J_v is a float sum, in time order, of its start (1 at the seed) and
   nonnegative increments (h never decreases: fl is monotone), at most R (D + 1) additions,
   each increment within gamma_4 of the exact one, and the exact increments telescope to
   (e_s + P H_i)_v: E* = g (1 + (1 - alpha) M*), g = gamma_{R (D + 1) + 4}, and H_i <= J_{i-1}.
5. Dense kernel: J_i - J_{i-1} = P(H_i - H_{i-1}) + eps_r + (I - P) eps_h, where eps_h is the
   rounding of h + f (<= gamma_1 H_i) and eps_r that of the residual update (<= gamma_2 of the
   residual left plus gamma_{D+4} of the pushed terms); summed over R rounds:
   E* = beta_d J*, beta_d = R gamma_2 + (1 + u)(R (2 - alpha) gamma_1 + gamma_{D+4}
   (1 - alpha)(1 + R gamma_1)), and H_i <= (1 + u) J_{i-1}.
6. M* and J* solve the linear bounds of 4 and 5 (they are about 1 / alpha).
7. Underflow: with subnormals, or flush-to-zero, an operation may err by an absolute
   2^-1021 or less instead; the kernels do at most (R + 1) n (D + 12) operations, and each such
   error reaches p~ at most doubled (the recursion is a contraction and p = alpha h), so
   2^-1020 (R + 1) n (D + 12) is added.

The result is raised by :data:`COMPUTATION_SLACK` (relative) to cover the roundings of
computing it here.
"""

from __future__ import annotations

import math

from service.privacy.floating import UNIT_ROUNDOFF, gamma

__all__ = [
    "COMPUTATION_SLACK",
    "UNDERFLOW_PER_OPERATION",
    "dense_kernel_margin",
    "floored_kernel_margin",
    "pushflowcap_rounding_margin",
]

#: Absolute error of one operation in the underflow range: 2^-1075 with gradual underflow
#: (products), 2^-1022 with flush-to-zero results, and a subnormal operand read as zero
#: (denormals-are-zero) moves a sum, or a product by a factor at most 2, by at most 2^-1021.
UNDERFLOW_PER_OPERATION = 2.0**-1021
#: The computed margins are raised by this relative amount: they are sums and products of
#: fewer than 100 float64 roundings (each at most 2^-53 relative) of the exact formulas.
COMPUTATION_SLACK = 2.0**-30
#: Bound on the per-node error of phi (both kernels): ||H_i - phi(J_{i-1})||_1 <= gamma_8 ||H_i||.
PHI_ROUNDINGS = 8


def _check(n: int, rounds: int, beta: float, degree_bound: int) -> tuple[float, int]:
    """(alpha = fl(1 - beta), D = degree_bound + 1) after checking the public parameters."""
    for name, value, low in (("n", n, 1), ("rounds", rounds, 1), ("degree_bound", degree_bound, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not (isinstance(beta, int | float) and math.isfinite(beta) and 0.0 < beta < 1.0):
        raise ValueError(f"beta must be in (0, 1), got {beta!r}")
    return 1.0 - beta, degree_bound + 1


def _underflow(n: int, rounds: int, big_d: int) -> float:
    """2 x 2^-1021 per operation, at most (R + 1) n (D + 12) operations (docstring, 7)."""
    return 2.0 * UNDERFLOW_PER_OPERATION * (rounds + 1) * n * (big_d + 12)


def _output_error(
    alpha: float, rounds: int, phi_error: float, inflow_error: float, mass: float
) -> float:
    """e_p = min(alpha R, 1) (c1 M* + E*) + u alpha M* (docstring, 2)."""
    u = UNIT_ROUNDOFF
    return min(alpha * rounds, 1.0) * (phi_error * mass + inflow_error) + u * alpha * mass


def floored_kernel_margin(n: int, rounds: int, beta: float, degree_bound: int) -> float:
    """e_p of the incremental floored kernel (``_floored_rounds``), any floor >= 0, both modes,
    for a graph whose degrees are at most ``degree_bound`` (its neighbour: one more)."""
    alpha, big_d = _check(n, rounds, beta, degree_bound)
    g = gamma(rounds * (big_d + 1) + 4)
    lost = (1.0 + g) * (1.0 - alpha)
    if not lost < 1.0:
        raise ValueError("the rounding bound does not contract at these parameters")
    mass = (1.0 + g) / (1.0 - lost)  # J* = M*: (1 + g)(1 + (1 - alpha) M*) = M*
    inflow_error = g * (1.0 + (1.0 - alpha) * mass)
    margin = _output_error(alpha, rounds, gamma(PHI_ROUNDINGS), inflow_error, mass)
    return (margin + _underflow(n, rounds, big_d)) * (1.0 + COMPUTATION_SLACK)


def dense_kernel_margin(n: int, rounds: int, beta: float, degree_bound: int) -> float:
    """e_p of Algorithm 2's dense rounds (``_capped_push_rounds``, floor 0), both modes, for a
    graph whose degrees are at most ``degree_bound`` (its neighbour: one more)."""
    alpha, big_d = _check(n, rounds, beta, degree_bound)
    u = UNIT_ROUNDOFF
    g1 = gamma(1)
    beta_d = rounds * gamma(2) + (1.0 + u) * (
        rounds * (2.0 - alpha) * g1 + gamma(big_d + 4) * (1.0 - alpha) * (1.0 + rounds * g1)
    )
    lost = (1.0 - alpha) * (1.0 + u) + beta_d
    if not lost < 1.0:
        raise ValueError("the rounding bound does not contract at these parameters")
    inflow_mass = 1.0 / (1.0 - lost)  # J* = 1 + (1 - alpha) M* + E*, M* = (1 + u) J*
    mass = (1.0 + u) * inflow_mass
    inflow_error = beta_d * inflow_mass
    margin = _output_error(alpha, rounds, gamma(PHI_ROUNDINGS), inflow_error, mass)
    return (margin + _underflow(n, rounds, big_d)) * (1.0 + COMPUTATION_SLACK)


def pushflowcap_rounding_margin(n: int, rounds: int, beta: float, degree_bound: int) -> float:
    """e_p: a bound on ||p~ - p||_1 for DP-IE's PushFlowCap as the service computes it (either
    kernel, any floor, either mode) against the exact recursion, on any graph of n nodes whose
    degrees are at most ``degree_bound`` + 1 (a public bound and its neighbour's extra edge).
    Independent of sigma, the floor and the mode."""
    return max(
        floored_kernel_margin(n, rounds, beta, degree_bound),
        dense_kernel_margin(n, rounds, beta, degree_bound),
    )
