"""Laplace mechanisms with a bounded sensitivity: calibration, curves, the two baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.errors import InvalidParameter
from service.mechanisms.common_neighbours import (
    common_neighbour_counts,
    noisy_common_neighbours,
)
from service.mechanisms.popular import degrees_from_bytes, degrees_to_bytes, noisy_degrees
from service.privacy.accountant import RdpCurve, compose
from service.privacy.curves import laplace_curve
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    laplace_plan_for_scale,
    plan_laplace,
    round_up,
)
from service.privacy.modes import Mode
from service.privacy.sampler import count_release_tv
from tests.graph_helpers import graph_from_edges, random_graph


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.3, 1 / 3, 0.7, 1.0, 2.0])
@pytest.mark.parametrize("sensitivity", [1.0, 2.0, 0.5])
def test_plan_rounds_the_scale_up(epsilon: float, sensitivity: float) -> None:
    plan = plan_laplace(epsilon, sensitivity)
    assert plan.scale >= sensitivity / epsilon
    assert plan.epsilon <= epsilon
    assert plan.epsilon == pytest.approx(epsilon, rel=1e-5)
    assert plan.curve == laplace_curve(plan.epsilon).with_sampler_tv(count_release_tv())
    assert plan.curve.pure == plan.epsilon


def test_round_up() -> None:
    assert round_up(20.0) == 20.0
    assert round_up(2 / 0.3) == 6.66667
    assert round_up(1 / 3) == pytest.approx(0.333334)
    with pytest.raises(InvalidParameter):
        round_up(0.0)


def test_curves_compose_through_the_accountant() -> None:
    """Ten Laplace releases at eps 0.1 compose to less than 1.0 at delta 1e-6, like any curve."""
    plan = plan_laplace(0.1, COMMON_NEIGHBOUR_SENSITIVITY)
    total = compose([plan.curve] * 10)
    assert isinstance(total, RdpCurve)
    assert total.pure == pytest.approx(10 * plan.epsilon)
    assert plan.epsilon * 5 < total.epsilon(1e-6) < 10 * plan.epsilon


@pytest.mark.parametrize(
    ("epsilon", "sensitivity"), [(0.0, 2.0), (-1.0, 2.0), (math.inf, 2.0), (0.1, 0.0)]
)
def test_bad_plans(epsilon: float, sensitivity: float) -> None:
    with pytest.raises(InvalidParameter):
        plan_laplace(epsilon, sensitivity)


def test_noisy_degrees_scale_and_bytes() -> None:
    graph = random_graph(400, 0.05, np.random.default_rng(0))
    plan = plan_laplace(0.5, DEGREE_SENSITIVITY)
    released = noisy_degrees(graph, plan, np.random.default_rng(1))
    noise = released - graph.degrees
    # mean |Lap(b)| = b: 400 draws put the sample mean within ~15% of b = 4
    assert np.mean(np.abs(noise)) == pytest.approx(plan.scale, rel=0.15)
    back = degrees_from_bytes(degrees_to_bytes(released), graph.n)
    np.testing.assert_array_equal(back, released)
    with pytest.raises(ValueError):
        degrees_from_bytes(degrees_to_bytes(released)[:-8], graph.n)
    with pytest.raises(InvalidParameter):
        noisy_degrees(graph, laplace_plan_for_scale(1.0, 10.0))  # understated sensitivity


def test_fresh_noise_by_default() -> None:
    graph = random_graph(50, 0.1, np.random.default_rng(0))
    plan = plan_laplace(1.0, DEGREE_SENSITIVITY)
    assert not np.array_equal(noisy_degrees(graph, plan), noisy_degrees(graph, plan))
    cn = plan_laplace(1.0, COMMON_NEIGHBOUR_SENSITIVITY)
    assert not np.array_equal(
        noisy_common_neighbours(graph, 0, cn), noisy_common_neighbours(graph, 0, cn)
    )


def test_common_neighbour_counts_by_hand() -> None:
    #   0 - 1, 0 - 2, 1 - 3, 2 - 3, 2 - 4, 4 - 5
    graph = graph_from_edges([(0, 1), (0, 2), (1, 3), (2, 3), (2, 4), (4, 5)])
    np.testing.assert_array_equal(common_neighbour_counts(graph, 0), [2, 0, 0, 2, 1, 0])


def test_common_neighbours_refused_in_edge_mode() -> None:
    graph = random_graph(20, 0.3, np.random.default_rng(0))
    plan = plan_laplace(1.0, COMMON_NEIGHBOUR_SENSITIVITY)
    with pytest.raises(InvalidParameter) as info:
        noisy_common_neighbours(graph, 0, plan, mode=Mode.EDGE)
    assert info.value.parameter == "mechanism"
