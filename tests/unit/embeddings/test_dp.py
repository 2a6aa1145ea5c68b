"""DP-IE's plan is calibrated on a sensitivity that holds for the computed floats.

Delta = (n (sigma + 2 e_p) + 2 e_w + MAX_K h)(1 + 2^-40), with e_p PushFlowCap's float64 margin
(n, R, beta, the PUBLIC degree bound) and e_w InstantEmbedding's (n): the plan's scale is
Delta / eps rounded up, exactly as the functions compute it; it grows by about 2.7e-6 over the
exact-arithmetic plan (sigma n + MAX_K h) at the defaults and sigma 1e-3; the charged epsilon
stays at most the one asked for; a served graph's plan uses its configured bound, never its
own largest degree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_ROUNDS,
    MAX_K,
    SENSITIVITY_SLACK,
    dp_ie_sensitivity,
    dp_instant_embedding,
    plan_dp_instant_embedding,
    plan_for_graph,
    snap_grid,
)
from service.embeddings.hashing import embedding_hashes
from service.embeddings.instant import instant_embedding_rounding_margin
from service.errors import InvalidParameter
from service.graph.public_bounds import DEFAULT_MAX_DEGREE_BOUND, public_degree_bound
from service.mechanisms.pushflowcap_rounding import pushflowcap_rounding_margin
from service.privacy.laplace import round_up
from service.privacy.modes import Mode
from tests.graph_helpers import random_graph


@pytest.mark.parametrize("n", [10_000, 10_312, 100_000, 1_000_000])
@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_scale_is_the_margined_sensitivity_over_epsilon(n: int, epsilon: float) -> None:
    sigma, rounds, bound = 1e-3, EMBEDDING_ROUNDS, DEFAULT_MAX_DEGREE_BOUND
    e_p = pushflowcap_rounding_margin(n, rounds, EMBEDDING_BETA, bound)
    e_w = instant_embedding_rounding_margin(n)
    h = snap_grid(sigma, n)
    delta = (n * (sigma + 2.0 * e_p) + 2.0 * e_w + MAX_K * h) * (1.0 + SENSITIVITY_SLACK)
    plan = plan_dp_instant_embedding(epsilon, sigma, n, rounds=rounds, degree_bound=bound)
    assert (
        plan.sensitivity == delta == dp_ie_sensitivity(sigma, n, rounds=rounds, degree_bound=bound)
    )
    assert plan.scale == round_up(delta / epsilon)
    # against the plan before the margins (sigma n + MAX_K h): a few parts per million
    before = sigma * n + MAX_K * h
    growth = delta / before - 1.0
    assert 2.7e-6 < growth < 3.0e-6, growth
    assert round_up(before / epsilon) <= plan.scale <= round_up(before / epsilon) * (1 + 1e-5)
    # the charged epsilon: at most the one asked for, and as before within the 6-digit rounding
    assert epsilon * (1 - 1e-5) < plan.epsilon <= epsilon


def test_margin_at_the_extremes_of_the_public_parameters() -> None:
    """The largest accepted R (1,000) and degree bound (100,000): e_p is 1.4e-7, so the margin
    is 2.7e-4 of sigma n at sigma 1e-3 and 2.7 times it at the smallest sigma (1e-7)."""
    n = 1_000_000
    at_defaults = dp_ie_sensitivity(1e-3, n, rounds=1000, degree_bound=100_000)
    assert 1.0002 < at_defaults / (1e-3 * n + MAX_K * snap_grid(1e-3, n)) < 1.0003
    smallest_sigma = dp_ie_sensitivity(1e-7, n, rounds=1000, degree_bound=100_000)
    assert 3.7 < smallest_sigma / (1e-7 * n + MAX_K * snap_grid(1e-7, n)) < 3.8


def test_served_graph_plan_uses_the_public_bound() -> None:
    graph = random_graph(40, 0.2, np.random.default_rng(2))
    own = int(graph.degrees.max())
    served = dataclasses.replace(graph, degree_bound=500)
    assert public_degree_bound(served) == 500 and public_degree_bound(graph) == 10_000 > own
    plan = plan_for_graph(0.5, 1e-3, served, rounds=EMBEDDING_ROUNDS)
    assert plan == plan_dp_instant_embedding(
        0.5, 1e-3, 40, rounds=EMBEDDING_ROUNDS, degree_bound=500
    )
    # dp_instant_embedding plans for the R and beta it runs
    hashes = embedding_hashes([str(i) for i in range(40)], bytes(16), 4)
    for rounds, beta in ((EMBEDDING_ROUNDS, EMBEDDING_BETA), (7, 0.8)):
        drawn = dp_instant_embedding(
            served, 0, hashes, 0.5, 1e-3, Mode.EDGE, beta, rounds, rng=np.random.default_rng(0)
        )
        assert drawn.plan == plan_dp_instant_embedding(
            0.5, 1e-3, 40, rounds=rounds, degree_bound=500, beta=beta
        )


def test_bad_public_parameters_are_refused() -> None:
    for rounds, bound in ((0, 10), (True, 10), (10, -1)):
        with pytest.raises(InvalidParameter):
            plan_dp_instant_embedding(0.5, 1e-3, 40, rounds=rounds, degree_bound=bound)
    with pytest.raises(InvalidParameter):
        plan_dp_instant_embedding(0.5, 1e-3, 40, rounds=10, degree_bound=10, beta=1.0)
