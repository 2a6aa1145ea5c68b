"""The per-edge (per-instance) curve against brute force on tiny graphs, and against the worst case.

* The prefix quantities (w, lam, h) the report computes with the served kernel equal an
  independent dense computation of the mechanism straight from the privacy-spec.
* With one noisy step (L = 1) the released vector is a deterministic mean plus two Laplace
  draws per coordinate, so its exact Renyi divergence between G and G' is a sum of 1-D
  integrals: the per-instance bound must be at least that, and a deliberately wrong bound
  (the two draws taken for one Laplace of twice the scale) is caught below it.
* Per-instance <= worst case for every edge and non-edge of a small graph, both modes; a
  deliberately wrong bound (the paper's distortion constant 4 beta eta) is caught above it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate

from service.edge_report.shifts import has_edge, prefix_shifts, toggled_graph
from service.graph.build import build_graph
from service.graph.model import Graph
from service.privacy import per_edge
from service.privacy.curves import laplace_rdp
from service.privacy.modes import Mode
from service.privacy.orders import ORDERS
from service.privacy.per_edge import (
    PrefixShifts,
    ReleaseParameters,
    per_instance_curve,
    worst_case_curve,
)


def _random_graph(n: int, p: float, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a, b in itertools.combinations(range(n), 2) if rng.random() < p]
    src, dst = zip(*pairs, strict=True)
    return build_graph(np.array(src), np.array(dst), num_nodes=n)


def _dense_step(adj: np.ndarray, x: np.ndarray, s: int, beta: float, eta: float, mode: Mode):
    """phi(f(x)) from the privacy-spec, with dense matrices (independent of the kernel)."""
    d = adj.sum(axis=0)
    t = eta * d
    if mode is Mode.PERSONALIZED:
        t[s] = 1.0
    y = np.minimum(np.maximum(x, 0.0), t)
    p = np.divide(adj, d[None, :], out=np.zeros_like(adj), where=d[None, :] > 0)
    walk = 0.5 * (np.eye(len(d)) + p) + 0.5 * np.diag((d == 0).astype(float))
    out = beta * walk @ y
    out[s] += 1.0 - beta
    return out


def _dense_shifts(
    graph: Graph, u: int, v: int, s: int, mode: Mode, beta: float, eta: float, m: int
):
    adj = graph.adjacency.toarray()
    adj2 = adj.copy()
    adj2[u, v] = adj2[v, u] = 1.0 - adj[u, v]
    x = np.zeros(graph.n)
    x[s] = 1.0
    x2 = x.copy()
    for _ in range(m):
        x, x2 = _dense_step(adj, x, s, beta, eta, mode), _dense_step(adj2, x2, s, beta, eta, mode)
    g_x, t_x2 = _dense_step(adj, x, s, beta, eta, mode), _dense_step(adj2, x2, s, beta, eta, mode)
    g_x2, t_x = _dense_step(adj, x2, s, beta, eta, mode), _dense_step(adj2, x, s, beta, eta, mode)
    return np.abs(x - x2).sum(), np.abs(g_x - t_x2).sum(), t_x2 - g_x2, g_x - t_x, g_x, t_x2


def _pairs(graph: Graph, seed: int, mode: Mode) -> list[tuple[int, int]]:
    return [
        (a, b)
        for a, b in itertools.combinations(range(graph.n), 2)
        if mode is Mode.EDGE or seed not in (a, b)
    ]


@pytest.mark.parametrize("mode", list(Mode))
def test_prefix_quantities_match_a_dense_computation(mode: Mode) -> None:
    graph = _random_graph(9, 0.35, seed=3)
    beta, eta, m, seed = 0.8, 0.04, 3, 0
    for u, v in _pairs(graph, seed, mode):
        toggled = toggled_graph(graph, u, v)
        assert has_edge(toggled, u, v) != has_edge(graph, u, v)
        (got,) = prefix_shifts(
            graph, toggled, [seed], mode=mode, beta=beta, eta=eta, noise_free_steps=m
        )
        w, lam, fwd, rev, _, _ = _dense_shifts(graph, u, v, seed, mode, beta, eta, m)
        assert got.w == pytest.approx(w, rel=1e-12, abs=1e-15)
        assert got.lam == pytest.approx(lam, rel=1e-12, abs=1e-15)
        for kept, dense in ((got.h_forward, fwd), (got.h_reverse, rev)):
            # equal up to rounding (an entry may be 0 in one and 1e-18 in the other)
            ours, theirs = (
                np.sort(kept[kept > 1e-14]),
                np.sort(np.abs(dense[np.abs(dense) > 1e-14])),
            )
            assert ours == pytest.approx(theirs, rel=1e-10)
            assert kept.sum() == pytest.approx(np.abs(dense).sum(), rel=1e-10, abs=1e-14)
            # the distortion at any point is at most rho = 2 beta eta (privacy-spec)
            assert np.abs(dense).sum() <= 2 * beta * eta * (1 + 1e-12)


def _log_sum_of_two_laplace_density(z: float) -> float:
    """log density of Lap(1) + Lap(1): (1 + |z|) e^-|z| / 4."""
    a = abs(z)
    return math.log(0.25) + math.log1p(a) - a


def _exact_renyi(shift: float, alpha: float) -> float:
    """D_alpha(LL || LL shifted by ``shift``), LL = Lap(1) + Lap(1), by numeric integration
    (in log space, so high orders neither overflow nor underflow)."""
    if shift == 0.0:
        return 0.0

    def f(z: float) -> float:
        p = _log_sum_of_two_laplace_density(z)
        q = _log_sum_of_two_laplace_density(z - shift)
        return math.exp(alpha * p + (1.0 - alpha) * q)

    total = sum(
        integrate.quad(f, lo, hi, limit=200, epsabs=0.0, epsrel=1e-10)[0]
        for lo, hi in ((-80.0, 0.0), (0.0, shift), (shift, shift + 80.0))
    )
    return math.log(total) / (alpha - 1.0)


#: Orders of the grid the exact divergences are integrated at.
CHECK_ORDERS = (2.0, 4.0, 8.0, 16.0)


def _exact_cases() -> list[tuple[float, float, np.ndarray]]:
    """(bound, wrong bound, exact) at CHECK_ORDERS for every pair of a tiny graph, L = 1."""
    graph = _random_graph(7, 0.45, seed=11)
    beta, eta, steps, seed, mode = 0.8, 0.05, 4, 0, Mode.PERSONALIZED
    b = 2.0 * eta  # a small scale, so the divergences are far from zero
    params = ReleaseParameters(mode, beta, steps, eta, b, noisy_steps=1)
    m = params.noise_free_steps
    out = []
    for u, v in _pairs(graph, seed, mode):
        toggled = toggled_graph(graph, u, v)
        (shifts,) = prefix_shifts(
            graph, toggled, [seed], mode=mode, beta=beta, eta=eta, noise_free_steps=m
        )
        _, _, _, _, mean_g, mean_t = _dense_shifts(graph, u, v, seed, mode, beta, eta, m)
        diff = np.abs(mean_g - mean_t) / b
        curve = per_instance_curve(shifts, params)
        for alpha in CHECK_ORDERS:
            i = int(np.flatnonzero(alpha == ORDERS)[0])
            exact = sum(_exact_renyi(float(d), alpha) for d in diff if d > 0)
            # the wrong bound takes the two draws for one Laplace of scale 2b (a pitfall the
            # privacy-spec warns of): sum over coordinates of g(|mu_i - mu'_i| / 2b)
            wrong = float(np.sum(laplace_rdp(alpha, diff / 2.0)))
            out.append((float(curve.rdp[i]), wrong, exact))
    return out


def test_one_noisy_step_bound_is_above_the_exact_divergence() -> None:
    cases = _exact_cases()
    assert len(cases) >= 4 * 10
    assert max(exact for _, _, exact in cases) > 0.05  # the check is not vacuous
    for bound, _, exact in cases:
        assert bound >= exact * (1 - 1e-6) - 1e-9
    # control: the wrong bound is caught below the exact divergence
    assert any(wrong < exact * (1 - 1e-3) for _, wrong, exact in cases)


def _violations(graph: Graph, params: ReleaseParameters, seeds: list[int]) -> list[str]:
    """Pairs whose per-instance curve exceeds the worst case at some order or at infinity."""
    worst = worst_case_curve(params)
    found = []
    for seed in seeds:
        for u, v in _pairs(graph, seed, params.mode):
            toggled = toggled_graph(graph, u, v)
            (shifts,) = prefix_shifts(
                graph, toggled, [seed], mode=params.mode, beta=params.beta, eta=params.eta,
                noise_free_steps=params.noise_free_steps,
            )  # fmt: skip
            curve = per_instance_curve(shifts, params)
            if np.any(curve.rdp > worst.rdp * (1 + 1e-9)) or curve.pure > worst.pure * (1 + 1e-9):
                found.append(f"seed {seed} edge {u}-{v}")
    return found


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize(("steps", "noisy"), [(6, 2), (12, 4), (5, 4)])
def test_per_edge_never_exceeds_the_worst_case(mode: Mode, steps: int, noisy: int) -> None:
    graph = _random_graph(10, 0.3, seed=5)
    eta = 0.03  # large enough that thresholds bind on this graph
    params = ReleaseParameters(mode, 0.8, steps, eta, 3.0 * eta, noisy)
    assert _violations(graph, params, [0, 4]) == []


def test_a_wrong_per_edge_bound_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the paper's distortion constant (4 beta eta) in the per-edge curve only makes
    it exceed the worst case, and the check above reports it."""
    graph = _random_graph(10, 0.3, seed=5)
    eta = 0.03
    params = ReleaseParameters(Mode.PERSONALIZED, 0.8, 12, eta, 3.0 * eta, 8)
    assert _violations(graph, params, [0]) == []
    # the worst case (service.privacy.curves) keeps 2 beta eta; only the per-edge curve changes
    monkeypatch.setattr(per_edge, "distortion", lambda beta: 4.0 * beta)
    assert _violations(graph, params, [0]) != []


def test_the_gain_is_at_most_the_noisy_steps_factor() -> None:
    """rho (1 - beta^(L-1)) / ((1 - beta) b) <= eps_e(inf): nothing after step m + 1 is
    data-dependent, so even an edge with zero prefix shifts keeps this floor (spec B)."""
    params = ReleaseParameters(Mode.PERSONALIZED, 0.8, 100, 1e-7, 8e-6, 10)
    zero = PrefixShifts(0.0, 0.0, np.zeros(0), np.zeros(0))
    floor = 2 * 0.8 * 1e-7 * (1 - 0.8**9) / (0.2 * 8e-6)
    assert per_instance_curve(zero, params).pure == pytest.approx(floor, rel=1e-9)
