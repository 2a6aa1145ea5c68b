"""Brute force: the sensitivities behind ``popular``, ``common_neighbours``,
``friends_of_friends`` and ``blended``.

Every graph on 5 nodes (all 1,024 of them), every seed, every pair {a, b} not touching the seed
(the personalized model leaves the seed's own edges unprotected), the edge toggled (added when
absent, removed when present; this covers endpoints of degree 0 and 1): the common-neighbour
counts move by at most 2 in l1 and the degrees by exactly 2. Random graphs on 6-10 nodes
likewise. The worst cases reach the bounds, so smaller constants would be wrong.

The two-scale release (Lap(2/eps) on the seed's friends, Lap(1/eps) on the other nodes but the
seed): the same search computes the pure-DP loss sum_i |Delta_i| / b_i of every toggle, which
never exceeds eps and reaches it; every toggle moves two friend counts by 1, or one candidate
count by 1, or nothing. Controls with a wrong scale on either part exceed eps, so the search
can fail. ``pytest -s`` prints the worst cases.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from service.mechanisms.blended import MAX_COUNT_WEIGHT, blend, blended_ranking
from service.mechanisms.common_neighbours import common_neighbour_counts
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    plan_laplace,
    plan_two_scale,
)
from tests.graph_helpers import graph_from_edges, random_graph


def _all_graphs(n: int) -> np.ndarray:
    """Adjacency matrices of every simple graph on n nodes, shape (2^(n(n-1)/2), n, n)."""
    pairs = list(itertools.combinations(range(n), 2))
    masks = np.arange(1 << len(pairs))
    adjacency = np.zeros((masks.shape[0], n, n), dtype=np.int64)
    for bit, (u, v) in enumerate(pairs):
        present = (masks >> bit) & 1
        adjacency[:, u, v] = present
        adjacency[:, v, u] = present
    return adjacency


def _worst_changes(adjacency: np.ndarray) -> tuple[int, int, dict[str, int]]:
    """Largest l1 change of the seed's common-neighbour counts and of the degrees over every
    seed and every protected pair of every graph in ``adjacency`` (a batch); and how many
    toggles had an endpoint of degree 0 and of degree 1 before the toggle."""
    n = adjacency.shape[1]
    worst_counts = worst_degrees = 0
    seen = {"degree 0": 0, "degree 1": 0, "added": 0, "removed": 0}
    for seed in range(n):
        counts = adjacency @ adjacency[:, seed, :, None]  # (graphs, n, 1): |N(v) & N(seed)|
        for a, b in itertools.combinations([v for v in range(n) if v != seed], 2):
            toggled = adjacency.copy()
            toggled[:, a, b] = toggled[:, b, a] = 1 - adjacency[:, a, b]
            new_counts = toggled @ toggled[:, seed, :, None]
            change = np.abs(new_counts - counts).sum(axis=(1, 2))
            worst_counts = max(worst_counts, int(change.max()))
            degree_change = np.abs(toggled.sum(axis=2) - adjacency.sum(axis=2)).sum(axis=1)
            worst_degrees = max(worst_degrees, int(degree_change.max()))
            assert np.all(degree_change == 2)
            ends = np.minimum(adjacency[:, a].sum(axis=1), adjacency[:, b].sum(axis=1))
            seen["degree 0"] += int((ends == 0).sum())
            seen["degree 1"] += int((ends == 1).sum())
            seen["added"] += int((adjacency[:, a, b] == 0).sum())
            seen["removed"] += int((adjacency[:, a, b] == 1).sum())
    return worst_counts, worst_degrees, seen


def test_every_graph_on_five_nodes() -> None:
    worst_counts, worst_degrees, seen = _worst_changes(_all_graphs(5))
    assert worst_counts <= COMMON_NEIGHBOUR_SENSITIVITY
    assert worst_degrees <= DEGREE_SENSITIVITY
    assert worst_counts == COMMON_NEIGHBOUR_SENSITIVITY  # attained: both ends are friends of s
    assert all(count > 0 for count in seen.values()), seen


def test_random_graphs_on_six_to_ten_nodes() -> None:
    rng = np.random.default_rng(12)
    attained = 0
    for _ in range(60):
        n = int(rng.integers(6, 11))
        graph = random_graph(n, float(rng.uniform(0.1, 0.8)), rng)
        adjacency = graph.adjacency.toarray().astype(np.int64)[None]
        worst_counts, worst_degrees, _ = _worst_changes(adjacency)
        assert worst_counts <= COMMON_NEIGHBOUR_SENSITIVITY
        assert worst_degrees <= DEGREE_SENSITIVITY
        attained = max(attained, worst_counts)
    assert attained == COMMON_NEIGHBOUR_SENSITIVITY


def test_the_library_counts_agree_with_the_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        graph = random_graph(9, 0.4, rng)
        dense = graph.adjacency.toarray()
        for seed in range(graph.n):
            np.testing.assert_array_equal(common_neighbour_counts(graph, seed), dense @ dense[seed])


def test_edge_mode_is_unbounded() -> None:
    """Why common neighbours are refused in edge mode: the seed's edge {s, a} moves c on all
    of N(a), so the change grows with a's degree."""
    star = [(1, v) for v in range(2, 12)]  # node 1 has ten friends; the seed 0 none
    without = graph_from_edges(star, 12)
    with_edge = graph_from_edges([*star, (0, 1)], 12)
    change = np.abs(common_neighbour_counts(with_edge, 0) - common_neighbour_counts(without, 0))
    assert change.sum() >= 10 > COMMON_NEIGHBOUR_SENSITIVITY


def test_blended_reads_the_graph_only_through_the_releases_and_the_seeds_friends() -> None:
    """Post-processing: for neighbouring graphs (one edge not touching the seed) and the same
    released vectors, ``blend`` gives the same answer, so its guarantee is the releases'."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        graph = random_graph(12, 0.3, rng)
        seed = int(rng.integers(12))
        others = [v for v in range(12) if v != seed]
        a, b = rng.choice(others, size=2, replace=False)
        dense = graph.adjacency.toarray().astype(bool)
        dense[a, b] = dense[b, a] = not dense[a, b]
        u, v = np.nonzero(np.triu(dense, k=1))
        neighbour = graph_from_edges(zip(u.tolist(), v.tolist(), strict=True), 12)
        counts, degrees = rng.normal(size=12), rng.normal(size=12)
        first = blend(graph, seed, counts, degrees, 2.0, 20.0)
        second = blend(neighbour, seed, counts, degrees, 2.0, 20.0)
        np.testing.assert_array_equal(first.scores, second.scores)
        assert first.weight == second.weight


@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_blended_ranks_friends_first_and_never_the_seed(epsilon: float) -> None:
    rng = np.random.default_rng(8)
    graph = random_graph(60, 0.1, rng)
    seed = int(np.argmax(graph.degrees))
    degrees = graph.degrees + rng.laplace(0.0, 20.0, graph.n)
    result = blended_ranking(graph, seed, plan_two_scale(epsilon), degrees, 20.0)
    friends = graph.neighbors(seed)
    order = np.argsort(-result.scores, kind="stable")
    assert set(order[: friends.shape[0]].tolist()) == set(friends.tolist())
    assert result.scores[seed] == 0.0 and np.all(np.delete(result.scores, seed) >= 1.0)
    assert 0.0 <= result.weight <= MAX_COUNT_WEIGHT
    assert 0.01 <= result.reliability_counts <= 1.0 and 0.01 <= result.reliability_degrees <= 1.0


@pytest.mark.parametrize("name", ["common_neighbours", "friends_of_friends", "blended"])
def test_the_served_draw_is_post_processing_of_the_proven_release(name: str) -> None:
    """What the service releases (``draw_ranking``) is the Laplace release of the counts (one
    scale for ``common_neighbours``, two scales otherwise), rounded to its grid, then ranked
    friends first (``friends_of_friends``) or blended with the stored degree release
    (``blended``): with the same generator it equals that composition exactly, so the proofs
    above cover the served path."""
    from service.mechanisms.common_neighbours import (
        noisy_common_neighbours,
        two_scale_common_neighbours,
    )
    from service.mechanisms.friends_of_friends import friends_first
    from service.mechanisms.postprocess import round_to_grid, score_grid
    from service.mechanisms.registry import RankingMechanism
    from service.privacy.modes import Mode
    from service.serving.rankings import ReleasedDegrees, draw_ranking, plan_ranking

    rng = np.random.default_rng(11)
    graph = random_graph(80, 0.08, rng)
    seed = int(np.argmax(graph.degrees))
    degree_plan = plan_laplace(0.1, DEGREE_SENSITIVITY)
    released = round_to_grid(
        graph.degrees + rng.laplace(0.0, degree_plan.scale, graph.n), score_grid(20.0)
    )
    degrees = ReleasedDegrees(graph.version, released, degree_plan)
    mechanism = RankingMechanism(name)
    plan = plan_ranking(mechanism, 0.5, Mode.PERSONALIZED, degrees)
    served = draw_ranking(graph, seed, plan, np.random.default_rng(3))
    if mechanism is RankingMechanism.COMMON_NEIGHBOURS:
        laplace = plan_laplace(0.5, COMMON_NEIGHBOUR_SENSITIVITY)
        assert plan.release == laplace and plan.degrees is None
        counts = round_to_grid(
            noisy_common_neighbours(graph, seed, laplace, np.random.default_rng(3)),
            score_grid(laplace.scale),
        )
        np.testing.assert_array_equal(served.scores, counts)
        assert served.grid == score_grid(4.0)
        return
    two = plan_two_scale(0.5)
    assert plan.release == two and plan.curve == plan_laplace(0.5, 2.0).curve
    counts = round_to_grid(
        two_scale_common_neighbours(graph, seed, two, np.random.default_rng(3)),
        score_grid(two.candidate_scale),
    )
    if mechanism is RankingMechanism.FRIENDS_OF_FRIENDS:
        assert plan.degrees is None
        np.testing.assert_array_equal(served.scores, friends_first(graph, seed, counts))
        assert served.grid == score_grid(2.0)
    else:
        expected = blend(graph, seed, counts, released, two.candidate_scale, degree_plan.scale)
        np.testing.assert_array_equal(served.scores, expected.scores)
        assert served.grid == score_grid(expected.score_noise_scale) > 0
        assert served.extra["weight"] == expected.weight


def test_friends_of_friends_ranks_friends_first_by_count_and_never_the_seed() -> None:
    from service.mechanisms.friends_of_friends import friends_of_friends

    rng = np.random.default_rng(8)
    graph = random_graph(60, 0.1, rng)
    seed = int(np.argmax(graph.degrees))
    scores = friends_of_friends(graph, seed, plan_two_scale(1.0), np.random.default_rng(2))
    friends = graph.neighbors(seed)
    order = np.argsort(-scores, kind="stable")
    assert set(order[: friends.shape[0]].tolist()) == set(friends.tolist())
    assert scores[seed] == 0.0 and np.all(np.delete(scores, seed) >= 1.0)
    # noise-free (a tiny scale), the candidates follow their exact counts
    from service.privacy.laplace import two_scale_plan_for_scales

    exact = friends_of_friends(graph, seed, two_scale_plan_for_scales(2e-9, 1e-9), rng)
    counts = common_neighbour_counts(graph, seed)
    candidates = np.setdiff1d(np.arange(graph.n), np.append(friends, seed))
    ranked = candidates[np.argsort(-exact[candidates], kind="stable")]
    assert np.all(np.diff(counts[ranked]) <= 0)


def test_the_signal_test_has_its_level_and_finds_signal() -> None:
    """Under "every candidate has count 0" the test (the largest of m counts against the 95%
    quantile of the maximum of m Laplace draws) fires about 5% of the time; counts that differ
    by several noise scales are found. It reads the top of the counts only."""
    from service.mechanisms.blended import TOP_DEPTH, counts_carry_signal

    def top(values: np.ndarray) -> np.ndarray:
        return np.sort(values)[::-1][:TOP_DEPTH]

    rng = np.random.default_rng(17)
    fired = [counts_carry_signal(top(rng.laplace(0.0, 4.0, 2000)), 4.0, 2000) for _ in range(2000)]
    assert 0.035 <= float(np.mean(fired)) <= 0.065
    spread = rng.integers(0, 40, 2000).astype(float)
    assert all(
        counts_carry_signal(top(spread + rng.laplace(0.0, 4.0, 2000)), 4.0, 2000) for _ in range(20)
    )
    assert not counts_carry_signal(np.zeros(0), 4.0, 0)


def test_the_top_reliability_is_low_on_noise_and_high_on_signal() -> None:
    """R_c from the top 50 of m counts: at the floor for pure noise (most draws), near 1 when
    the top counts stand far above the noise."""
    from service.mechanisms.blended import MIN_RELIABILITY, TOP_DEPTH, top_reliability

    rng = np.random.default_rng(23)
    m = 5000
    noise = [
        top_reliability(np.sort(rng.laplace(0.0, 2.0, m))[::-1][:TOP_DEPTH], 2.0, m)
        for _ in range(200)
    ]
    assert np.median(noise) <= 0.1 and min(noise) >= MIN_RELIABILITY
    counts = np.zeros(m)
    counts[:200] = 60.0
    signal = np.sort(counts + rng.laplace(0.0, 2.0, m))[::-1][:TOP_DEPTH]
    assert top_reliability(signal, 2.0, m) > 0.9
    assert top_reliability(np.zeros(0), 2.0, m) == MIN_RELIABILITY


# --------------------------------------------------------------------------- two scales


def _worst_two_scale_loss(
    adjacency: np.ndarray, friend_weight: float, candidate_weight: float
) -> tuple[float, dict[str, int]]:
    """Largest weighted loss sum_i |Delta c_i| * w_i over every seed and protected pair of every
    graph in ``adjacency``, with w_i = ``friend_weight`` (1 / b_f) on the seed's friends and
    ``candidate_weight`` (1 / b_c) on the other nodes but the seed (whose count is not
    released); and how often the toggle moved friend coordinates, candidate coordinates, both,
    or the seed's own count (the last two must never happen)."""
    n = adjacency.shape[1]
    worst = 0.0
    seen = {"friends": 0, "candidates": 0, "both": 0, "seed": 0, "neither": 0}
    for seed in range(n):
        counts = (adjacency @ adjacency[:, seed, :, None])[:, :, 0]  # (graphs, n)
        friends = adjacency[:, seed, :].astype(bool)  # N(seed), the same in G and G'
        candidates = ~friends
        candidates[:, seed] = False
        weights = np.where(friends, friend_weight, candidate_weight)
        weights[:, seed] = 0.0
        for a, b in itertools.combinations([v for v in range(n) if v != seed], 2):
            toggled = adjacency.copy()
            toggled[:, a, b] = toggled[:, b, a] = 1 - adjacency[:, a, b]
            change = np.abs((toggled @ toggled[:, seed, :, None])[:, :, 0] - counts)
            worst = max(worst, float((change * weights).sum(axis=1).max()))
            on_friends = (change * friends).sum(axis=1) > 0
            on_candidates = (change * candidates).sum(axis=1) > 0
            seen["friends"] += int((on_friends & ~on_candidates).sum())
            seen["candidates"] += int((on_candidates & ~on_friends).sum())
            seen["both"] += int((on_friends & on_candidates).sum())
            seen["seed"] += int((change[:, seed] > 0).sum())
            seen["neither"] += int((~on_friends & ~on_candidates).sum())
            # the lemma's shape: two friend coordinates by 1 each, or one candidate by 1
            assert np.all((change * friends).sum(axis=1)[on_friends] == 2)
            assert np.all((change * candidates).sum(axis=1)[on_candidates] == 1)
    return worst, seen


@pytest.mark.parametrize("epsilon", [0.1, 0.3, 1.0, 2.5])
def test_two_scale_loss_on_every_graph_on_five_nodes(epsilon: float) -> None:
    """Lap(2/eps) on the friends, Lap(1/eps) on the candidates (the library's own plan): the
    pure-DP loss sum_i |Delta_i| / b_i of every protected toggle is <= eps, and attained."""
    from service.privacy.laplace import plan_two_scale

    plan = plan_two_scale(epsilon)
    worst, seen = _worst_two_scale_loss(
        _all_graphs(5), 1.0 / plan.friend_scale, 1.0 / plan.candidate_scale
    )
    print(f"\ntwo-scale, every 5-node graph, eps {epsilon}: worst loss {worst!r}, "
          f"bound {plan.epsilon!r} (target {epsilon}); toggles moving {seen}")  # fmt: skip
    assert worst <= plan.epsilon <= epsilon
    assert worst == pytest.approx(plan.epsilon, rel=1e-12)  # attained, both ways
    # charged exactly as the one-scale counts at the same target
    one_scale = plan_laplace(epsilon, COMMON_NEIGHBOUR_SENSITIVITY)
    assert plan.epsilon == one_scale.epsilon and plan.curve == one_scale.curve
    assert seen["both"] == 0 and seen["seed"] == 0
    assert seen["friends"] > 0 and seen["candidates"] > 0 and seen["neither"] > 0


def test_two_scale_loss_on_random_graphs_on_six_to_ten_nodes() -> None:
    rng = np.random.default_rng(21)
    worst_seen = 0.0
    for _ in range(60):
        n = int(rng.integers(6, 11))
        graph = random_graph(n, float(rng.uniform(0.1, 0.8)), rng)
        adjacency = graph.adjacency.toarray().astype(np.int64)[None]
        worst, seen = _worst_two_scale_loss(adjacency, 0.5, 1.0)  # eps = 1
        assert worst <= 1.0 and seen["both"] == 0 and seen["seed"] == 0
        worst_seen = max(worst_seen, worst)
    print(f"\ntwo-scale, 60 random graphs on 6-10 nodes, eps 1: worst loss {worst_seen!r}")
    assert worst_seen == 1.0


def test_the_two_scale_bound_can_fail() -> None:
    """Controls: the same search finds the loss above eps when the friends get the candidates'
    scale 1/eps (both friends of s: 2 eps), and when every count gets 1/eps; a candidate scale
    below 1/eps with the right friend scale also fails. So the test above can fail."""
    graphs = _all_graphs(5)
    assert _worst_two_scale_loss(graphs, 1.0, 1.0)[0] == 2.0  # friends at 1/eps
    assert _worst_two_scale_loss(graphs, 0.5, 1.25)[0] == 1.25  # candidates at 0.8/eps
    assert _worst_two_scale_loss(graphs, 0.6, 1.0)[0] == pytest.approx(1.2)  # friends at 1.67/eps


def test_the_two_scale_release_uses_the_stated_scales() -> None:
    """The library's release puts Lap(b_f) on the friends, Lap(b_c) on the candidates and
    nothing on the seed: with the same generator it equals counts + the exact sampler's
    draws at those scales on the counts' grid."""
    from service.mechanisms.common_neighbours import (
        count_noise_scales,
        two_scale_common_neighbours,
    )
    from service.mechanisms.exact_laplace import grid_laplace
    from service.mechanisms.postprocess import count_grid
    from service.privacy.laplace import plan_two_scale

    rng = np.random.default_rng(4)
    graph = random_graph(40, 0.15, rng)
    seed = int(np.argmax(graph.degrees))
    plan = plan_two_scale(0.5)
    assert plan.friend_scale == plan_laplace(0.5, COMMON_NEIGHBOUR_SENSITIVITY).scale == 4.0
    assert plan.candidate_scale == 2.0 and plan.epsilon == 0.5
    scales = count_noise_scales(graph, seed, plan)
    friends = graph.neighbors(seed)
    assert np.all(scales[friends] == 4.0) and scales[seed] == 0.0
    assert np.sum(scales == 2.0) == graph.n - 1 - friends.shape[0]
    released = two_scale_common_neighbours(graph, seed, plan, np.random.default_rng(9))
    expected = common_neighbour_counts(graph, seed) + grid_laplace(
        np.random.default_rng(9), scales, count_grid(2.0)
    )
    expected[seed] = 0.0
    np.testing.assert_array_equal(released, expected)


def test_two_scale_counts_are_refused_in_edge_mode() -> None:
    from service.errors import InvalidParameter
    from service.mechanisms.common_neighbours import two_scale_common_neighbours
    from service.privacy.laplace import plan_two_scale

    graph = random_graph(10, 0.3, np.random.default_rng(1))
    with pytest.raises(InvalidParameter):
        two_scale_common_neighbours(graph, 0, plan_two_scale(1.0), mode="edge")


def test_blended_tests_the_candidates_with_their_own_noise_scale() -> None:
    """``blended`` on the two-scale counts measures the candidates' reliability and signal
    against the candidates' noise, b_c = 1 / eps (not the friends' 2 / eps), from the top of
    the candidates' counts: with the same generator its statistics equal those computed from
    the candidates at scale b_c, and differ from those at the friends' scale."""
    from service.mechanisms.blended import TOP_DEPTH, counts_carry_signal, top_reliability
    from service.mechanisms.common_neighbours import two_scale_common_neighbours

    rng = np.random.default_rng(31)
    graph = random_graph(300, 0.05, rng)
    seed = int(np.argmax(graph.degrees))
    plan = plan_two_scale(2.0)
    degrees = graph.degrees + rng.laplace(0.0, 20.0, graph.n)
    result = blended_ranking(graph, seed, plan, degrees, 20.0, np.random.default_rng(4))
    counts = two_scale_common_neighbours(graph, seed, plan, np.random.default_rng(4))
    candidates = np.ones(graph.n, dtype=bool)
    candidates[seed] = False
    candidates[graph.neighbors(seed)] = False
    m = int(candidates.sum())
    top = np.sort(counts[candidates])[::-1][:TOP_DEPTH]
    own = top_reliability(top, plan.candidate_scale, m)
    assert result.reliability_counts == own
    assert own > top_reliability(top, plan.friend_scale, m)
    assert result.counts_signal == counts_carry_signal(top, plan.candidate_scale, m)
