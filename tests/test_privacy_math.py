"""The accountant's math against independent numbers: dp_accounting and the spec."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import dp_accounting
import mpmath
import numpy as np
import pytest
from dp_accounting import rdp as dp_rdp

from service.errors import InvalidParameter
from service.privacy.accountant import RdpCurve, compose, rdp_to_epsilon
from service.privacy.calibration import (
    CURVE_MATCH_RTOL,
    calibrate,
    choose_noisy_steps,
    config_curve,
    plan_diffusion,
)
from service.privacy.curves import diffusion_curve, diffusion_rdp, laplace_curve, laplace_rdp
from service.privacy.modes import Mode
from service.privacy.orders import GRID_VERSION, ORDERS

P, E = Mode.PERSONALIZED, Mode.EDGE


def _dp_accounting_laplace_rdp(order: float, ratio: float) -> float:
    """Laplace RDP at one order, read back through dp_accounting's public API.

    RdpAccountant on a one-order grid converts its internal RDP r with
    eps = r + ln(1 - 1/a) - ln(delta a)/(a - 1); we invert that formula.
    """
    delta = 1e-10
    accountant = dp_rdp.RdpAccountant(orders=[order])
    accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / ratio))
    eps = accountant.get_epsilon(delta)
    return eps - math.log1p(-1.0 / order) + math.log(delta * order) / (order - 1.0)


@pytest.mark.parametrize("ratio", [1e-3, 0.02, 0.1, 1.0, 7.5])
def test_laplace_rdp_agrees_with_dp_accounting(ratio: float) -> None:
    for order in ORDERS[::7]:
        ours = float(laplace_rdp(order, ratio))
        theirs = _dp_accounting_laplace_rdp(float(order), ratio)
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)


def test_laplace_rdp_limits() -> None:
    assert float(laplace_rdp(1e6, 0.3)) == pytest.approx(0.3, rel=1e-5)  # -> r/b
    assert float(laplace_rdp(2.0, 0.0)) == 0.0
    assert np.all(np.diff(laplace_rdp(ORDERS, 0.05)) >= 0)  # non-decreasing in the order


@pytest.mark.parametrize(
    ("c", "mode", "queries", "delta"),
    [(80.0, P, 1, 3e-6), (8.0, P, 3, 1e-5), (20.0, E, 10, 1e-6), (500.0, P, 100, 1e-8)],
)
def test_conversion_agrees_with_dp_accounting_compute_epsilon(
    c: float, mode: Mode, queries: int, delta: float
) -> None:
    curve = diffusion_curve(c, 100, 0.8, mode) * queries
    theirs, _order = dp_rdp.compute_epsilon(list(ORDERS), list(curve.rdp), delta)
    ours = rdp_to_epsilon(curve.rdp, math.inf, delta)  # RDP part alone, as dp_accounting sees it
    assert ours == pytest.approx(theirs, rel=1e-12)
    assert curve.epsilon(delta) == pytest.approx(min(theirs, curve.pure), rel=1e-12)


@pytest.mark.parametrize(("eps", "expected_c"), [(0.1, 80.0), (1.0, 8.0), (0.01, 799.0)])
def test_reference_noise_ratios(eps: float, expected_c: float) -> None:
    cal = calibrate(eps, 3e-6, 100, 0.8, P)
    assert cal.c == pytest.approx(expected_c, rel=0.005)


@pytest.mark.parametrize(("queries", "expected"), [(10, 0.71), (100, 2.56)])
def test_reference_composition(queries: int, expected: float) -> None:
    one = calibrate(0.1, 3e-6, 100, 0.8, P).curve
    composed = compose([one] * queries)
    assert composed.epsilon(3e-6) == pytest.approx(expected, rel=0.005)


def test_single_query_needs_large_orders() -> None:
    """The optimum for one query at eps 0.1 sits far past 64: a short grid overstates eps."""
    curve = calibrate(0.1, 3e-6, 100, 0.8, P).curve
    _, order = dp_rdp.compute_epsilon(list(ORDERS), list(curve.rdp), 3e-6)
    assert order > 1000
    short = ORDERS <= 64
    eps_short, _ = dp_rdp.compute_epsilon(list(ORDERS[short]), list(curve.rdp[short]), 3e-6)
    assert eps_short > 1.5 * curve.epsilon(3e-6)


def _all_steps_reference(c: float, steps: int, beta: float, mode: Mode, alpha: float) -> float:
    """Theorem 4 (corrected) / Theorem 1 term by term, independent of the vectorised code."""

    def g(r: float) -> float:
        # Mironov's formula as printed, in 60-digit arithmetic (no log-space tricks).
        with mpmath.workdps(60):
            a, e = mpmath.mpf(alpha), mpmath.mpf(r) / c
            inner = a / (2 * a - 1) * mpmath.exp((a - 1) * e) + (a - 1) / (2 * a - 1) * mpmath.exp(
                -a * e
            )
            return float(mpmath.log(inner) / (a - 1))

    rho = 2 * beta
    best = math.inf
    taus = range(1, steps) if mode is P else range(steps)
    for tau in taus:
        if mode is P:
            w = rho * (1 - beta ** (tau - 1)) / (1 - beta)
        else:
            w = rho * (1 - beta**tau) / (1 - beta)
        best = min(best, g(beta ** (steps - tau) * w) + (steps - tau) * g(rho))
    return best


@pytest.mark.parametrize("mode", [P, E])
@pytest.mark.parametrize(("c", "steps"), [(80.0, 100), (5.0, 12), (300.0, 3)])
def test_curve_matches_theorem_written_out(mode: Mode, c: float, steps: int) -> None:
    rdp, _ = diffusion_rdp(c, steps, 0.8, mode)
    for i in range(0, len(ORDERS), 11):
        expected = _all_steps_reference(c, steps, 0.8, mode, float(ORDERS[i]))
        assert rdp[i] == pytest.approx(expected, rel=1e-8)


def test_pure_value_of_personalized_mode() -> None:
    c = 80.0
    _, pure = diffusion_rdp(c, 100, 0.8, P)
    assert pure == pytest.approx(2 * 0.8 / ((1 - 0.8) * c), rel=1e-6)  # ~ 8 eta / b


def test_epsilon_falls_as_noise_grows() -> None:
    for mode in (P, E):
        eps = [diffusion_curve(c, 50, 0.8, mode).epsilon(1e-6) for c in (2, 5, 10, 40, 160, 640)]
        assert all(a > b for a, b in itertools.pairwise(eps))


def test_one_personalized_step_costs_nothing() -> None:
    curve = diffusion_curve(3.0, 1, 0.8, P)
    assert curve == RdpCurve.zero()
    assert curve.epsilon(1e-6) == 0.0
    plan = plan_diffusion(0.5, 1e-6, 1, 0.8, 1e-4, P)
    assert plan.epsilon == 0.0 and plan.config.noisy_steps == 0


def test_one_edge_step_is_one_laplace_pair() -> None:
    rdp, pure = diffusion_rdp(4.0, 1, 0.8, E)
    np.testing.assert_allclose(rdp, laplace_rdp(ORDERS, 2 * 0.8 / 4.0), rtol=1e-12)
    assert pure == pytest.approx(0.4)


@pytest.mark.parametrize("c", [2.0, 16.0, 80.0, 700.0])
def test_personalized_never_worse_than_edge(c: float) -> None:
    pers, edge = diffusion_curve(c, 100, 0.8, P), diffusion_curve(c, 100, 0.8, E)
    assert np.all(pers.rdp <= edge.rdp + 1e-15)
    assert pers.pure <= edge.pure


def test_identical_queries_compose_linearly() -> None:
    curve = calibrate(0.3, 1e-6, 40, 0.7, E).curve
    np.testing.assert_allclose(compose([curve] * 7).rdp, 7 * curve.rdp, rtol=1e-12)
    assert (curve * 7).pure == pytest.approx(7 * curve.pure)


@pytest.mark.parametrize("mode", [P, E])
@pytest.mark.parametrize("c", [1.6, 8.0, 80.0, 800.0])
def test_chosen_noisy_steps_is_exact_and_smallest(mode: Mode, c: float) -> None:
    steps, beta = 100, 0.8
    full_rdp, full_pure = diffusion_rdp(c, steps, beta, mode)
    noisy = choose_noisy_steps(c, steps, beta, mode)
    rdp, pure = diffusion_rdp(c, steps, beta, mode, steps - noisy)
    np.testing.assert_allclose(rdp, full_rdp, rtol=CURVE_MATCH_RTOL, atol=0)
    assert pure == pytest.approx(full_pure, rel=CURVE_MATCH_RTOL)
    if noisy > 1:
        fewer, _ = diffusion_rdp(c, steps, beta, mode, steps - noisy + 1)
        assert np.any(fewer > full_rdp * (1 + CURVE_MATCH_RTOL))


def test_spec_measurement_of_noisy_steps() -> None:
    """Spec: beta 0.8, K 100, personalized: L = 6 from 1.6 to 800 x eta (on its grid).

    On this grid the rule gives 6 from c = 3 up; at c = 1.6 already L = 5 is exact here (the
    rule, not the measured number, is the contract), and never more than 6.
    """
    for c in (3.0, 10.0, 80.0, 800.0):
        assert choose_noisy_steps(c, 100, 0.8, P) == 6
    assert choose_noisy_steps(1.6, 100, 0.8, P) in (5, 6)


def test_fewer_noisy_steps_cost_more() -> None:
    """Dropping noise from steps that matter is visible: L = 5 composes worse than L = 6."""
    c = calibrate(0.1, 3e-6, 100, 0.8, P).c
    six = RdpCurve(*diffusion_rdp(c, 100, 0.8, P, 94)) * 100
    five = RdpCurve(*diffusion_rdp(c, 100, 0.8, P, 95)) * 100
    assert five.epsilon(3e-6) > six.epsilon(3e-6) + 0.05


@pytest.mark.parametrize("mode", [P, E])
@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 1.0, 4.0])
def test_calibrated_scale_converts_back_within_target(mode: Mode, eps: float) -> None:
    plan = plan_diffusion(eps, 1e-6, 100, 0.8, 1e-7, mode)
    assert plan.epsilon <= eps
    assert plan.epsilon >= eps * (1 - 1e-4)  # and not wastefully far below it
    # Re-deriving the curve from the released configuration gives the same guarantee.
    again = config_curve(plan.config)
    assert again.epsilon(1e-6) <= eps
    np.testing.assert_allclose(again.rdp, plan.curve.rdp, rtol=1e-9)
    # Rounding only ever goes up: a scale 1e-6 smaller would not be lower in epsilon.
    assert plan.config.noise_scale == pytest.approx(1e-7 * calibrate(eps, 1e-6, 100, 0.8, mode).c)


def test_scale_invariance() -> None:
    a = plan_diffusion(0.2, 1e-6, 30, 0.8, 1e-7, P)
    b = plan_diffusion(0.2, 1e-6, 30, 0.8, 3.0, P)
    assert b.config.noise_scale / 3.0 == pytest.approx(a.config.noise_scale / 1e-7)
    assert a.curve == b.curve


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"steps": 0}, "steps"),
        ({"beta": 1.0}, "beta"),
        ({"beta": 0.0}, "beta"),
        ({"eta": 0.0}, "eta"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, float], name: str) -> None:
    args = {"epsilon": 0.1, "delta": 1e-6, "steps": 10, "beta": 0.8, "eta": 1e-6, "mode": P}
    args.update(kwargs)
    with pytest.raises(InvalidParameter) as err:
        plan_diffusion(**args)  # type: ignore[arg-type]
    assert err.value.parameter == name


def test_curve_serialisation_is_tagged_with_grid() -> None:
    curve = laplace_curve(0.5)
    data = curve.to_json()
    assert data["grid_version"] == GRID_VERSION
    assert RdpCurve.from_json(data) == curve
    with pytest.raises(ValueError, match="grid version"):
        RdpCurve.from_json({**data, "grid_version": GRID_VERSION + 1})


def test_conversion_never_exceeds_pure_value() -> None:
    curve = laplace_curve(0.05)
    assert curve.epsilon(1e-9) <= 0.05
    assert curve.epsilon(0.5) < 0.05


# The two-scale common-neighbour release (docs/ranking.md, Lemma 3 and Theorem 3) charges the
# one-dimensional Laplace curve at eps for a shift split over several coordinates. That rests on
# the Laplace curve being superadditive in the shift: g(a, f) + g(a, e - f) <= g(a, e).
_SUPERADDITIVITY_ORDERS = np.unique(
    np.concatenate([ORDERS, np.geomspace(1.01, 1e6, 400), [1.001, 1.05, 1.5, 2.0, 3.0]])
)
_SHIFTS = np.concatenate([np.geomspace(1e-4, 3.0, 60), [0.5, 1.0, 2.0, 3.0]])


def _worst_split_ratio(curve: Callable[[np.ndarray, float], np.ndarray]) -> float:
    """max over the grid of (g(a, f) + g(a, e - f)) / g(a, e): <= 1 iff superadditive there."""
    worst = 0.0
    for e in _SHIFTS:
        whole = np.maximum(curve(_SUPERADDITIVITY_ORDERS, e), 1e-300)
        for part in np.linspace(0.0, 1.0, 41):
            f = part * e
            split = curve(_SUPERADDITIVITY_ORDERS, f) + curve(_SUPERADDITIVITY_ORDERS, e - f)
            worst = max(worst, float(np.max(split / whole)))
    return worst


def test_laplace_rdp_is_superadditive_in_the_shift() -> None:
    assert _worst_split_ratio(laplace_rdp) <= 1.0 + 1e-9
    # two halves fall strictly short at finite orders (the charge is conservative there)
    assert float(2 * laplace_rdp(2.0, 0.5)) < float(laplace_rdp(2.0, 1.0))


def test_dp_accountings_laplace_rdp_is_superadditive_in_the_shift() -> None:
    from dp_accounting.rdp import rdp_privacy_accountant

    laplace = getattr(rdp_privacy_accountant, "_laplace_rdp", None)
    if laplace is None:  # pragma: no cover - a private function of that package
        pytest.skip("dp_accounting has no _laplace_rdp in this version")

    def theirs(orders: np.ndarray, shift: float) -> np.ndarray:
        return np.array([laplace(float(shift), float(order)) for order in orders])

    orders = _SUPERADDITIVITY_ORDERS
    for e in _SHIFTS[::3]:
        np.testing.assert_allclose(theirs(orders, e), laplace_rdp(orders, e), rtol=1e-7, atol=1e-12)
        for part in (0.1, 0.25, 0.5, 0.8):
            split = theirs(orders, part * e) + theirs(orders, (1.0 - part) * e)
            assert np.all(split <= theirs(orders, e) * (1.0 + 1e-9) + 1e-15), (e, part)


def test_the_superadditivity_check_can_fail() -> None:
    """The same check rejects a curve that is concave in the shift (the Gaussian-like
    alpha * sqrt(e) / 2), and a linear one sits exactly on the bound."""
    assert _worst_split_ratio(lambda a, e: a * np.sqrt(e) / 2.0) > 1.3
    assert _worst_split_ratio(lambda a, e: a * 0.0 + e) == pytest.approx(1.0)
