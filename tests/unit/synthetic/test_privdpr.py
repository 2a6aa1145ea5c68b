"""PrivDPR's corrected calibration: the sensitivity bound by brute force on tiny graphs, the
noise multiplier against dp_accounting, and controls with the paper's / code's uncorrected
constants that these checks catch (spec-synthetic-graph.md, "Corrections [ours]")."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest

import service.synthetic.privdpr as privdpr
from service.privacy.synthetic import (
    PrivdprPlan,
    calibrate_gaussian_multiplier,
    gaussian_epsilon,
    privdpr_min_depth,
    privdpr_pair_bound,
    privdpr_plan,
    privdpr_quantization,
    privdpr_sensitivity,
)
from service.synthetic.privdpr import (
    Mlp,
    PrivdprParams,
    batch_gradient,
    graph_from_scores,
    normalise,
    pair_loss_grad,
    privdpr_synthesize,
    quantized_sum,
    walk_pairs,
)

GAMMA = 0.85


def _all_graphs(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """CSR (indptr, indices) of every simple undirected graph on n nodes."""
    pairs = list(itertools.combinations(range(n), 2))
    out = []
    for mask in range(1 << len(pairs)):
        nbrs: list[list[int]] = [[] for _ in range(n)]
        for bit, (a, b) in enumerate(pairs):
            if mask >> bit & 1:
                nbrs[a].append(b)
                nbrs[b].append(a)
        indptr = np.cumsum([0] + [len(x) for x in nbrs])
        indices = np.array([j for x in nbrs for j in sorted(x)], dtype=np.int64)
        out.append((indptr, indices))
    return out


def _independent_epsilon(multiplier: float, steps: int, delta: float) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(multiplier), steps)
    return float(accountant.get_epsilon(delta))


# --- the per-pair bound M (Lemma 4.4) ------------------------------------------------------


@pytest.mark.parametrize("n", [3, 5, 8])
def test_pair_bound_holds_over_every_degree_pair_and_output(n: int) -> None:
    """|d loss/d f_i| + |d loss/d f_j| <= M for all degrees in 1..N-1 and f in (0, 1)."""
    bound = privdpr_pair_bound(n, GAMMA)
    f = np.linspace(1e-6, 1 - 1e-6, 41)
    fi, fj = np.meshgrid(f, f)
    worst = 0.0
    for di in range(1, n):
        for dj in range(1, n):
            gi, gj = pair_loss_grad(fi, fj, np.full_like(fi, di), np.full_like(fj, dj), GAMMA, n)
            worst = max(worst, float(np.max(np.abs(gi) + np.abs(gj))))
    assert worst <= bound
    assert worst > bound / 4  # the bound is not vacuous: within a small factor


def test_pair_bound_with_the_data_maximum_degree_is_caught() -> None:
    """Control (spec pitfall "Degree bound"): M computed from the data's maximum degree instead
    of N - 1 fails on a graph whose degrees reach further than the one it was computed on."""
    n = 8
    leaky = privdpr_pair_bound(3, GAMMA)  # as if max degree 2 made "N - 1 = 2"
    gi, gj = pair_loss_grad(
        np.array([1 - 1e-6]), np.array([1e-6]), np.array([1.0]), np.array([n - 1.0]), GAMMA, n
    )
    assert float(np.abs(gi[0]) + np.abs(gj[0])) > leaky


def test_citeseer_example_and_depth_table() -> None:
    """Example 4.5 (M ~ 10,464, L = 7) and the spec's L column (Eq. 13 with B = 512)."""
    assert privdpr_pair_bound(3327, GAMMA) == pytest.approx(10464, rel=1e-3)
    assert privdpr_min_depth(3327, GAMMA, 5, 5, 128, 1) == 7
    for n, steps, depth in [(2708, 845, 9), (3327, 1035, 10), (6301, 1965, 10), (12982, 4055, 11)]:
        assert privdpr_min_depth(n, GAMMA, 8, 5, 512, steps) == depth


def test_depth_is_a_minimum() -> None:
    n, s, s_grad, pairs, steps = 2708, 8.0, 5.0, 512, 845
    m = privdpr_pair_bound(n, GAMMA)
    depth = privdpr_min_depth(n, GAMMA, s, s_grad, pairs, steps)
    assert pairs * m * s ** (-(depth + 1)) <= s_grad / steps
    assert pairs * m * s ** (-depth) > s_grad / steps


# --- exact spectral norm -------------------------------------------------------------------


def _one_power_iteration(weight: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    u = rng.normal(size=weight.shape[0])
    v = weight.T @ u
    v /= np.linalg.norm(v)
    u = weight @ v
    sigma = float(np.linalg.norm(u))
    return weight / (s * sigma)


def test_exact_normalisation_and_power_iteration_control() -> None:
    rng = np.random.default_rng(7)
    s = 8.0
    exceeded = 0
    for _ in range(50):
        weight = rng.normal(size=(16, 16))
        exact = normalise(weight, s)[0]
        assert np.linalg.norm(exact, 2) <= (1.0 / s) * (1 + 1e-12)
        if np.linalg.norm(_one_power_iteration(weight, s, rng), 2) > (1.0 / s) * (1 + 1e-9):
            exceeded += 1
    assert exceeded > 0  # the code's one power iteration underestimates ||W||: caught


# --- the real gradients, brute force on tiny graphs ----------------------------------------


def _model(n: int, r: int, depth: int, rng: np.random.Generator) -> tuple[Mlp, np.ndarray]:
    mlp = Mlp.xavier(rng, [r] + [6] * depth + [1], s=2.0)
    return mlp, rng.normal(0.0, 1.0, (n, r))


def test_batch_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(3)
    n, r = 5, 3
    mlp, emb = _model(n, r, 2, rng)
    indptr, indices = _all_graphs(n)[777]
    pairs = walk_pairs(indptr, indices, np.array([0, 2]), 2, 3, rng)
    degrees = np.diff(indptr)
    grad, _, _ = batch_gradient(mlp, emb, pairs, degrees, GAMMA)

    def loss(e: np.ndarray) -> float:
        f = mlp.forward(e, mlp.normalised())[-1][:, 0]
        i, j = pairs
        a = f[i] / degrees[i]
        c = f[j] / (degrees[j] * GAMMA)
        return float(
            np.sum(
                degrees[j] * GAMMA**2 * (a - c) ** 2
                + (a - c) * 2 * GAMMA * (1 - GAMMA) / n
                + (1 - GAMMA) ** 2 / (degrees[j] * n * n)
            )
        )

    numeric = np.zeros_like(emb)
    for idx in np.ndindex(*emb.shape):
        step = np.zeros_like(emb)
        step[idx] = 1e-6
        numeric[idx] = (loss(emb + step) - loss(emb - step)) / 2e-6
    assert np.allclose(grad, numeric, atol=1e-7)


def _sensitivity_ratio(
    n: int, seed: int, quantized: list[np.ndarray] | None = None
) -> tuple[float, float]:
    """Largest per-pair gradient norm over M prod||Wt||, and largest batch-sum difference
    between any two graphs on n nodes over 2 B_max M prod||Wt|| (with ``quantized``: each
    batch sum as the release quantizes it, appended)."""
    rng = np.random.default_rng(seed)
    mlp, emb = _model(n, 4, 2, rng)
    norm_product = math.prod(float(np.linalg.norm(w[0], 2)) for w in mlp.normalised())
    g_pair = privdpr_pair_bound(n, GAMMA) * norm_product
    starts, walks, length = np.array([0, 1]), 2, 3
    max_pairs = starts.size * walks * length
    delta2 = privdpr_sensitivity(n, GAMMA, norm_product, max_pairs)
    sums = []
    worst_pair = 0.0
    for indptr, indices in _all_graphs(n):
        walk_rng = np.random.default_rng(seed + 1)  # same walk randomness on every graph
        pairs = walk_pairs(indptr, indices, starts, walks, length, walk_rng)
        degrees = np.diff(indptr)
        for i, j in zip(*pairs, strict=True):
            single, _, _ = batch_gradient(mlp, emb, (np.array([i]), np.array([j])), degrees, GAMMA)
            worst_pair = max(worst_pair, float(np.linalg.norm(single)) / g_pair)
        sums.append(batch_gradient(mlp, emb, pairs, degrees, GAMMA)[0].ravel())
    stacked = np.array(sums)
    if quantized is not None:  # each batch sum as the release quantizes it (z = 1)
        quantum, radius_squared = privdpr_quantization(delta2 / 2.0, stacked.shape[1], 1.0)
        plan = _plan_with(quantum, radius_squared)
        quantized.extend(quantized_sum(row, plan) for row in stacked)
    worst_diff = (
        max(float(np.max(np.linalg.norm(stacked - row, axis=1))) for row in stacked) / delta2
    )
    return worst_pair, worst_diff


def _plan_with(quantum: float, radius_squared: int) -> PrivdprPlan:
    return PrivdprPlan(
        nodes=1, steps=1, depth=0, max_pairs=1, sensitivity=1.0, multiplier=1.0, noise_std=1.0,
        epsilon=1.0, delta=1e-5, coordinates=1, quantum=quantum,
        radius_squared=radius_squared, noise_m=1, noise_tau=0,
    )  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sensitivity_bound_by_brute_force_over_all_graphs_on_four_nodes(seed: int) -> None:
    quantized: list[np.ndarray] = []
    worst_pair, worst_diff = _sensitivity_ratio(4, seed, quantized)
    assert 0.0 < worst_pair <= 1.0
    assert 0.0 < worst_diff <= 1.0
    # the release's integer sums: within the ball by the rounding bound (never projected:
    # a projected sum would be 0), so within Delta_int = 2 sqrt(R2) of each other
    d = quantized[0].size
    _, radius_squared = privdpr_quantization(1.0, d, 1.0)
    ceil_root = math.isqrt(d - 1) + 1
    assert radius_squared == math.floor((Fraction(2**51) + Fraction(ceil_root, 2)) ** 2)
    stacked = np.array(quantized)
    nonzero = np.any(stacked != 0, axis=1)
    assert nonzero.sum() > len(quantized) // 2  # the rounding keeps the sums' signal
    assert all(int(np.dot(q, q)) <= radius_squared for q in stacked.astype(object))
    widest = max(float(np.max(np.linalg.norm(stacked - row, axis=1))) for row in stacked)
    assert 0.0 < widest <= 2.0 * math.sqrt(radius_squared)


def test_a_quantized_sum_outside_its_ball_is_never_released() -> None:
    """The ball is the proof's, not the bound's: a sum past it (which the bound excludes) is
    replaced by 0, so every released integer sum is within sqrt(R2)."""
    plan = _plan_with(1.0, 100)  # radius 10
    inside = np.array([6.2, -7.9, 0.4])  # rounds to (6, -8, 0): norm 10
    assert quantized_sum(inside, plan).tolist() == [6, -8, 0]
    for outside in ([6.2, -8.2, 0.6], [11.0, 0.0, 0.0], [np.nan, 0.0, 0.0], [np.inf, 0, 0]):
        assert quantized_sum(np.array(outside), plan).tolist() == [0, 0, 0]


def test_the_discrete_gaussian_is_calibrated_to_the_quantized_sensitivity() -> None:
    """sigma^2 = m 2^tau >= (z Delta_int)^2 exactly, so each step is alpha / (2 z^2)-RDP and the
    run's curve is the continuous calibration's; the noise in the gradient's units is that of
    the continuous Gaussian within 0.1%."""
    plan = privdpr_plan(nodes=2708, epsilon=1.0, delta=1e-5, gamma=GAMMA, s=8.0, s_grad=5.0,
                        start_nodes=16, walks=2, walk_length=16, epochs=5,
                        embedding_dim=128)  # fmt: skip
    variance = Fraction(plan.noise_m) * 2**plan.noise_tau
    assert variance >= Fraction(plan.multiplier) ** 2 * 4 * plan.radius_squared
    assert plan.coordinates == 2708 * 128
    assert plan.quantum * plan.integer_sensitivity == pytest.approx(plan.sensitivity, rel=1e-8)
    ratio = plan.noise_std / (plan.multiplier * plan.sensitivity)
    assert 1.0 <= ratio < 1.0 + 1e-8  # the continuous calibration's noise, to 1e-8
    assert 2**51 < plan.noise_std / plan.quantum < 2**53  # the noise resolved to 52 bits
    assert plan.curve == gaussian_curve_of(plan)


def gaussian_curve_of(plan: PrivdprPlan) -> object:
    from service.privacy.synthetic import gaussian_curve

    return gaussian_curve(plan.multiplier, plan.steps)


def test_uncorrected_sensitivity_is_caught_by_the_worst_case() -> None:
    """Control for the factor 2 and B = b: the uniform bound's worst case is two batches whose
    B_max per-pair gradients of norm G_pair point in opposite directions; the paper's Delta
    (B G_pair with B = the b start nodes, no factor 2) is below that distance."""
    n, b, walks, length = 2708, 16, 2, 16
    g_pair = privdpr_pair_bound(n, GAMMA) * 8.0 ** (-10)
    max_pairs = b * walks * length
    direction = np.ones(4) / 2.0
    one = max_pairs * g_pair * direction
    other = -one
    distance = float(np.linalg.norm(one - other))
    corrected = privdpr_sensitivity(n, GAMMA, 8.0 ** (-10), max_pairs)
    assert distance <= corrected * (1 + 1e-12)
    for uncorrected in (max_pairs * g_pair, b * g_pair, 2 * b * g_pair):
        assert distance > uncorrected


# --- calibration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epsilon", "delta", "steps"), [(0.1, 1e-5, 845), (1.0, 1e-5, 845), (3.2, 1e-5, 169)]
)
def test_multiplier_against_dp_accounting(epsilon: float, delta: float, steps: int) -> None:
    z = calibrate_gaussian_multiplier(epsilon, delta, steps)
    assert gaussian_epsilon(z, steps, delta) <= epsilon
    assert _independent_epsilon(z, steps, delta) <= epsilon * 1.01
    assert _independent_epsilon(z * 0.97, steps, delta) > epsilon * 0.99  # not over-noised


def test_uncorrected_calibration_is_caught() -> None:
    """Noise calibrated to the paper's Delta (no factor 2) certifies far more than the target
    when the real Delta_2 is used; the corrected std certifies the target."""
    plan = privdpr_plan(nodes=2708, epsilon=1.0, delta=1e-5, gamma=GAMMA, s=8.0, s_grad=5.0,
                        start_nodes=16, walks=2, walk_length=16, epochs=5,
                        embedding_dim=128)  # fmt: skip
    assert _independent_epsilon(plan.noise_std / plan.sensitivity, plan.steps, 1e-5) <= 1.01
    uncorrected_std = plan.multiplier * plan.sensitivity / 2.0
    achieved = _independent_epsilon(uncorrected_std / plan.sensitivity, plan.steps, 1e-5)
    assert achieved > 1.5


def _paper_noise_std(epsilon: float, delta: float, steps: int, s_grad: float) -> float:
    """The paper's own per-step std (Eq. 7, 13, Sec. 4.3.2): S_grad sqrt(2 ln(1.25 T/delta)) /
    (eps/T), each step at (eps/T, delta/T). A reference for comparison, never used to
    calibrate."""
    return s_grad * math.sqrt(2.0 * math.log(1.25 * steps / delta)) / (epsilon / steps)


def test_paper_calibration_differs_from_the_code_by_t() -> None:
    steps = 845
    paper = _paper_noise_std(1.0, 1e-5, steps, 5.0)
    code = 5.0 * math.sqrt(2.0 * math.log(1.25 * steps / 1e-5)) / 1.0
    assert paper / code == pytest.approx(steps)


# --- the run -------------------------------------------------------------------------------


def test_noise_on_every_row_and_output_is_a_simple_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 20
    # a 20-node ring
    nbrs = [[(i - 1) % n, (i + 1) % n] for i in range(n)]
    indptr = np.cumsum([0] + [2] * n)
    indices = np.array([j for x in nbrs for j in sorted(x)])
    params = PrivdprParams(embedding_dim=8, hidden_dim=4, start_nodes=4, walks=1,
                           walk_length=3, epochs=2, score_rounds=2)  # fmt: skip
    drawn: list[tuple[int, int, int]] = []
    real = privdpr.discrete_gaussian

    def recording(rng: np.random.Generator, m: int, tau: int, count: int) -> np.ndarray:
        drawn.append((m, tau, count))
        return real(rng, m, tau, count)

    monkeypatch.setattr(privdpr, "discrete_gaussian", recording)
    u, v, plan = privdpr_synthesize(indptr, indices, 1.0, params, np.random.default_rng(5))
    assert drawn == [(plan.noise_m, plan.noise_tau, n * params.embedding_dim)] * plan.steps
    assert np.all(u < v) and np.all(v < n)
    assert len(set(zip(u.tolist(), v.tolist(), strict=True))) == u.size


def test_edge_target_comes_from_the_scores_only() -> None:
    import scipy.sparse as sp

    rng = np.random.default_rng(1)
    n = 30
    rows = np.tile(np.arange(n), 3)
    cols = rng.integers(0, n, rows.size)
    scores = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    sym = scores.maximum(scores.T).toarray()
    np.fill_diagonal(sym, 0)
    u, v = graph_from_scores(scores, rng)
    assert u.size == int(np.count_nonzero(np.triu(sym, 1)))
    assert np.all(sym[u, v] > 0)
