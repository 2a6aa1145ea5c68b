"""``blended``'s lazy top has the law of the full draw: chi-square tests of homogeneity between
:func:`blended_top` and ranking :func:`service.mechanisms.blended.blend` of every node's draw on
a small graph whose seed has few common neighbours (so most candidates are lazy), at the
service's grid and at a coarse one; two controls the same test rejects (each range's count
taken one level too wide; the undrawn nodes' bound ignored); the bound itself; that any
completion of what was drawn gives the full draw's answer bit for bit (and its control); and
that a large graph is served from a small share of its nodes."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from functools import cache

import numpy as np
import pytest

from service.graph.generate import generate_graph
from service.mechanisms import lazy_blend
from service.mechanisms.blended import blend, degree_standard
from service.mechanisms.common_neighbours import neighbourhood_counts, two_scale_common_neighbours
from service.mechanisms.exact_laplace import rounded_laplace
from service.mechanisms.lazy_blend import LazyCandidates, blended_top
from service.mechanisms.lazy_top_k import LevelLaw
from service.mechanisms.popular import noisy_degrees
from service.mechanisms.postprocess import count_grid, ranked_indices, round_to_grid, score_grid
from service.privacy.laplace import DEGREE_SENSITIVITY, plan_laplace, plan_two_scale
from tests.stats_support import homogeneity_p

#: On one worker together: the chi-square tests and their controls share the full draw's
#: samples (``_full_samples``, computed once per process).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_lazy_blend")]

#: Draws per side of each chi-square test (deterministic generators: the tests cannot flake).
#: Both controls are rejected at p below 1e-200 already at 1,000 draws (and at p = 0 in floats at
#: 1,500), so the tests of the law are far from the edge of their power.
DRAWS = 1200
#: Reject homogeneity below this p-value.
ALPHA = 1e-3
#: Moves of at least this many nodes (the service's 256 would draw these graphs whole).
SMALL_BLOCK = 4


# -- a small graph, a seed with 3 friends and 16 nodes within two hops of 300 ------------------

GRAPH = generate_graph(300, 600, seed=3)
SEED = 147
FRIENDS = int(GRAPH.degrees[SEED])
K = FRIENDS + 4  # the friends and four candidates
DEGREE_SCALE = 2.0
DEGREES = round_to_grid(
    GRAPH.degrees + np.random.default_rng(9).laplace(0.0, DEGREE_SCALE, GRAPH.n),
    count_grid(DEGREE_SCALE),
)
DEGREES.setflags(write=False)  # a stored release is read-only (and summarized once)


def _statistic(
    best: np.ndarray, scores: np.ndarray, weight: float, signal: bool, r_counts: float
) -> tuple[int | bool, ...]:
    """The first and the last candidate served, the first candidate's score (in quarters: the
    shifts low and high show in it), the weight, the signal test and R_c in quarters."""
    return (
        int(best[FRIENDS]),
        int(best[-1]),
        math.floor(scores[FRIENDS] / 0.25),
        round(weight * 20),
        bool(signal),
        min(int(r_counts * 4), 3),
    )


def _lazy(epsilon: float, grid: float) -> Callable[[np.random.Generator], Hashable]:
    plan = plan_two_scale(epsilon)

    def draw(rng: np.random.Generator) -> Hashable:
        top = blended_top(GRAPH, SEED, plan, DEGREES, DEGREE_SCALE, K, rng, grid=grid)
        return _statistic(
            top.indices, top.scores, top.weight, top.counts_signal, top.reliability_counts
        )

    return draw


def _full(epsilon: float, grid: float) -> Callable[[np.random.Generator], Hashable]:
    plan = plan_two_scale(epsilon)

    def draw(rng: np.random.Generator) -> Hashable:
        counts = two_scale_common_neighbours(GRAPH, SEED, plan, rng, grid=grid)
        ranking = blend(
            GRAPH, SEED, counts, DEGREES, plan.candidate_scale, DEGREE_SCALE, depth=K - FRIENDS
        )
        best, scores = ranked_indices(
            GRAPH, SEED, ranking.scores, K, grid=score_grid(ranking.score_noise_scale)
        )
        return _statistic(
            best, scores, ranking.weight, ranking.counts_signal, ranking.reliability_counts
        )

    return draw


def _samples(statistic: Callable[[np.random.Generator], Hashable], seed: int) -> list[Hashable]:
    rng = np.random.default_rng(seed)
    return [statistic(rng) for _ in range(DRAWS)]


@cache
def _full_samples(epsilon: float, grid: float) -> tuple[Hashable, ...]:
    return tuple(_samples(_full(epsilon, grid), 2))


def test_the_graph_leaves_most_candidates_lazy() -> None:
    nodes, _ = neighbourhood_counts(GRAPH, SEED)
    assert FRIENDS == 3 and nodes.shape[0] == 16


def test_blended_top_has_the_law_of_ranking_the_full_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the service's grid (gamma about 1/256 of a level per noise scale), eps 0.5."""
    monkeypatch.setattr(lazy_blend, "MIN_BLOCK", SMALL_BLOCK)
    grid = count_grid(plan_two_scale(0.5).candidate_scale)
    lazy = _samples(_lazy(0.5, grid), 1)
    assert homogeneity_p(lazy, list(_full_samples(0.5, grid))) > ALPHA


def test_blended_top_has_the_law_of_ranking_the_full_draw_on_a_coarse_grid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Grid 1 at eps 1 (gamma 1 for the candidates): one level is a whole noise scale, where
    an error of one level in a count would show (the controls below)."""
    monkeypatch.setattr(lazy_blend, "MIN_BLOCK", SMALL_BLOCK)
    lazy = _samples(_lazy(1.0, 1.0), 1)
    assert homogeneity_p(lazy, list(_full_samples(1.0, 1.0))) > ALPHA


def test_the_chi_square_test_rejects_counts_one_level_too_wide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: each range's count taken in [T' - 1, T) while its levels are drawn in
    [T', T)."""
    monkeypatch.setattr(lazy_blend, "MIN_BLOCK", SMALL_BLOCK)
    real = lazy_blend.range_probability_bits

    def wide(
        law: LevelLaw, a: int | None, b: int | None, a2: int | None, b2: int | None
    ) -> lazy_blend.range_probability_bits:
        return real(law, a, b, None if a2 is None else a2 - 1, b2)

    monkeypatch.setattr(lazy_blend, "range_probability_bits", wide)
    lazy = _samples(_lazy(1.0, 1.0), 1)
    assert homogeneity_p(lazy, list(_full_samples(1.0, 1.0))) < 1e-9


def test_the_chi_square_test_rejects_ignoring_the_undrawn_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: the bound U taken as -inf (the lazy nodes never drawn beyond the first move)."""
    monkeypatch.setattr(lazy_blend, "MIN_BLOCK", SMALL_BLOCK)
    monkeypatch.setattr(LazyCandidates, "bound", lambda self, a, b: -math.inf)
    lazy = _samples(_lazy(1.0, 1.0), 1)
    assert homogeneity_p(lazy, list(_full_samples(1.0, 1.0))) < 1e-9


# -- the bound and the moves ----------------------------------------------------------------


def _undrawn_counted(state: LazyCandidates) -> int:
    """R counted node by node: the positions from H on that are neither excluded nor drawn."""
    taken = set(state.excluded.tolist()) | set(state.sparse_drawn.tolist())
    return sum(1 for position in range(state.head, state.n) if position not in taken)


def test_no_undrawn_node_scores_above_the_bound() -> None:
    """After any moves, drawing every node left (lower T to -inf) finds none above U(a, b)
    for any blend, and every node of Z exactly once."""
    rng = np.random.default_rng(41)
    standard = degree_standard(DEGREES, DEGREE_SCALE)
    excluded = np.union1d(neighbourhood_counts(GRAPH, SEED)[0], [SEED])
    law = LevelLaw(1, 1)
    for trial in range(40):
        state = LazyCandidates(
            rng, law, 1.0, standard, excluded, np.zeros(0, np.int64), np.zeros(0)
        )
        for _ in range(int(rng.integers(1, 5))):
            if rng.random() < 0.5:
                state.extend(state.head + int(rng.integers(1, 40)))
            else:
                top = state.threshold if state.threshold is not None else 6
                state.lower(top - int(rng.integers(1, 4)))
            assert state.undrawn() == _undrawn_counted(state), trial  # kept across moves
            assert state.z_head() == standard.z(standard.order[state.head : state.head + 1])[0]
        blends = [(float(a), float(b)) for a, b in rng.uniform(0.0, 2.0, (5, 2))] + [(0.0, 1.0)]
        bounds = [state.bound(a, b) for a, b in blends]
        before = state.ids.shape[0]
        state.lower(None)
        fresh = slice(before, None)
        for (a, b), limit in zip(blends, bounds, strict=True):
            scores = a * state.values[fresh] + b * state.z[fresh]
            assert np.all(scores <= limit), trial
        assert state.undrawn() == 0
        lazy = np.setdiff1d(np.arange(GRAPH.n), excluded)
        assert np.array_equal(np.sort(state.ids), lazy)


def test_the_top_covers_every_node_but_the_seed_when_k_does() -> None:
    rng = np.random.default_rng(7)
    for k in (GRAPH.n - 1, GRAPH.n + 10):
        top = blended_top(GRAPH, SEED, plan_two_scale(1.0), DEGREES, DEGREE_SCALE, k, rng)
        assert sorted(top.indices.tolist()) == [v for v in range(GRAPH.n) if v != SEED]
        assert np.all(np.diff(top.scores) <= 0)
        assert set(top.indices[:FRIENDS].tolist()) == set(GRAPH.neighbors(SEED).tolist())
    with pytest.raises(ValueError):
        blended_top(GRAPH, SEED, plan_two_scale(1.0), DEGREES, DEGREE_SCALE, 0, rng)


def test_a_large_graph_is_served_from_a_few_of_its_nodes() -> None:
    """The cost is what is drawn: on 200,000 nodes the served top 1000 + d(s) draws a few
    thousand nodes' counts, not n (no wall-clock time is asserted)."""
    graph = generate_graph(200_000, 1_000_000, seed=1)
    plan = plan_laplace(0.1, DEGREE_SENSITIVITY)
    degrees = noisy_degrees(graph, plan, np.random.default_rng(2))
    drawn: list[int] = []
    real = LazyCandidates.__init__

    def spy(self: LazyCandidates, *args: object) -> None:
        real(self, *args)  # type: ignore[arg-type]
        drawn.append(0)
        states.append(self)

    states: list[LazyCandidates] = []
    rng = np.random.default_rng(3)
    seeds = rng.choice(np.flatnonzero(graph.degrees > 0), 5, replace=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LazyCandidates, "__init__", spy)
        for seed in seeds:
            for epsilon in (0.1, 1.0):
                k = 1000 + int(graph.degrees[seed])
                top = blended_top(graph, int(seed), plan_two_scale(epsilon), degrees, plan.scale,
                                  k, rng)  # fmt: skip
                assert top.indices.shape[0] == k
    assert len(states) == 10
    assert max(state.ids.shape[0] for state in states) < 20_000 < graph.n


def test_levels_drawn_below_a_threshold_keep_the_law() -> None:
    """The dense region's draws, N | N < T, against rejection from the full law."""
    rng = np.random.default_rng(5)
    law = LevelLaw(1, 1)
    standard = degree_standard(DEGREES, DEGREE_SCALE)
    state = LazyCandidates(rng, law, 1.0, standard, np.array([SEED]), np.zeros(0, np.int64),
                           np.zeros(0))  # fmt: skip
    state.lower(2)  # the nodes above level 2 drawn; the rest are N | N < 2
    before = state.ids.shape[0]
    state.extend(GRAPH.n)
    below = state.values[before:].astype(int).tolist()
    full = rounded_laplace(rng, 1, 1, 4 * len(below))
    reference = full[full < 2][: len(below)].tolist()
    assert max(below) <= 1
    assert homogeneity_p([max(-4, x) for x in below], [max(-4, x) for x in reference]) > ALPHA


# -- what was drawn settles the answer: any completion gives the full draw's answer ----------


@pytest.mark.parametrize("block", [1, 4, 256, lazy_blend.MIN_BLOCK])
def test_every_completion_of_the_draw_gives_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """The proof's second half, bit for bit: after ``blended_draw`` stops, draw every node left
    (levels below T), assemble the full vector and run the full draw's ``blend`` and
    ``ranked_indices`` on it: the same nodes, scores, grid, weight, R_c, R_d and signal, on
    graphs, seeds, epsilons and depths where the lazy nodes matter."""
    from service.mechanisms.lazy_blend import blended_draw

    monkeypatch.setattr(lazy_blend, "MIN_BLOCK", block)
    rng = np.random.default_rng(53)
    graphs = [GRAPH, generate_graph(2000, 5000, seed=4), generate_graph(500, 4000, seed=6)]
    for graph in graphs:
        noisy = round_to_grid(
            graph.degrees + rng.laplace(0.0, DEGREE_SCALE, graph.n), count_grid(DEGREE_SCALE)
        )
        noisy.setflags(write=False)
        for _ in range(8):
            seed = int(rng.choice(np.flatnonzero(graph.degrees > 0)))
            epsilon = float(rng.choice([0.1, 0.5, 2.0]))
            k = int(graph.degrees[seed]) + int(rng.choice([1, 5, 60]))
            grid = float(rng.choice([1.0, count_grid(plan_two_scale(epsilon).candidate_scale)]))
            plan = plan_two_scale(epsilon)
            drawn = blended_draw(graph, seed, plan, noisy, DEGREE_SCALE, k, rng, grid=grid)
            state = drawn.candidates
            state.lower(None)  # a completion: every node left, from N | N < T
            assert state.undrawn() == 0
            counts = np.zeros(graph.n)
            counts[state.ids] = state.values
            counts[drawn.friends] = drawn.friend_values
            full = blend(graph, seed, counts, noisy, plan.candidate_scale, DEGREE_SCALE,
                         depth=k - drawn.friends.shape[0])  # fmt: skip
            grid_out = score_grid(full.score_noise_scale)
            best, scores = ranked_indices(graph, seed, full.scores, k, grid=grid_out)
            top = drawn.top
            assert np.array_equal(top.indices, best) and np.array_equal(top.scores, scores)
            assert top.grid == grid_out and top.weight == full.weight
            assert top.reliability_counts == full.reliability_counts
            assert top.reliability_degrees == full.reliability_degrees
            assert top.counts_signal == full.counts_signal


def test_the_completion_check_fails_when_the_undrawn_nodes_are_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: with the bound U taken as -inf the draw stops too early, and some completion
    changes the answer."""
    monkeypatch.setattr(LazyCandidates, "bound", lambda self, a, b: -math.inf)
    with pytest.raises(AssertionError):
        test_every_completion_of_the_draw_gives_the_same_answer(monkeypatch, 4)


def _hold_out_answers(graph_seeds: list[tuple[int, int]]) -> list[tuple[object, ...]]:
    """``blended_top``'s answers for generated graphs' seeds, each from its own fixed generator."""
    answers: list[tuple[object, ...]] = []
    for nodes, edges in graph_seeds:
        graph = generate_graph(nodes, edges, seed=nodes)
        noisy = round_to_grid(
            graph.degrees + np.random.default_rng(nodes).laplace(0.0, DEGREE_SCALE, graph.n),
            count_grid(DEGREE_SCALE),
        )
        noisy.setflags(write=False)
        pick = np.random.default_rng(edges)
        for i, seed in enumerate(pick.choice(np.flatnonzero(graph.degrees > 0), 12, False)):
            plan = plan_two_scale(float(pick.choice([0.1, 0.5, 2.0])))
            k = int(graph.degrees[seed]) + int(pick.choice([1, 20, 300]))
            top = blended_top(graph, int(seed), plan, noisy, DEGREE_SCALE, k,
                              np.random.default_rng(i))  # fmt: skip
            answers.append((top.indices.tolist(), top.scores.tolist(), top.weight))
    return answers


GRAPHS_OF_THE_HOLD_OUT = [(300, 600), (2000, 20000), (5000, 100000)]


def _none_settled(*args: object) -> object:
    """``settled_tops`` settling no weight: it returns ``start``, and every weight of the
    hold-out check is read with numpy, one at a time."""
    return args[6]


def test_the_hold_out_check_reads_the_same_top_above_the_last_weights_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A weight of the hold-out check read with numpy (one not settled by the compiled pass;
    here every weight) partitions only the scores at least the last weight's top's r-th
    (``floor_of``): the same answers, bit for bit and from the same generators, as partitioning
    every score."""
    monkeypatch.setattr(lazy_blend, "settled_tops", _none_settled)
    fast = _hold_out_answers(GRAPHS_OF_THE_HOLD_OUT)
    monkeypatch.setattr(lazy_blend, "floor_of", lambda scores, known, r: -math.inf)
    assert fast == _hold_out_answers(GRAPHS_OF_THE_HOLD_OUT)


def test_the_hold_out_check_changes_with_a_floor_above_the_top(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: a floor at the largest of the last top's scores (not the smallest) drops nodes
    of the top, and some answer changes."""
    monkeypatch.setattr(lazy_blend, "settled_tops", _none_settled)
    fast = _hold_out_answers(GRAPHS_OF_THE_HOLD_OUT)
    monkeypatch.setattr(
        lazy_blend,
        "floor_of",
        lambda scores, known, r: -math.inf if known is None else float(scores[known].max()),
    )
    try:
        broken: list[tuple[object, ...]] | None = _hold_out_answers(GRAPHS_OF_THE_HOLD_OUT)
    except ValueError:  # a top of fewer than r nodes
        broken = None
    assert fast != broken


def test_the_compiled_hold_out_check_gives_the_same_answers_as_one_weight_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The settled weights read in one compiled pass (``settled_tops``): the same answers, bit
    for bit and from the same generators, as reading every weight with numpy, one at a time."""
    compiled = _hold_out_answers(GRAPHS_OF_THE_HOLD_OUT)
    monkeypatch.setattr(lazy_blend, "settled_tops", _none_settled)
    assert compiled == _hold_out_answers(GRAPHS_OF_THE_HOLD_OUT)
