"""Laplace mechanisms with a proven l1 sensitivity: noise scale, pure epsilon and RDP curve.

A vector query q whose l1 sensitivity to one protected edge is at most ``sensitivity`` (Delta),
released as q + Lap(b)^n, is pure (Delta / b)-DP, and its Renyi divergence at order alpha is
at most the one-dimensional Laplace curve g(alpha, b, Delta) (Mironov 2017, Prop. 6: the
Laplace mechanism's RDP depends on the l1 shift only through Delta / b, and the worst case
puts the whole shift on one coordinate). So its curve is :func:`laplace_curve` at
epsilon = Delta / b, on the ledger's grid, and it composes through the accountant like any
other curve.

Calibration for a target epsilon: b = Delta / epsilon, rounded UP (never down) to six
significant digits, so the achieved epsilon Delta / b never exceeds the target. The count
releases and DP-IE draw their noise exactly, on their grid, at the scale
``dyadic_scale(b) >= b`` (b rounded up to a 20-bit mantissa, at most 2^-19 relative above;
:mod:`service.mechanisms.exact_laplace`): a slightly larger scale, so the plan's epsilon, which
is what is charged and stated, is an upper bound on the loss.

The sensitivities the service relies on (privacy-spec.md, "Baselines beyond the neighbours";
proofs in docs/ranking.md, brute-force tests in tests/test_ranking_sensitivity.py):

- DP degrees (``popular``): one edge changes two degrees by 1: Delta = 2, in both models.
- common-neighbour counts of a seed (personalized only): an edge {a, b} with a, b != s changes
  c(b) by 1 iff a is in N(s) and c(a) by 1 iff b is in N(s): Delta = 2.
- the same counts split by the seed's own neighbour list (personalized only; :class:`TwoScalePlan`):
  such an edge moves two FRIEND coordinates (N(s)) by 1 each iff a, b are both in N(s), exactly
  one CANDIDATE coordinate (V minus N(s) and s) by 1 iff exactly one of them is, and nothing
  otherwise; never a friend and a candidate coordinate at once. With Lap(b_f) on the friends
  and Lap(b_c) on the candidates the pure-DP loss sum_i |Delta_i| / b_i is at most
  max(2 / b_f, 1 / b_c); with b_f = 2 b_c that is 1 / b_c, so the candidates get half the
  noise of one-scale counts at the same epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.errors import InvalidParameter
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.sampler import count_release_tv

#: l1 sensitivity of the degree vector to one edge (two degrees change by 1).
DEGREE_SENSITIVITY = 2.0
#: l1 sensitivity of a seed's common-neighbour counts to one edge not touching the seed.
COMMON_NEIGHBOUR_SENSITIVITY = 2.0
#: l1 sensitivity of a seed's counts restricted to its friends N(s) (two coordinates move by 1).
FRIEND_COUNT_SENSITIVITY = 2.0
#: l1 sensitivity of a seed's counts restricted to the candidates V minus N(s) and s (one by 1).
CANDIDATE_COUNT_SENSITIVITY = 1.0
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


def count_release_curve(epsilon: float) -> RdpCurve:
    """What a count release at ``epsilon`` is charged: the Laplace curve. Its noise is drawn
    by the exact rounded-Laplace sampler at a scale at least the plan's
    (:mod:`service.privacy.sampler`), so the curve carries no sampler share
    (:func:`count_release_tv` is 0; releases drawn with the float sampler before keep the
    share stored with their charges)."""
    return laplace_curve(epsilon).with_sampler_tv(count_release_tv())


def laplace_plan_for_scale(sensitivity: float, scale: float) -> LaplacePlan:
    """The guarantee of Lap(``scale``) noise on a query of l1 sensitivity ``sensitivity``."""
    sensitivity = _positive("sensitivity", sensitivity)
    scale = _positive("scale", scale)
    epsilon = sensitivity / scale
    return LaplacePlan(sensitivity, scale, epsilon, count_release_curve(epsilon))


def plan_laplace(epsilon: float, sensitivity: float) -> LaplacePlan:
    """Smallest (rounded-up) scale b with sensitivity / b <= ``epsilon``."""
    epsilon = _positive("epsilon", epsilon)
    scale = round_up(_positive("sensitivity", sensitivity) / epsilon)
    plan = laplace_plan_for_scale(sensitivity, scale)
    if plan.epsilon > epsilon:  # pragma: no cover - round_up makes this unreachable
        raise AssertionError(f"Laplace calibration overshot: {plan.epsilon} > {epsilon}")
    return plan


@dataclass(frozen=True)
class TwoScalePlan:
    """Common-neighbour counts released with two Laplace scales split by the seed's own
    neighbour list: Lap(``friend_scale``) on the friends N(s), Lap(``candidate_scale``) on the
    candidates V minus N(s) and s (the seed's own count is not released).

    One protected edge moves either two friend coordinates by 1 or one candidate coordinate
    by 1, never both (docs/ranking.md, Lemma 3), so the pure-DP loss is at most
    ``epsilon`` = max(FRIEND_COUNT_SENSITIVITY / friend_scale,
    CANDIDATE_COUNT_SENSITIVITY / candidate_scale). Its Renyi divergence at every order is at
    most max(2 g(1 / b_f), g(1 / b_c)) <= g(epsilon), because the per-coordinate divergences of
    independent Laplace draws add and the Laplace curve is superadditive in the shift
    (g(f) + g(e - f) <= g(e)); so ``curve`` is the one-dimensional Laplace curve at
    ``epsilon``, the charge of a one-scale release at the same epsilon.
    """

    friend_scale: float
    candidate_scale: float
    epsilon: float
    curve: RdpCurve


def two_scale_plan_for_scales(friend_scale: float, candidate_scale: float) -> TwoScalePlan:
    """The guarantee of Lap(``friend_scale``) on the friends and Lap(``candidate_scale``) on the
    candidates."""
    friend_scale = _positive("friend_scale", friend_scale)
    candidate_scale = _positive("candidate_scale", candidate_scale)
    epsilon = max(
        FRIEND_COUNT_SENSITIVITY / friend_scale, CANDIDATE_COUNT_SENSITIVITY / candidate_scale
    )
    return TwoScalePlan(friend_scale, candidate_scale, epsilon, count_release_curve(epsilon))


def plan_two_scale(epsilon: float) -> TwoScalePlan:
    """The two-scale release for a target ``epsilon``: the friends get exactly the one-scale
    common-neighbour scale b = 2 / epsilon (rounded up, :func:`plan_laplace`), the candidates
    b / 2 (an exact halving), so the achieved epsilon, and the curve charged, are those of the
    one-scale release."""
    friends = plan_laplace(epsilon, FRIEND_COUNT_SENSITIVITY)
    plan = two_scale_plan_for_scales(friends.scale, friends.scale / 2.0)
    if plan.epsilon > _positive("epsilon", epsilon):  # pragma: no cover - halving is exact
        raise AssertionError(f"two-scale calibration overshot: {plan.epsilon} > {epsilon}")
    return plan
