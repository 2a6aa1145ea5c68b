"""A rigorous bound on how much float64 arithmetic can add to the diffusion's distortion.

The calibration assumes that one thresholded step F_G(x) = phi(f(x)) moves by at most
rho = 2 beta eta in L1 when one edge changes (curves.distortion). The kernel computes F_G in
IEEE float64 (unit roundoff u = 2^-53), so what it actually produces may exceed rho by rounding.
Standard forward error analysis (docs/privacy.md, "Floating point and the sensitivity bound")
bounds the computed distortion by rho (1 + kappa) with

    kappa = (2 D + 2) D gamma_{D+5} + gamma_{D+5} / eta + u / (beta eta) + 2 (D + 1) u

where D is the largest degree of the graph plus one (a neighbouring graph has one edge more)
and gamma_k = k u / (1 - k u). The serving path draws its noise at a scale raised by kappa and
by the state grid's slack (:mod:`service.privacy.state_grid`), so the ratio distortion / scale,
which is all the privacy analysis uses, stays at rho / b.
"""

from __future__ import annotations

import math

#: Unit roundoff of IEEE 754 binary64 (round to nearest).
UNIT_ROUNDOFF = 2.0**-53


def gamma(k: int, u: float = UNIT_ROUNDOFF) -> float:
    """gamma_k = k u / (1 - k u): the bound on k accumulated relative rounding errors."""
    if k * u >= 1.0:
        return math.inf
    return k * u / (1.0 - k * u)


def float64_distortion_margin(max_degree: int, eta: float, beta: float) -> float:
    """kappa for a graph whose largest degree is ``max_degree`` (see the module docstring)."""
    if not (eta > 0 and 0 < beta < 1):
        raise ValueError("need eta > 0 and 0 < beta < 1")
    big_d = int(max_degree) + 1
    g = gamma(big_d + 5)
    u = UNIT_ROUNDOFF
    return (2 * big_d + 2) * big_d * g + g / eta + u / (beta * eta) + 2 * (big_d + 1) * u
