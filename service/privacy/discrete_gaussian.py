"""The discrete Gaussian's parameters and curve (pure math; the sampler is
:mod:`service.mechanisms.discrete_gaussian`).

The sampler draws ``N_Z(0, sigma^2)`` with ``sigma^2 = m 2^tau`` exactly (integers ``m >= 1``,
``0 <= tau <= MAX_TAU``). For an integer vector ``q`` whose l2 sensitivity is at most ``Delta``,
``q + N_Z(0, sigma^2)^d`` has Rényi divergence at most ``alpha Delta^2 / (2 sigma^2)`` at every
order alpha (Canonne, Kamath & Steinke 2020, Proposition 5 with independent coordinates: the
normalising sum over the integers is largest at an integer centre, so the discrete Gaussian's
curve is at most the continuous one's); its pure-DP value is infinite.
"""

from __future__ import annotations

import math
from fractions import Fraction

from service.errors import InvalidParameter

__all__ = ["MAX_M", "MAX_TAU", "discrete_gaussian_parameters", "discrete_gaussian_rdp"]

#: Largest tau (the sampler's t = 2^tau) accepted.
MAX_TAU = 52
#: m must be below this (2m fits in 64 bits).
MAX_M = 2**62


def discrete_gaussian_parameters(variance: Fraction | int | float) -> tuple[int, int]:
    """(m, tau) with m 2^tau >= ``variance`` exactly and tau = floor(log2 sqrt(variance)) (at
    most MAX_TAU): the smallest such m, so the variance is rounded up by less than 2^tau <=
    its square root (a relative 1 / sigma). Needs 1 <= variance, and m < 2^62."""
    exact = Fraction(variance)
    if not 1 <= exact < Fraction(MAX_M) * 2**MAX_TAU:
        raise InvalidParameter("variance", f"must be in [1, 2^114), got {float(exact)!r}")
    tau = min(MAX_TAU, (math.floor(exact).bit_length() - 1) // 2)
    m = math.ceil(exact / (1 << tau))
    if not 1 <= m < MAX_M:  # pragma: no cover - excluded by the range above
        raise InvalidParameter("variance", f"has no m < 2^62 at tau {tau}")
    return m, tau


def discrete_gaussian_rdp(order: float, shift_squared: float, variance: float) -> float:
    """The bound ``alpha ||shift||_2^2 / (2 sigma^2)`` on the Rényi divergence of order
    ``order`` between the discrete Gaussian and its shift by an integer vector."""
    if not order > 1.0 or shift_squared < 0.0 or not variance > 0.0:
        raise InvalidParameter("order", "needs order > 1, shift_squared >= 0, variance > 0")
    return order * shift_squared / (2.0 * variance)
