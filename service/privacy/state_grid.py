"""The grid the noisy diffusion's state lives on, and the scale its noise is drawn at.

The privacy analysis of the noisy diffusion (privacy-spec.md, Mechanism 1) is an iteration
``x_k = F_G(x_{k-1}) + xi1_k + xi2_k`` with Laplace noise. A float64 kernel cannot add exact
Laplace noise to a float64 state, so the served iteration is run on a grid ``g Z^n`` instead
(docs/privacy.md, "The diffusion on a grid"): every noisy step computes

    u_k = round_g(clip_4(F~_G(x_{k-1}))) + g M_k,     x_k = clip_2(u_k)

where ``F~_G`` is the float64 kernel, ``round_g`` rounds to the nearest multiple of ``g``,
``clip_c`` clamps every coordinate to ``[-c, c]``, and M is a vector of n independent draws of
the exact law of ``round((L1 + L2) / gamma)`` (L1, L2 independent Lap(1), gamma = g / b), drawn by
the exact integer sampler :mod:`service.mechanisms.exact_laplace`. Since the first term is on the
grid, ``u_k = round_g(c_k)`` with ``c_k = R_k + b (L1 + L2)``: the grid process is the rounding
of a process with continuous noise ``xi1 + xi2`` (the spec's, drawn as their sum) whose maps are
``Psi_G = round_g . clip_4 . F~_G . clip_2 . round_g``. The analysis carries over with the
per-step distortion ``rho`` replaced by

    rho'' = rho (1 + kappa) + s_float + (1 + beta) n g,

kappa the float64 distortion margin (:mod:`service.privacy.floating`), ``s_float`` the float64
error of the kernel on any state (the contraction ``||F~(x) - F~(y)|| <= beta ||x - y||`` holds
up to it), and ``(1 + beta) n g`` the two roundings of ``Psi_G`` (per coordinate ``|round(a) -
round(b)| <= |a - b| + g``; the inner one passes through the beta-contraction). Since every term
of the curve depends on the distortion and the scale only through their ratio, the noise is
drawn at ``b'' >= b rho'' / rho`` and the curve and the charged epsilon are exactly those
calibrated. ``b''`` is rounded up to a float with :data:`SCALE_MANTISSA_BITS` significant bits so
that ``gamma = g / b''`` is a ratio of integers the sampler can use exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from service.privacy.floating import UNIT_ROUNDOFF, float64_distortion_margin, gamma

__all__ = [
    "GRID_SHARE",
    "INPUT_CLAMP",
    "MIN_STATE_GRID",
    "NOISE_SATURATION",
    "SCALE_MANTISSA_BITS",
    "STATE_CLAMP",
    "StepNoise",
    "float_contraction_slack",
    "round_up_dyadic",
    "step_noise_plan",
]

#: The state is clamped to [-STATE_CLAMP, STATE_CLAMP] after each noisy step (in grid units,
#: at most 2^60). Before noise the diffusion's entries are at most 1 (the seed's threshold) plus
#: eta times a degree; the clamp bounds what the noise adds.
STATE_CLAMP = 2.0
#: The kernel's output is clamped to [-INPUT_CLAMP, INPUT_CLAMP] before it is rounded (in grid
#: units at most 2^61), so that it and a noise draw saturated at +-2^61 sum in an int64.
INPUT_CLAMP = 4.0
#: The smallest grid: STATE_CLAMP / g <= 2^60 and INPUT_CLAMP / g <= 2^61.
MIN_STATE_GRID = 2.0**-59
#: Noise draws are saturated at +-NOISE_SATURATION grid units (reached with probability below
#: exp(-2^18) per draw; docs/privacy.md, "The diffusion on a grid").
NOISE_SATURATION = 2**61
#: The grid is chosen so that the rounding slack is at most this share of rho (when the graph
#: is small enough for MIN_STATE_GRID to allow it).
GRID_SHARE = 2.0**-10
#: Significant bits of the drawn scale b'' (b'' rounded up to them: at most 2^-8 more noise).
SCALE_MANTISSA_BITS = 8
#: The grid is at least b 2^MIN_GAMMA_EXPONENT, so that gamma = g / b'' = s / t has t below
#: MAX_DENOMINATOR (the sampler's integers stay below 2^52).
MIN_GAMMA_EXPONENT = -43
MAX_DENOMINATOR = 2**52


@dataclass(frozen=True)
class StepNoise:
    """How one query's noisy steps draw: the grid, the drawn scale, gamma = s / t, the clamp."""

    grid: float
    scale: float
    s: int
    t: int
    limit: int  # STATE_CLAMP / grid: the clamp in grid units
    slack: float  # rho'' - rho (1 + kappa): what the grid and the float64 kernel add

    @property
    def gamma(self) -> float:
        return self.s / self.t


def round_up_dyadic(value: float, bits: int = SCALE_MANTISSA_BITS) -> float:
    """The smallest float >= ``value`` (> 0, finite) whose mantissa has at most ``bits`` bits."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"need a finite value > 0, got {value!r}")
    mantissa, exponent = math.frexp(value)  # value = mantissa 2^exponent, 0.5 <= mantissa < 1
    top = math.ceil(math.ldexp(mantissa, bits))  # exact: a power-of-two scaling of a float
    return math.ldexp(top, exponent - bits)


def _power_of_two_at_most(value: float) -> float:
    return math.ldexp(1.0, math.floor(math.log2(value)))


def _power_of_two_at_least(value: float) -> float:
    return math.ldexp(1.0, math.ceil(math.log2(value)))


def float_contraction_slack(n: int, max_degree: int, eta: float, beta: float) -> float:
    """A bound on ``||F~(x) - F(x)||_1 + ||F~(y) - F(y)||_1`` for any two states: each row of
    the kernel sums at most D + 3 nonnegative terms (the row's own clipped value, twice for an
    isolated node, its neighbours' clipped values over their degrees, the seed's ``1 - beta``)
    and rounds them with relative error at most gamma_{D+5}; over all rows the terms sum to at
    most ``(1 - beta) + beta ||f(x)||_1``, and ``||f(x)||_1 <= 1 + n min(INPUT_CLAMP, eta D)``
    (every threshold is eta d_i <= eta D, the seed's is 1). The state X (integers) enters the
    kernel as the float ``fl(X g)``, within relative u of X g; since f clips at t_i, that moves
    f by at most ``u t_i`` per coordinate: another ``u ||t||_1`` per state."""
    big_d = int(max_degree) + 1
    mass = 1.0 + n * min(INPUT_CLAMP, eta * big_d)
    # the state enters the kernel as fl(X g): f moves by at most u t_i per coordinate
    conversion = UNIT_ROUNDOFF * mass
    return 2.0 * (gamma(big_d + 5) * (1.0 + mass) + conversion) * (1.0 + UNIT_ROUNDOFF)


# Plans are kept, one per (scale, graph size, degree bound, eta, beta) in use: a plan is an
# immutable value of public figures, and a batch of queries would compute the same one each.
@lru_cache(maxsize=1024)
def step_noise_plan(
    noise_scale: float, *, n: int, max_degree: int, eta: float, beta: float
) -> StepNoise:
    """The grid and the drawn scale of a diffusion calibrated at ``noise_scale`` (b) on a graph
    of ``n`` nodes (public: the node list) under the public degree bound ``max_degree``.

    g is the largest power of two with ``(1 + beta) n g <= GRID_SHARE rho``, but at least
    :data:`MIN_STATE_GRID` and at least ``b 2^MIN_GAMMA_EXPONENT`` (rounded up to a power of
    two); the slack it leaves is charged in the scale whatever it is."""
    if not (noise_scale > 0 and math.isfinite(noise_scale)):
        raise ValueError(f"need a finite noise scale > 0, got {noise_scale!r}")
    if n < 1:
        raise ValueError("need n >= 1")
    rho = 2.0 * beta * eta
    kappa = float64_distortion_margin(max_degree, eta, beta)
    # the two roundings of a noisy step's map, (1 + beta) n g (rounded up)
    spread = math.nextafter((1.0 + beta) * n, math.inf)
    grid = max(
        _power_of_two_at_most(GRID_SHARE * rho / spread),
        MIN_STATE_GRID,
        _power_of_two_at_least(noise_scale * 2.0**MIN_GAMMA_EXPONENT),
    )
    contraction = float_contraction_slack(n, max_degree, eta, beta)
    for _ in range(64):
        slack = contraction + spread * grid
        # b'' = b rho'' / rho, rounded up twice (the product, then to the dyadic mantissa)
        ratio = math.nextafter(1.0 + kappa + math.nextafter(slack / rho, math.inf), math.inf)
        scale = round_up_dyadic(math.nextafter(noise_scale * ratio, math.inf))
        fraction = Fraction(grid) / Fraction(scale)  # exact: both are floats
        if fraction.denominator < MAX_DENOMINATOR:
            return StepNoise(
                grid=grid,
                scale=scale,
                s=fraction.numerator,
                t=fraction.denominator,
                limit=int(STATE_CLAMP / grid),
                slack=slack,
            )
        grid *= 2.0  # the slack made the scale too large for the grid: a coarser grid
    raise ValueError(
        f"no state grid fits n = {n}, eta = {eta}, noise scale {noise_scale}: the grid's "
        "rounding slack outgrows the noise (n b / eta above about 1e13)"
    )
