"""The noisy diffusion's state grid (docs/privacy.md, "The diffusion on a grid"): the grid and
scale a plan chooses, and fact 2 of the proof measured on the served kernel."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from service.mechanisms.engine import thresholded_step
from service.mechanisms.operator import walk_operator
from service.privacy.floating import float64_distortion_margin
from service.privacy.state_grid import (
    GRID_SHARE,
    MAX_DENOMINATOR,
    MIN_STATE_GRID,
    STATE_CLAMP,
    float_contraction_slack,
    round_up_dyadic,
    step_noise_plan,
)
from tests.graph_helpers import graph_from_edges, random_graph


@pytest.mark.parametrize("n", [2, 41, 4039, 20_000, 10**6, 10**8])
@pytest.mark.parametrize("scale", [5e-7, 5e-5, 1e-3, 0.1])
@pytest.mark.parametrize("beta", [0.5, 0.8, 0.95])
def test_the_plan_covers_the_slack_it_charges(n: int, scale: float, beta: float) -> None:
    eta, degree = 1e-7, 20_000
    plan = step_noise_plan(scale, n=n, max_degree=degree, eta=eta, beta=beta)
    rho = 2 * beta * eta
    g = plan.grid
    assert g == 2.0 ** round(math.log2(g)) and g >= MIN_STATE_GRID  # a power of two
    spread = (1 + beta) * n
    # the grid is the largest allowed one unless a floor forced it up
    if g > MIN_STATE_GRID and g > scale * 2.0**-43 * 2:
        assert spread * g <= GRID_SHARE * rho < 2 * spread * g
    # rho'' = rho (1 + kappa) + s_float + (1 + beta) n g, and b'' >= b rho'' / rho
    kappa = float64_distortion_margin(degree, eta, beta)
    s_float = float_contraction_slack(n, degree, eta, beta)
    assert plan.slack == pytest.approx(s_float + spread * g, rel=1e-12)
    rho2 = rho * (1 + kappa) + plan.slack
    assert Fraction(plan.scale) * Fraction(rho) >= Fraction(scale) * Fraction(rho2)
    assert plan.scale <= scale * (rho2 / rho) * (1 + 2.0**-7)  # no more than the rounding
    # gamma is exactly grid / scale, in integers the sampler takes
    assert Fraction(plan.s, plan.t) == Fraction(g) / Fraction(plan.scale)
    assert math.gcd(plan.s, plan.t) == 1 and 0 < plan.t < MAX_DENOMINATOR
    assert (
        Fraction(plan.limit) * Fraction(g) <= STATE_CLAMP < Fraction(plan.limit + 1) * Fraction(g)
    )
    assert plan.limit <= 2**60


def test_a_scale_no_grid_can_carry_is_refused() -> None:
    """b / eta = 3e8 on 10^8 nodes: the grid the sampler needs (b 2^-43) leaves a rounding
    slack of hundreds of rho, which would need more noise, which needs a coarser grid..."""
    with pytest.raises(ValueError, match="no state grid fits"):
        step_noise_plan(30.0, n=10**8, max_degree=20_000, eta=1e-7, beta=0.8)


def test_round_up_dyadic() -> None:
    for value in (1e-7, 0.3, 1.0, 3.0, 12345.678, 2.0**-40 * 3):
        up = round_up_dyadic(value)
        mantissa, _ = math.frexp(up)
        assert up >= value and up <= value * (1 + 2.0**-7)
        assert math.ldexp(mantissa, 8) == int(math.ldexp(mantissa, 8))  # 8 significant bits
        assert round_up_dyadic(up) == up
    with pytest.raises(ValueError):
        round_up_dyadic(0.0)


def _grid_map(graph, x: np.ndarray, seed: int, beta: float, eta: float, grid: float) -> np.ndarray:  # type: ignore[no-untyped-def]
    """psi_G(x): the served kernel's step with zero noise, on the grid (the noise-free part of
    a noisy step)."""
    op = walk_operator(graph)
    out = thresholded_step(
        op,
        x[:, None].copy(),
        seeds=np.array([seed], dtype=np.int64),
        betas=np.array([beta]),
        etas=np.array([eta]),
        personalized=np.array([False]),
        noise=np.zeros((1, graph.n), dtype=np.int64),
        slots=np.zeros(1, dtype=np.int64),
        grids=np.array([grid]),
        limits=np.array([int(STATE_CLAMP / grid)], dtype=np.int64),
    )
    return out[:, 0].copy()


def _neighbours(rng: np.random.Generator):  # type: ignore[no-untyped-def]
    """A random graph G on 24 nodes and G + uv for a random non-edge uv."""
    graph = random_graph(24, 0.15, rng)
    edges = {
        (int(a), int(b))
        for a, b in zip(*np.nonzero(graph.adjacency.toarray()), strict=True)
        if a < b
    }
    non_edges = [(a, b) for a in range(24) for b in range(a + 1, 24) if (a, b) not in edges]
    u, v = non_edges[rng.integers(len(non_edges))]
    return graph, graph_from_edges(sorted(edges | {(u, v)}), n=24)


def _float_margins(plus, eta: float, beta: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """kappa and s_float for the larger graph's degrees."""
    degree = int(plus.degrees.max())
    return (
        float64_distortion_margin(degree, eta, beta),
        float_contraction_slack(plus.n, degree, eta, beta),
    )


def test_grid_maps_contract_up_to_the_stated_slack_and_the_rounding_term_is_needed() -> None:
    """Fact 2: ||psi_G(x) - psi_G'(y)||_1 <= beta ||x - y||_1 + rho (1 + kappa) + s_float + n g
    for neighbours G, G' = G + uv and states x, y on a coarse grid, over many random pairs
    (y close to x, so the rounding of nearly equal values shows). Control: without the n g term
    the bound fails on some pair - the slack is charged because it is reached."""
    rng = np.random.default_rng(11)
    beta, eta = 0.8, 0.05
    grid = 2.0**-9
    excess_over_rounding = []
    worst_ratio = 0.0
    for trial in range(30):
        graph, plus = _neighbours(rng)
        n = graph.n
        rho = 2 * beta * eta
        kappa, s_float = _float_margins(plus, eta, beta)
        for _ in range(20):
            x = np.rint(rng.uniform(-0.05, 0.6, n) / grid) * grid
            y = x + np.rint(rng.normal(0, 0.3, n)) * grid
            seed = int(rng.integers(n))
            gx = _grid_map(graph, x, seed, beta, eta, grid)
            gy = _grid_map(plus, y, seed, beta, eta, grid)
            left = np.abs(gx - gy).sum()
            base = beta * np.abs(x - y).sum() + rho * (1 + kappa) + s_float
            assert left <= base + n * grid, (trial, left, base)
            excess_over_rounding.append(left - base)
            worst_ratio = max(worst_ratio, (left - base) / grid)
    assert max(excess_over_rounding) > 0, "the rounding term was never needed: no control"
    assert worst_ratio <= n


def _straddling_pair(rng: np.random.Generator, n: int, grid: float) -> tuple[np.ndarray, ...]:
    """Two off-grid states below every threshold that straddle the rounding's boundaries:
    every coordinate just below a half-cell in one and just above it in the other."""
    cells = rng.integers(0, 20, n)  # c < 0.04 < eta d for d >= 1: f does not clip
    return (
        (cells + 0.5 - rng.uniform(0, 0.01, n)) * grid,
        (cells + 0.5 + rng.uniform(0, 0.01, n)) * grid,
    )


def _off_grid_map(
    graph, c: np.ndarray, seed: int, beta: float, eta: float, grid: float
) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Psi_G(c) = psi_G(round_g(c)): a map of the continuous process (the grid state is the
    rounding of its state)."""
    return _grid_map(graph, np.rint(c / grid) * grid, seed, beta, eta, grid)


def test_maps_of_off_grid_states_contract_up_to_both_roundings() -> None:
    """The maps of the continuous process, Psi_G(c) = psi_G(round_g(c)):
    ||Psi_G(c) - Psi_G'(c')||_1 <= beta ||c - c'||_1 + rho (1 + kappa) + s_float + (1 + beta) n g
    for neighbours G, G' = G + uv and off-grid states straddling the rounding's boundaries.
    Control, on one graph (no distortion to hide in): the outer rounding's n g alone does not
    cover what the input rounding adds, so its beta n g is charged because it is reached."""
    rng = np.random.default_rng(12)
    beta, eta = 0.8, 0.05
    grid = 2.0**-9
    for _ in range(20):
        graph, plus = _neighbours(rng)
        n = graph.n
        rho = 2 * beta * eta
        kappa, s_float = _float_margins(plus, eta, beta)
        for _ in range(20):
            c, c_next = _straddling_pair(rng, n, grid)
            seed = int(rng.integers(n))
            left = np.abs(
                _off_grid_map(graph, c, seed, beta, eta, grid)
                - _off_grid_map(plus, c_next, seed, beta, eta, grid)
            ).sum()
            base = beta * np.abs(c - c_next).sum() + rho * (1 + kappa) + s_float
            assert left <= base + (1 + beta) * n * grid
    worst = 0.0
    for _ in range(300):
        graph = random_graph(6, 0.6, rng)
        n, degree = graph.n, max(int(graph.degrees.max()), 1)
        s_float = float_contraction_slack(n, degree, eta, beta)
        c, c_next = _straddling_pair(rng, n, grid)
        seed = int(rng.integers(n))
        left = np.abs(
            _off_grid_map(graph, c, seed, beta, eta, grid)
            - _off_grid_map(graph, c_next, seed, beta, eta, grid)
        ).sum()
        base = beta * np.abs(c - c_next).sum() + s_float
        assert left <= base + (1 + beta) * n * grid
        worst = max(worst, (left - base) / (n * grid))
    assert worst > 1.0, "the input rounding never passed the outer one's n g: no control"


def test_a_noise_free_job_has_no_grid() -> None:
    from service.mechanisms.engine import DiffusionJob, run_jobs
    from service.privacy.calibration import DiffusionConfig
    from service.privacy.modes import Mode

    graph = random_graph(30, 0.2, np.random.default_rng(2))
    config = DiffusionConfig(
        mode=Mode.PERSONALIZED, beta=0.8, steps=1, eta=1e-3, noise_scale=0.0, noisy_steps=0
    )
    job = DiffusionJob(0, config, rng=None)
    run_jobs(graph, [job])
    assert job.noise is None and job.noise_scale == 0.0
