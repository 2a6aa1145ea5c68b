"""Brute force: the sensitivities behind DP-IE (PushFlowCap, then InstantEmbedding).

PushFlowCap (Theorem 4.3): on EVERY graph with at most 5 nodes, for every seed and every pair
{a, b} the mode protects (`edge`: any pair; `personalized`: pairs not touching the seed), the
edge toggled (added when absent, removed when present - which covers endpoints of degree 0 and
1, counted below), ||p(G) - p(G')||_1 <= sigma with the paper's T = sigma / (2 (2 - alpha)).
The graphs run as one batch through a dense copy of Algorithm 2 that is checked, to the bit,
against :func:`service.mechanisms.pushflowcap.pushflowcap` on sampled graphs. The control with
thresholds 2x too large (and sigma large enough for the caps to bind everywhere) exceeds sigma,
so the search can fail.

PushFlowCap with a floor (the service's DP-IE; docs/privacy.md): the same search over the
recursion h = min(max(e_s + P h - tau, 0), c) for several floors tau, the same bound sigma; at
tau 0 the recursion is Algorithm 2 (checked on every 5-node graph), and the batch copy agrees
with the service's kernel. The control, thresholds too large with the floor, exceeds sigma, so
this search can fail too.

InstantEmbedding (Theorem 5.1): for every pair (p, p') the search above produced, and for every
hash function into k = 2 buckets (all 2^n bucket maps times 2^n sign maps), ||w - w'||_1 <=
m ln(1 + n ||p - p'||_1 / m) <= n ||p - p'||_1; and on vectors at the ln(n p) = 0 edge the
bound is reached, so the control with log2 (a 1.44x larger embedding) is caught.
"""

from __future__ import annotations

import itertools
import math
from functools import cache

import numpy as np
import pytest

from service.embeddings.dp import EMBEDDING_BETA
from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.instant import instant_embedding, log_mass, theorem_5_1_bound
from service.mechanisms.floored_pushflowcap import (
    floored_pushflowcap,
    pushflowcap_with_floor,
)
from service.mechanisms.pushflowcap import edge_threshold, pushflowcap
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges

P, E = Mode.PERSONALIZED, Mode.EDGE
ROUNDS = 40
SETTINGS = [(EMBEDDING_BETA, 0.01), (0.8, 0.05), (0.5, 0.05), (0.2, 0.01)]  # caps bind


def all_graphs(n: int) -> np.ndarray:
    """Adjacency matrices (float64) of every simple graph on n nodes: (2^(n(n-1)/2), n, n)."""
    pairs = list(itertools.combinations(range(n), 2))
    masks = np.arange(1 << len(pairs))
    adjacency = np.zeros((masks.shape[0], n, n), dtype=np.float64)
    for bit, (u, v) in enumerate(pairs):
        present = (masks >> bit) & 1
        adjacency[:, u, v] = present
        adjacency[:, v, u] = present
    return adjacency


def batch_node_arrays(
    adjacency: np.ndarray, seed: int, threshold: float, mode: Mode
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(caps d T, with T_s = infinity in joint mode; 1 / d, 0 where d = 0; [d = 0]) of each
    graph of the batch, as the service computes them."""
    degrees = adjacency.sum(axis=2)
    cap = degrees * threshold
    if mode is P:
        cap[:, seed] = math.inf
    inv_degree = np.divide(1.0, degrees, out=np.zeros_like(degrees), where=degrees > 0)
    keeps = (degrees == 0).astype(np.float64)
    return cap, inv_degree, keeps


def batch_pushflowcap(
    adjacency: np.ndarray, seed: int, beta: float, rounds: int, threshold: float, mode: Mode
) -> np.ndarray:
    """Algorithm 2 on a batch of dense graphs, with the same operations in the same order as
    the service's vectorised kernel (so the results agree to the bit)."""
    alpha = 1.0 - beta
    lazy = (1.0 - alpha) / 2.0
    cap, inv_degree, keeps = batch_node_arrays(adjacency, seed, threshold, mode)
    residual = np.zeros_like(cap)
    residual[:, seed] = 1.0
    pushed = np.zeros_like(cap)
    for _ in range(rounds):
        flow = np.minimum(residual, np.maximum(cap - pushed, 0.0))
        pushed += flow
        residual -= flow
        spread = np.einsum("gij,gj->gi", adjacency, flow * inv_degree)
        residual += lazy * (flow * (1.0 + keeps) + spread)
    out: np.ndarray = alpha * pushed
    return out


def batch_floored(
    adjacency: np.ndarray,
    seed: int,
    beta: float,
    rounds: int,
    threshold: float,
    mode: Mode,
    tau: float,
) -> np.ndarray:
    """PushFlowCap with a floor on a batch of dense graphs, as the recursion on cumulative
    inflows: h = min(max(e_s + P h - tau, 0), c), R times; p = alpha h."""
    alpha = 1.0 - beta
    lazy = (1.0 - alpha) / 2.0
    cap, inv_degree, keeps = batch_node_arrays(adjacency, seed, threshold, mode)
    start = np.zeros_like(cap)
    start[:, seed] = 1.0
    pushed = np.zeros_like(cap)
    for _ in range(rounds):
        spread = np.einsum("gij,gj->gi", adjacency, pushed * inv_degree)
        inflow = start + lazy * (pushed * (1.0 + keeps) + spread)
        pushed = np.minimum(np.maximum(inflow - tau, 0.0), cap)
    out: np.ndarray = alpha * pushed
    return out


def protected_pairs(n: int, seed: int, mode: Mode) -> list[tuple[int, int]]:
    return [
        (a, b) for a, b in itertools.combinations(range(n), 2) if mode is E or seed not in (a, b)
    ]


@cache
def search(
    n: int,
    beta: float,
    sigma: float,
    mode: Mode,
    factor: float = 1.0,
    tau: float | None = None,
) -> dict[str, float]:
    """Worst ||p - p'||_1 / sigma over every graph on n nodes, seed and protected toggle, with
    thresholds ``factor`` times the paper's (and the floor ``tau``, if given); and how many
    toggles of each kind were seen."""
    adjacency = all_graphs(n)
    threshold = factor * edge_threshold(beta, sigma)
    found = {"ratio": 0.0, "added": 0, "removed": 0, "degree 0": 0, "degree 1": 0}
    degrees = adjacency.sum(axis=2)

    def run(graphs: np.ndarray, seed: int) -> np.ndarray:
        if tau is None:
            return batch_pushflowcap(graphs, seed, beta, ROUNDS, threshold, mode)
        return batch_floored(graphs, seed, beta, ROUNDS, threshold, mode, tau)

    for seed in range(n):
        base = run(adjacency, seed)
        for a, b in protected_pairs(n, seed, mode):
            toggled = adjacency.copy()
            toggled[:, a, b] = toggled[:, b, a] = 1.0 - adjacency[:, a, b]
            other = run(toggled, seed)
            ratio = np.abs(base - other).sum(axis=1) / sigma
            found["ratio"] = max(found["ratio"], float(ratio.max()))
            present = adjacency[:, a, b] == 1
            found["removed"] += int(present.sum())
            found["added"] += int((~present).sum())
            low = np.minimum(degrees[:, a], degrees[:, b])
            found["degree 0"] += int((low == 0).sum())
            found["degree 1"] += int((low == 1).sum())
    return found


@pytest.mark.parametrize("mode", [P, E])
def test_batch_copy_matches_service_pushflowcap(mode: Mode) -> None:
    adjacency = all_graphs(5)
    rng = np.random.default_rng(7)
    for beta, sigma in SETTINGS:
        threshold = edge_threshold(beta, sigma)
        for seed in range(5):
            batch = batch_pushflowcap(adjacency, seed, beta, ROUNDS, threshold, mode)
            for index in rng.choice(adjacency.shape[0], 12, replace=False):
                edges = {
                    (u, v) for u, v in itertools.combinations(range(5), 2) if adjacency[index, u, v]
                }
                ours = pushflowcap(graph_from_edges(edges, 5), seed, beta, ROUNDS, sigma, mode)
                np.testing.assert_allclose(batch[index], ours, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("mode", [P, E])
@pytest.mark.parametrize(("beta", "sigma"), SETTINGS)
def test_pushflowcap_sensitivity_on_every_small_graph(
    mode: Mode, beta: float, sigma: float
) -> None:
    for n in (2, 3, 4, 5):
        found = search(n, beta, sigma, mode)
        assert found["ratio"] <= 1.0 + 1e-9, (n, found)
    # the search covered adding and removing, and endpoints of degree 0 and 1
    assert min(found["added"], found["removed"], found["degree 0"], found["degree 1"]) > 0
    assert found["ratio"] > 0.08  # and the caps mattered (worst found: 0.08 to 0.67)


@pytest.mark.parametrize(("mode", "factor"), [(P, 2.0), (E, 3.0)])
def test_sensitivity_search_catches_thresholds_too_large(mode: Mode, factor: float) -> None:
    """Control: thresholds too large (2x, i.e. sigma / (2 - alpha), in joint mode; 3x in edge
    mode, whose worst case at n = 5 is 0.37 sigma) break the bound on some 5-node graph."""
    assert search(5, 0.2, 0.01, mode)["ratio"] <= 1.0 + 1e-9
    assert search(5, 0.2, 0.01, mode, factor)["ratio"] > 1.1


FLOORS = (0.02, 0.1, 0.4)  # tau, in units of the flow the seed starts with


def test_floored_recursion_at_floor_zero_is_algorithm_2() -> None:
    """The cumulative form h = min(e_s + P h, c) (Lemma 4.2) is Algorithm 2's rounds: on every
    5-node graph, both modes, every setting."""
    adjacency = all_graphs(5)
    for mode in (P, E):
        for beta, sigma in SETTINGS:
            threshold = edge_threshold(beta, sigma)
            for seed in (0, 3):
                rounds = batch_pushflowcap(adjacency, seed, beta, ROUNDS, threshold, mode)
                recursion = batch_floored(adjacency, seed, beta, ROUNDS, threshold, mode, 0.0)
                np.testing.assert_allclose(recursion, rounds, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("mode", [P, E])
def test_batch_floored_matches_service_kernel(mode: Mode) -> None:
    adjacency = all_graphs(5)
    rng = np.random.default_rng(9)
    for beta, sigma in SETTINGS:
        threshold = edge_threshold(beta, sigma)
        for tau in FLOORS:
            floor = tau * (1.0 - beta) * 5  # tau = floor / (alpha n)
            for seed in (0, 2, 4):
                batch = batch_floored(adjacency, seed, beta, ROUNDS, threshold, mode, tau)
                for index in rng.choice(adjacency.shape[0], 8, replace=False):
                    edges = {
                        (u, v)
                        for u, v in itertools.combinations(range(5), 2)
                        if adjacency[index, u, v]
                    }
                    graph = graph_from_edges(edges, 5)
                    ours = floored_pushflowcap(graph, seed, beta, ROUNDS, sigma, mode, floor)
                    np.testing.assert_allclose(batch[index], ours, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("mode", [P, E])
@pytest.mark.parametrize(("beta", "sigma"), SETTINGS)
def test_floored_sensitivity_on_every_small_graph(mode: Mode, beta: float, sigma: float) -> None:
    adjacency = all_graphs(5)
    threshold = edge_threshold(beta, sigma)
    worst = 0.0
    for tau in FLOORS:
        for n in (2, 3, 4, 5):
            found = search(n, beta, sigma, mode, tau=tau)
            assert found["ratio"] <= 1.0 + 1e-9, (n, tau, found)
            worst = max(worst, found["ratio"])
        # the floor mattered: it changes the output of some graph
        plain = batch_pushflowcap(adjacency, 0, beta, ROUNDS, threshold, mode)
        floored = batch_floored(adjacency, 0, beta, ROUNDS, threshold, mode, tau)
        assert np.abs(plain - floored).sum(axis=1).max() > 1e-3
    assert worst > 0.01, worst  # and the toggles moved the output (a high floor may stop all)


@pytest.mark.parametrize(("mode", "factor"), [(P, 2.0), (E, 4.0)])
def test_floored_search_catches_thresholds_too_large(mode: Mode, factor: float) -> None:
    """Control: with the floor, thresholds too large (2x in joint mode, 4x in edge mode) break
    the bound on some 5-node graph: the floor does not hide a sensitivity the search should
    see."""
    assert search(5, 0.2, 0.01, mode, tau=0.02)["ratio"] <= 1.0 + 1e-9
    assert search(5, 0.2, 0.01, mode, factor, tau=0.02)["ratio"] > 1.1


def pfc_pairs(limit: int = 400) -> list[tuple[np.ndarray, np.ndarray]]:
    """(p, p') pairs on 5 nodes from toggles: the ones the embedding actually sees."""
    adjacency = all_graphs(5)
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    rng = np.random.default_rng(11)
    for beta, sigma in SETTINGS:
        threshold = edge_threshold(beta, sigma)
        base = batch_pushflowcap(adjacency, 0, beta, ROUNDS, threshold, P)
        for a, b in protected_pairs(5, 0, P):
            toggled = adjacency.copy()
            toggled[:, a, b] = toggled[:, b, a] = 1.0 - adjacency[:, a, b]
            other = batch_pushflowcap(toggled, 0, beta, ROUNDS, threshold, P)
            diff = np.abs(base - other).sum(axis=1)
            # the largest moves and a random sample of the rest
            picks = np.concatenate([np.argsort(-diff)[:8], rng.choice(diff.shape[0], 4)])
            pairs.extend((base[i], other[i]) for i in picks)
    return pairs[:limit]


def all_hashes(n: int, k: int) -> list[EmbeddingHashes]:
    out = []
    for buckets in itertools.product(range(k), repeat=n):
        for signs in itertools.product((1.0, -1.0), repeat=n):
            out.append(EmbeddingHashes(b"x", k, np.array(buckets), np.array(signs)))
    return out


def worst_theorem_5_1(pairs: list[tuple[np.ndarray, np.ndarray]], log=np.log) -> float:
    """max over pairs and all k = 2 hash functions of ||w - w'||_1 / (Theorem 5.1's bound)."""
    n = pairs[0][0].shape[0]
    hashes = all_hashes(n, 2)
    # w = H^T z for every hash function at once: H stacked as (functions, n, k)
    H = np.zeros((len(hashes), n, 2))
    for index, h in enumerate(hashes):
        H[index, np.arange(n), h.buckets] = h.signs
    worst = 0.0
    for p, q in pairs:
        zp = np.where(p * n > 1, log(np.maximum(p * n, 1.0)), 0.0)
        zq = np.where(q * n > 1, log(np.maximum(q * n, 1.0)), 0.0)
        moved = np.abs(np.einsum("hik,i->hk", H, zp - zq)).sum(axis=1).max()
        bound = theorem_5_1_bound(p, q)
        assert bound <= n * float(np.abs(p - q).sum()) + 1e-12
        if bound > 0:
            worst = max(worst, float(moved) / bound)
        else:
            assert moved == 0
    return worst


def edge_pairs(n: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """Vectors at ln(n p) = 0: p_v = 1/n against p_v = 1/n + d on one or several coordinates
    (the bound m ln(1 + n d m / m) is reached when every moved coordinate starts at 1/n)."""
    out = []
    for m in (1, 2, 3):
        for d in (1e-3, 0.05, 0.5):
            p = np.zeros(n)
            p[:m] = 1.0 / n
            q = p.copy()
            q[:m] += d
            out.append((p, q))
    return out


def test_instant_embedding_matches_theorem_5_1_bound() -> None:
    pairs = pfc_pairs() + edge_pairs()
    assert worst_theorem_5_1(pairs) <= 1.0 + 1e-9
    # and the service's instant_embedding is the w checked above
    p, q = pairs[0]
    h = EmbeddingHashes(b"x", 2, np.array([0, 1, 0, 1, 1]), np.array([1.0, -1, -1, 1, 1]))
    z = log_mass(p)
    expected = np.array([z[0] - z[2], -z[1] + z[3] + z[4]])
    np.testing.assert_allclose(instant_embedding(p, h), expected, rtol=1e-12)
    assert np.abs(instant_embedding(p, h) - instant_embedding(q, h)).sum() <= (
        theorem_5_1_bound(p, q) + 1e-12
    )


def test_theorem_5_1_search_catches_log2() -> None:
    """Control: with log2 the embedding moves 1.44x further than the bound allows."""
    assert worst_theorem_5_1(edge_pairs(), log=np.log2) > 1.4
    assert worst_theorem_5_1(edge_pairs()) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("mode", [P, E])
def test_dp_ie_sensitivity_sigma_n_end_to_end(mode: Mode) -> None:
    """The whole pre-noise pipeline through the service's own functions: ||w - w'||_1 <= sigma n
    for every protected toggle of a few 5-node graphs and every k = 2 hash function."""
    beta, sigma, n = 0.2, 0.2, 5
    largest = 0.0
    hashes = all_hashes(n, 2)[::7]
    rng = np.random.default_rng(3)
    adjacency = all_graphs(n)
    for index in rng.choice(adjacency.shape[0], 6, replace=False):
        edges = {(u, v) for u, v in itertools.combinations(range(n), 2) if adjacency[index, u, v]}
        for seed in range(n):
            p = pushflowcap(graph_from_edges(edges, n), seed, beta, ROUNDS, sigma, mode)
            for pair in protected_pairs(n, seed, mode):
                graph = graph_from_edges(edges ^ {pair}, n)
                q = pushflowcap(graph, seed, beta, ROUNDS, sigma, mode)
                for h in hashes:
                    moved = np.abs(instant_embedding(p, h) - instant_embedding(q, h)).sum()
                    assert moved <= sigma * n + 1e-9
                    largest = max(largest, moved)
    assert largest > 1e-3  # the embeddings did move (the bound sigma n = 1 is far from tight)


def snapped(w: np.ndarray, h: float) -> np.ndarray:
    out: np.ndarray = np.round(w / h) * h
    return out


def test_snapping_adds_at_most_k_h_and_that_much_is_reached() -> None:
    """||round_h(w) - round_h(w')||_1 <= ||w - w'||_1 + k h (each coordinate of either rounding
    moves by at most h / 2), and an adversarial pair comes within any margin of it: so DP-IE
    calibrates on sigma n + MAX_K h (``dp_ie_sensitivity``, with the float64 margins), not on
    sigma n alone."""
    from service.embeddings.dp import MAX_K, SENSITIVITY_SLACK, dp_ie_sensitivity, snap_grid
    from service.embeddings.instant import instant_embedding_rounding_margin
    from service.mechanisms.pushflowcap_rounding import pushflowcap_rounding_margin

    rng = np.random.default_rng(8)
    k, h = 16, 2.0**-6
    for _ in range(2000):
        w = rng.normal(0, 1, k)
        w2 = w + rng.laplace(0, 0.05, k)
        assert np.abs(snapped(w, h) - snapped(w2, h)).sum() <= np.abs(w - w2).sum() + k * h
    # adversarial: every coordinate a hair either side of a rounding boundary
    tiny = 2.0**-30
    w = np.full(k, h / 2 - tiny)
    w2 = np.full(k, h / 2 + tiny)
    moved = np.abs(snapped(w, h) - snapped(w2, h)).sum()
    assert moved == k * h > np.abs(w - w2).sum() + (k - 1) * h  # the slack is needed, all of it
    # the service's h and the sensitivity it calibrates on
    sigma, n = 1e-3, 1005
    h = snap_grid(sigma, n)
    assert h <= sigma * n / 2**22 < 2 * h
    e_p = pushflowcap_rounding_margin(n, 100, EMBEDDING_BETA, 10_000)
    e_w = instant_embedding_rounding_margin(n)
    delta = dp_ie_sensitivity(sigma, n, rounds=100, degree_bound=10_000)
    assert delta == (n * (sigma + 2 * e_p) + 2 * e_w + MAX_K * h) * (1 + SENSITIVITY_SLACK)
    assert sigma * n + MAX_K * h < delta <= sigma * n * (1 + 2.0**-10 + 3e-6)


@pytest.mark.parametrize("floor", [0.0, 0.25])
@pytest.mark.parametrize("mode", [P, E])
def test_dp_ie_snapped_sensitivity_end_to_end(mode: Mode, floor: float) -> None:
    """The snapped pre-noise vector round_h(w), h = snap_grid(sigma, n), through the service's
    own functions (PushFlowCap with the floor, 0 being Algorithm 2): within
    dp_ie_sensitivity(sigma, n, ...) (degree bound 4: any 5-node graph) for every protected
    toggle of a few 5-node graphs and every k = 2 hash function."""
    from service.embeddings.dp import dp_ie_sensitivity, snap_grid

    beta, sigma, n = 0.2, 0.2, 5
    h = snap_grid(sigma, n)
    bound = dp_ie_sensitivity(sigma, n, rounds=ROUNDS, degree_bound=n - 1, beta=beta)
    hashes = all_hashes(n, 2)[::7]
    rng = np.random.default_rng(4)
    adjacency = all_graphs(n)
    largest = 0.0
    for index in rng.choice(adjacency.shape[0], 4, replace=False):
        edges = {(u, v) for u, v in itertools.combinations(range(n), 2) if adjacency[index, u, v]}
        for seed in range(n):
            p = pushflowcap_with_floor(
                graph_from_edges(edges, n), seed, beta, ROUNDS, sigma, mode, floor
            )
            for pair in protected_pairs(n, seed, mode):
                q = pushflowcap_with_floor(
                    graph_from_edges(edges ^ {pair}, n), seed, beta, ROUNDS, sigma, mode, floor
                )
                for hf in hashes:
                    a = snapped(instant_embedding(p, hf), h)
                    b = snapped(instant_embedding(q, hf), h)
                    moved = float(np.abs(a - b).sum())
                    assert moved <= bound
                    largest = max(largest, moved)
    assert largest > 1e-3
