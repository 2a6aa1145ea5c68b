"""Laplace mechanisms with a proven l1 sensitivity: noise scale, pure epsilon and RDP curve.

A vector query q whose l1 sensitivity to one protected edge is at most ``sensitivity`` (Delta),
released as q + Lap(b)^n, is pure (Delta / b)-DP, and its Renyi divergence at order alpha is
at most the one-dimensional Laplace curve g(alpha, b, Delta) (Mironov 2017, Prop. 6: the
Laplace mechanism's RDP depends on the l1 shift only through Delta / b, and the worst case
puts the whole shift on one coordinate). So its curve is :func:`laplace_curve` at
epsilon = Delta / b, on the ledger's grid, and it composes through the accountant like any
other curve.

Calibration for a target epsilon: b = Delta / epsilon, rounded UP (never down) to six
significant digits, so the achieved epsilon Delta / b never exceeds the target.

The sensitivities the service relies on (privacy-spec.md, "Baselines beyond the neighbours";
proofs in docs/ranking.md, brute-force tests in tests/test_ranking_sensitivity.py):

- DP degrees (``popular``): one edge changes two degrees by 1: Delta = 2, in both models.
- common-neighbour counts of a seed (personalized only): an edge {a, b} with a, b != s changes
  c(b) by 1 iff a is in N(s) and c(a) by 1 iff b is in N(s): Delta = 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.errors import InvalidParameter
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve

#: l1 sensitivity of the degree vector to one edge (two degrees change by 1).
DEGREE_SENSITIVITY = 2.0
#: l1 sensitivity of a seed's common-neighbour counts to one edge not touching the seed.
COMMON_NEIGHBOUR_SENSITIVITY = 2.0
#: Noise scales are rounded up to this many significant digits.
SIGNIFICANT_DIGITS = 6


@dataclass(frozen=True)
class LaplacePlan:
    """A calibrated Laplace release: its scale, sensitivity, achieved epsilon and curve."""

    sensitivity: float
    scale: float
    epsilon: float
    curve: RdpCurve


def _positive(name: str, value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidParameter(name, f"must be a finite number > 0, got {value!r}")
    return float(value)


def round_up(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """The smallest float with ``digits`` significant digits that is >= ``value``."""
    value = _positive("value", value)
    exponent = math.floor(math.log10(value)) - (digits - 1)
    mantissa = math.ceil(value / 10.0**exponent - 1e-9)
    rounded = float(f"{mantissa}e{exponent}")
    while rounded < value:  # guard against the product landing a hair below value
        rounded = math.nextafter(rounded, math.inf)
    return rounded


def laplace_plan_for_scale(sensitivity: float, scale: float) -> LaplacePlan:
    """The guarantee of Lap(``scale``) noise on a query of l1 sensitivity ``sensitivity``."""
    sensitivity = _positive("sensitivity", sensitivity)
    scale = _positive("scale", scale)
    epsilon = sensitivity / scale
    return LaplacePlan(sensitivity, scale, epsilon, laplace_curve(epsilon))


def plan_laplace(epsilon: float, sensitivity: float) -> LaplacePlan:
    """Smallest (rounded-up) scale b with sensitivity / b <= ``epsilon``."""
    epsilon = _positive("epsilon", epsilon)
    scale = round_up(_positive("sensitivity", sensitivity) / epsilon)
    plan = laplace_plan_for_scale(sensitivity, scale)
    if plan.epsilon > epsilon:  # pragma: no cover - round_up makes this unreachable
        raise AssertionError(f"Laplace calibration overshot: {plan.epsilon} > {epsilon}")
    return plan
