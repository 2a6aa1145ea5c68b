"""DP-PushFlowCap: the push-flow limit, the caps, Theorem 4.3's sensitivity bound, the noise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import service.mechanisms.pushflowcap as pfc
from service.errors import InvalidParameter
from service.mechanisms.exact import exact_ppr
from service.mechanisms.pushflowcap import (
    add_laplace_noise,
    dp_pushflowcap,
    edge_threshold,
    pushflowcap,
    pushflowcap_curve,
)
from service.mechanisms.randomness import fresh_generator
from service.privacy.curves import laplace_curve
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges, random_graph
from tests.unit.mechanisms.test_exact import dense_walk

P, E = Mode.PERSONALIZED, Mode.EDGE
HUGE = 1e12  # thresholds that never bind


def truncated_series(adjacency: np.ndarray, seed: int, beta: float, rounds: int) -> np.ndarray:
    """PUSHFLOW's output after R rounds: alpha * sum_{k < R} ((1 - alpha) W)^k e_s."""
    alpha = 1 - beta
    W = dense_walk(adjacency)
    term = np.zeros(adjacency.shape[0])
    term[seed] = 1.0
    total = np.zeros_like(term)
    for _ in range(rounds):
        total += alpha * term
        term = (1 - alpha) * W @ term
    return total


@pytest.mark.parametrize("mode", [P, E])
@pytest.mark.parametrize("rounds", [1, 2, 7, 30])
def test_uncapped_equals_push_flow(mode: Mode, rounds: int) -> None:
    rng = np.random.default_rng(rounds)
    graph = random_graph(25, 0.2, rng)
    dense = graph.adjacency.toarray()
    for seed in (0, 9, 24):
        if graph.degrees[seed] == 0 and mode is E:
            continue  # a degree-0 seed has cap 0 in non-joint mode
        p = pushflowcap(graph, seed, 0.8, rounds, HUGE, mode)
        np.testing.assert_allclose(p, truncated_series(dense, seed, 0.8, rounds), atol=1e-14)


def test_uncapped_converges_to_exact_ppr() -> None:
    graph = random_graph(80, 0.1, np.random.default_rng(5))
    for mode in (P, E):
        p = pushflowcap(graph, 3, 0.8, 200, HUGE, mode)
        np.testing.assert_allclose(p, exact_ppr(graph, 3, 0.8), atol=1e-12)


def test_isolated_seed_personalized_keeps_mass() -> None:
    graph = graph_from_edges([(0, 1), (1, 2)], n=4)
    p = pushflowcap(graph, 3, 0.8, 50, 1e-6, P)
    assert p[3] == pytest.approx(1 - 0.8**50)
    assert p[:3].sum() == 0
    assert pushflowcap(graph, 3, 0.8, 50, 1e-6, E).sum() == 0  # cap d T = 0


@pytest.mark.parametrize("mode", [P, E])
def test_caps_bound_each_node(mode: Mode) -> None:
    graph = random_graph(60, 0.1, np.random.default_rng(11))
    beta, sigma = 0.8, 1e-3
    alpha = 1 - beta
    p = pushflowcap(graph, 0, beta, 100, sigma, mode)
    cap = alpha * graph.degrees * edge_threshold(beta, sigma)  # p_v = alpha h_v <= alpha d T
    others = np.arange(graph.n) != 0
    assert np.all(p[others] <= cap[others] * (1 + 1e-12))
    if mode is E:
        assert p[0] == pytest.approx(cap[0], rel=1e-9)  # the seed is capped too, and binds
    else:
        assert np.any(p[others] >= cap[others] * (1 - 1e-9))  # the caps bind here
        assert p[0] > cap[0]  # T_s = infinity in joint mode
    assert np.all(p >= 0) and p.sum() <= 1


def test_threshold_value() -> None:
    # T = sigma / (2 (2 - alpha)), alpha = 1 - beta
    assert edge_threshold(0.8, 1e-6) == pytest.approx(1e-6 / (2 * 1.8), rel=1e-12)
    assert edge_threshold(0.2, 1.0) == pytest.approx(1 / (2 * 1.2), rel=1e-12)


def _max_sensitivity_ratio(
    edges: set[tuple[int, int]], n: int, seed: int, beta: float, sigma: float, mode: Mode,
    rounds: int = 60,
) -> float:  # fmt: skip
    """max ||p(G) - p(G ± e)||_1 / sigma over the protected pairs e (toggling: add or remove)."""
    base = pushflowcap(graph_from_edges(edges, n), seed, beta, rounds, sigma, mode)
    worst = 0.0
    for u, v in itertools.combinations(range(n), 2):
        if mode is P and seed in (u, v):
            continue  # the seed's own edges are not protected in the joint model
        other = pushflowcap(graph_from_edges(edges ^ {(u, v)}, n), seed, beta, rounds, sigma, mode)
        worst = max(worst, float(np.abs(base - other).sum()) / sigma)
    return worst


# A graph found by search where thresholds twice too large break the bound (ratio 4/3).
WITNESS = ({(0, 1), (0, 2), (0, 4), (0, 5), (1, 3), (1, 4), (3, 4)}, 6, 4, 0.2, 0.01)


@pytest.mark.parametrize("mode", [P, E])
def test_sensitivity_bound_theorem_4_3(mode: Mode) -> None:
    """Brute force over small random graphs: every protected edge moves p by at most sigma."""
    rng = np.random.default_rng(2024 if mode is P else 2025)
    worst = 0.0
    for _ in range(40):
        n = int(rng.integers(3, 8))
        density = float(rng.uniform(0.1, 0.9))
        edges = {(u, v) for u, v in itertools.combinations(range(n), 2) if rng.random() < density}
        seed = int(rng.integers(n))
        beta = float(rng.choice([0.2, 0.5, 0.8]))
        sigma = float(10 ** rng.uniform(-3, 0))
        ratio = _max_sensitivity_ratio(edges, n, seed, beta, sigma, mode)
        assert ratio <= 1 + 1e-9, (edges, n, seed, beta, sigma)
        worst = max(worst, ratio)
    assert worst > 0.3  # the search reaches the regime where the caps matter
    assert _max_sensitivity_ratio(*WITNESS, mode) <= 1 + 1e-9


def test_sensitivity_search_catches_wrong_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with T twice too large the same search finds a violation."""
    assert _max_sensitivity_ratio(*WITNESS, P) <= 1 + 1e-9
    correct = pfc.edge_threshold
    monkeypatch.setattr(pfc, "edge_threshold", lambda beta, sigma: 2 * correct(beta, sigma))
    assert _max_sensitivity_ratio(*WITNESS, P) > 1.2


def test_uncapped_push_flow_is_not_sensitivity_bounded() -> None:
    """Without caps a low-degree graph moves p by far more than a small sigma."""
    edges = {(0, 1), (1, 2), (2, 3)}
    p = pushflowcap(graph_from_edges(edges, 5), 0, 0.8, 60, HUGE, P)
    q = pushflowcap(graph_from_edges(edges | {(3, 4)}, 5), 0, 0.8, 60, HUGE, P)
    assert np.abs(p - q).sum() > 1e-3


def test_noise_scale_is_sigma_over_epsilon() -> None:
    """Mean absolute deviation of Lap(b) is b (its standard deviation is sqrt(2) b)."""
    graph = random_graph(500, 0.02, np.random.default_rng(1))
    sigma, epsilon = 1e-3, 0.25
    p = pushflowcap(graph, 0, 0.8, 50, sigma, P)
    rng = np.random.default_rng(12345)
    noise = np.concatenate(
        [dp_pushflowcap(graph, 0, 0.8, 50, sigma, epsilon, P, rng) - p for _ in range(40)]
    )
    scale = sigma / epsilon
    assert np.mean(np.abs(noise)) == pytest.approx(scale, rel=0.03)
    assert np.std(noise) == pytest.approx(np.sqrt(2) * scale, rel=0.04)
    assert abs(np.mean(noise)) < 0.05 * scale


def test_default_rng_is_fresh_os_entropy(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = random_graph(50, 0.1, np.random.default_rng(2))
    a = dp_pushflowcap(graph, 0, 0.8, 20, 1e-6, 1.0)
    b = dp_pushflowcap(graph, 0, 0.8, 20, 1e-6, 1.0)
    assert not np.array_equal(a, b)
    calls: list[int] = []
    real = fresh_generator

    def spy() -> np.random.Generator:
        calls.append(1)
        return real()

    monkeypatch.setattr(pfc, "fresh_generator", spy)
    dp_pushflowcap(graph, 0, 0.8, 20, 1e-6, 1.0)
    add_laplace_noise(np.zeros(3), 1e-6, 1.0)
    assert len(calls) == 2


def test_privacy_curve_is_laplace() -> None:
    curve = pushflowcap_curve(0.5)
    assert curve.pure == 0.5
    np.testing.assert_array_equal(curve.rdp, laplace_curve(0.5).rdp)


def test_bad_parameters() -> None:
    graph = graph_from_edges([(0, 1), (1, 2)])
    with pytest.raises(InvalidParameter):
        pushflowcap(graph, 0, 1.0, 10)
    with pytest.raises(InvalidParameter):
        pushflowcap(graph, 0, 0.8, 0)
    with pytest.raises(InvalidParameter):
        pushflowcap(graph, 0, 0.8, 10, sigma=0.0)
    with pytest.raises(InvalidParameter):
        pushflowcap(graph, 7, 0.8, 10)
    with pytest.raises(InvalidParameter):
        dp_pushflowcap(graph, 0, 0.8, 10, 1e-6, 0.0)
