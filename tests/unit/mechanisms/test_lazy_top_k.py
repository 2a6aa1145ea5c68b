"""The lazy top-k has the law of "draw all m, sort, take k": chi-square tests of homogeneity
between the lazy sampler and the full draw (the sampler alone, ``common_neighbours`` and
``friends_of_friends`` on a small graph), a control showing the same test rejects a sampler
whose level counts are off by one, and the exact pieces (exp bounds, digits, binomial counts,
uniform distinct draws, the rank-to-index map)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from service.graph.generate import generate_graph
from service.mechanisms import lazy_top_k
from service.mechanisms.common_neighbours import (
    common_neighbours_top,
    noisy_common_neighbours,
    two_scale_common_neighbours,
)
from service.mechanisms.exact_laplace import rounded_laplace
from service.mechanisms.friends_of_friends import friends_first, friends_of_friends_top
from service.mechanisms.lazy_top_k import (
    binomial_count,
    distinct_uniform,
    exp_neg_bounds,
    lazy_rank_to_index,
    lazy_top,
    range_levels,
    range_probability_bits,
)
from service.mechanisms.postprocess import count_grid, ranked_indices
from service.privacy.laplace import plan_laplace, plan_two_scale
from tests.stats_support import homogeneity_p

#: Draws per side of each chi-square test (deterministic generators: the tests cannot flake).
DRAWS = 2500
#: Reject homogeneity below this p-value.
ALPHA = 1e-3


def _bucket(level: int, low: int = -4, high: int = 4) -> int:
    return max(low, min(high, level))


# -- the sampler alone --------------------------------------------------------------------


M, NEED, S, T = 60, 3, 1, 2  # gamma = 1/2: a few levels per scale


def _full_statistic(rng: np.random.Generator) -> tuple[int, ...]:
    levels = rounded_laplace(rng, S, T, M)
    order = np.lexsort((np.arange(M), -levels))[:NEED]
    return (
        int(order[0]) % 3,
        *(_bucket(int(x) - 4) for x in levels[order]),
        _bucket(int(levels.min()) + 6),
    )


def _lazy_statistic(rng: np.random.Generator) -> tuple[int, ...]:
    top = lazy_top(rng, S, T, M, NEED, minimum=True)
    order = np.lexsort((top.ranks, -top.levels))[:NEED]
    assert top.minimum is not None
    return (
        int(top.ranks[order[0]]) % 3,
        *(_bucket(int(x) - 4) for x in top.levels[order]),
        _bucket(top.minimum + 6),
    )


def _samples(statistic: Callable[[np.random.Generator], Hashable], seed: int) -> list[Hashable]:
    rng = np.random.default_rng(seed)
    return [statistic(rng) for _ in range(DRAWS)]


def test_lazy_top_has_the_law_of_the_full_draw() -> None:
    """Top-3 levels (ties by index), which node is first (mod 3) and the minimum of 60 i.i.d.
    draws: the lazy sampler and the full draw are not told apart."""
    assert homogeneity_p(_samples(_lazy_statistic, 1), _samples(_full_statistic, 2)) > ALPHA


def test_the_chi_square_test_rejects_level_counts_off_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: the same test rejects a sampler whose level counts are off by one level (each
    range's binomial count taken for ``[T' - 1, T)`` while its levels are drawn in
    ``[T', T)``)."""
    exact = lazy_top_k.range_probability_bits

    def off_by_one(
        law: lazy_top_k.LevelLaw, a: int | None, b: int | None, a2: int | None, b2: int | None
    ) -> lazy_top_k.range_probability_bits:
        if a2 is not None and (a is None or a2 - 1 >= a):
            a2 -= 1
        return exact(law, a, b, a2, b2)

    monkeypatch.setattr(lazy_top_k, "range_probability_bits", off_by_one)
    assert homogeneity_p(_samples(_lazy_statistic, 1), _samples(_full_statistic, 2)) < ALPHA


def test_the_thresholds_change_the_cost_not_the_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any choice of thresholds gives the same law: here narrow steps down through 0 (the
    ranges ``[4, +inf)``, ``[2, 4)``, ``[1, 2)``, ``[0, 1)``, ``[-2, 0)``, ``[-4, -2)``, ...,
    and the minimum's above a threshold), for the top 7 of 12, often below 0."""
    m, need = 12, 7

    def narrow(
        law: lazy_top_k.LevelLaw, top: int | None, lower: int | None, remaining: int, wanted: int
    ) -> int:
        below = 4 if top is None else {4: 2, 2: 1, 1: 0}.get(top, top - 2)
        return below if lower is None else max(below, lower)

    monkeypatch.setattr(lazy_top_k, "_next_threshold", narrow)

    def full(rng: np.random.Generator) -> tuple[int, ...]:
        levels = rounded_laplace(rng, S, T, m)
        order = np.lexsort((np.arange(m), -levels))[:need]
        top = levels[order]
        return (_bucket(int(top[0]) - 2), _bucket(int(top[-1])), _bucket(int(levels.min()) + 3))

    def lazy(rng: np.random.Generator) -> tuple[int, ...]:
        drawn = lazy_top(rng, S, T, m, need, minimum=True)
        top = drawn.levels[np.lexsort((drawn.ranks, -drawn.levels))[:need]]
        assert drawn.minimum is not None
        return (_bucket(int(top[0]) - 2), _bucket(int(top[-1])), _bucket(drawn.minimum + 3))

    assert homogeneity_p(_samples(lazy, 11), _samples(full, 12)) > ALPHA


# -- the rankings on a small graph ----------------------------------------------------------


GRAPH = generate_graph(40, 60, seed=5)
SEED = int(np.argmax(GRAPH.degrees))
K = 6


def _ranking_statistic(best: np.ndarray, scores: np.ndarray, unit: float) -> tuple[int, ...]:
    """The first and last node, the top score and the last one in units of the noise scale,
    and how many scores are 0."""
    return (
        int(best[0]),
        int(best[-1]),
        math.floor(scores[0] / unit),
        math.floor(scores[-1] / unit),
        int(np.sum(scores == 0.0)),
    )


def test_common_neighbours_top_has_the_law_of_ranking_the_full_draw() -> None:
    plan = plan_laplace(4.0, 2.0)  # b = 1/2: noise comparable to the counts
    grid = count_grid(plan.scale)
    k = GRAPH.n - 1 - 8  # deep enough to reach the clipped nodes (score 0, by index)

    def lazy(rng: np.random.Generator) -> Hashable:
        best, scores = common_neighbours_top(GRAPH, SEED, plan, k, rng, grid=grid)
        return _ranking_statistic(best, scores, 4 * plan.scale)

    def full(rng: np.random.Generator) -> Hashable:
        released = noisy_common_neighbours(GRAPH, SEED, plan, rng, grid=grid)
        best, scores = ranked_indices(GRAPH, SEED, released, k, grid=grid)
        return _ranking_statistic(best, scores, 4 * plan.scale)

    lazy_draws, full_draws = _samples(lazy, 3), _samples(full, 4)
    assert any(s[4] > 0 for s in full_draws) and any(s[4] > 0 for s in lazy_draws)
    assert homogeneity_p(lazy_draws, full_draws) > ALPHA


def test_friends_of_friends_top_has_the_law_of_ranking_the_full_draw() -> None:
    """The shift ``low`` (the pool's minimum, reached by the lazy nodes' minimum) and ``high``
    show in every score: the last candidate's score and the first friend's carry them."""
    plan = plan_two_scale(2.0)
    grid = count_grid(min(plan.friend_scale, plan.candidate_scale))
    friends = GRAPH.degrees[SEED]
    k = int(friends) + 3

    def statistic(best: np.ndarray, scores: np.ndarray) -> tuple[int, ...]:
        unit = 2 * plan.candidate_scale
        return (
            int(best[friends]),
            int(best[-1]),
            math.floor(scores[0] / unit),
            math.floor(scores[-1] / unit),
        )

    def lazy(rng: np.random.Generator) -> Hashable:
        return statistic(*friends_of_friends_top(GRAPH, SEED, plan, k, rng, grid=grid))

    def full(rng: np.random.Generator) -> Hashable:
        counts = two_scale_common_neighbours(GRAPH, SEED, plan, rng, grid=grid)
        return statistic(
            *ranked_indices(GRAPH, SEED, friends_first(GRAPH, SEED, counts), k, grid=grid)
        )

    assert homogeneity_p(_samples(lazy, 5), _samples(full, 6)) > ALPHA


def test_the_rankings_cover_every_node_but_the_seed_when_k_does() -> None:
    rng = np.random.default_rng(7)
    for k in (GRAPH.n - 1, GRAPH.n + 10):
        for best, scores in (
            common_neighbours_top(GRAPH, SEED, plan_laplace(1.0, 2.0), k, rng),
            friends_of_friends_top(GRAPH, SEED, plan_two_scale(1.0), k, rng),
        ):
            assert sorted(best.tolist()) == [v for v in range(GRAPH.n) if v != SEED]
            assert np.all(np.diff(scores) <= 0)
    with pytest.raises(ValueError):
        common_neighbours_top(GRAPH, SEED, plan_laplace(1.0, 2.0), 0, rng)


# -- the exact pieces ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "x", [Fraction(0), Fraction(1, 1024), Fraction(1, 3), Fraction(7, 2), Fraction(40)]
)
def test_exp_bounds_bracket_exp_tightly(x: Fraction) -> None:
    lo, hi = exp_neg_bounds(x, 80)
    assert lo <= hi <= lo + 2
    assert (
        lo / 2**80 <= math.exp(-float(x)) * (1 + 1e-15)
        and math.exp(-float(x)) * (1 - 1e-15) <= hi / 2**80
    )


def test_digits_are_those_of_the_probability() -> None:
    law = lazy_top_k.LevelLaw(1, 8)
    p = 0.5 * math.exp(-(3 - 0.5) / 8) - 0.5 * math.exp(-(9 - 0.5) / 8)  # P(3 <= N < 9)
    digits = range_probability_bits(law, None, None, 3, 9)
    value = sum(digits.bit(i) * 2.0**-i for i in range(1, 53))
    assert abs(value - p) < 1e-15
    assert digits.bit(400) in (0, 1)  # far digits: the precision grows


def test_a_range_asked_again_reuses_its_interval_and_keeps_its_digits() -> None:
    law = lazy_top_k.LevelLaw(3, 50)
    first = range_probability_bits(law, None, 40, 17, 40)
    digits = [first.bit(i) for i in range(1, 300)]  # far digits: a higher precision, kept too
    kept = lazy_top_k._probability_interval.cache_info()
    again = range_probability_bits(law, None, 40, 17, 40)
    assert [again.bit(i) for i in range(1, 300)] == digits
    after = lazy_top_k._probability_interval.cache_info()
    assert after.hits > kept.hits and after.misses == kept.misses
    lazy_top_k._probability_interval.cache_clear()  # computed anew: the same digits
    assert [range_probability_bits(law, None, 40, 17, 40).bit(i) for i in range(1, 300)] == digits


def test_binomial_count_has_the_binomial_law() -> None:
    law = lazy_top_k.LevelLaw(1, 4)
    p = 0.5 * math.exp(-(2 - 0.5) / 4)  # P(N >= 2)
    digits = range_probability_bits(law, None, None, 2, None)
    rng = np.random.default_rng(8)
    draws = [binomial_count(rng, 20, digits) for _ in range(DRAWS)]
    expected = stats.binom.pmf(np.arange(21), 20, p) * DRAWS
    observed = np.bincount(draws, minlength=21)
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA


def test_binomial_count_of_many_trials_has_the_binomial_law() -> None:
    """200,000 trials: the first digits' Binomial(u, 1/2) draws are the rejection sampler's
    (service/mechanisms/exact_binomial.py), the later ones popcounts."""
    law = lazy_top_k.LevelLaw(1, 4)
    trials = 200_000
    p = 0.5 * math.exp(-(2 - 0.5) / 4)  # P(N >= 2)
    digits = range_probability_bits(law, None, None, 2, None)
    rng = np.random.default_rng(18)
    draws = np.array([binomial_count(rng, trials, digits) for _ in range(DRAWS)])
    cuts = np.unique(stats.binom.ppf(np.linspace(0, 1, 21)[1:-1], trials, p).astype(np.int64))
    upper = np.append(cuts, trials)  # bin i: upper[i - 1] < k <= upper[i]
    expected = np.diff(np.concatenate([[0.0], stats.binom.cdf(upper, trials, p)])) * DRAWS
    observed = np.bincount(np.searchsorted(upper, draws), minlength=upper.shape[0])
    assert stats.chisquare(observed, expected * DRAWS / expected.sum()).pvalue > ALPHA


def test_range_levels_stay_in_their_range_with_the_conditional_law() -> None:
    law = lazy_top_k.LevelLaw(1, 2)
    rng = np.random.default_rng(9)
    for a, b in ((3, 7), (None, -2), (-5, -1), (2, None), (-3, None), (None, 4)):
        x = range_levels(rng, law, 400, a, b)
        assert x.shape == (400,)
        assert a is None or x.min() >= a
        assert b is None or x.max() < b
    # P(N = 3 + j | 3 <= N < 7) is proportional to exp(-j / 2)
    x = range_levels(rng, law, DRAWS, 3, 7)
    weights = np.exp(-np.arange(4) / 2)
    observed = np.bincount(x - 3, minlength=4)
    assert stats.chisquare(observed, weights / weights.sum() * DRAWS).pvalue > ALPHA


def test_range_levels_draw_about_what_they_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch is sized by the range's probability (a cost, never the law): a range on one
    side of 0 or a wide one across it takes one batch of about ``count`` draws, not twice as
    many; a range across 0 of small probability several bounded batches, and still ``count``
    levels in the range."""
    drawn: list[int] = []
    real = lazy_top_k.rounded_laplace

    def counted(rng: np.random.Generator, s: int, t: int, count: int) -> np.ndarray:
        drawn.append(count)
        return real(rng, s, t, count)

    monkeypatch.setattr(lazy_top_k, "rounded_laplace", counted)
    rng = np.random.default_rng(12)
    law = lazy_top_k.LevelLaw(1, 320)  # the service's gamma at epsilon 0.1
    for a, b in ((1759, None), (1537, 1759), (None, 1759), (None, 0)):
        drawn.clear()
        x = range_levels(rng, law, 2200, a, b)
        assert x.shape == (2200,) and len(drawn) == 1 and 2200 < drawn[0] < 2400, (a, b)
    drawn.clear()
    x = range_levels(rng, law, 3000, 0, 1)  # P(N = 0) is 1/640: several batches
    assert x.tolist() == [0] * 3000  # (one level: no draw is needed)
    x = range_levels(rng, lazy_top_k.LevelLaw(1, 2000), 200, -1, 2)  # about 1/1300 kept
    assert x.shape == (200,) and set(x.tolist()) <= {-1, 0, 1}
    assert max(drawn) <= 2 * 200 + lazy_top_k.LEVEL_BATCH_LIMIT and len(drawn) > 1


def test_distinct_uniform_is_a_uniform_sequence_of_distinct_values() -> None:
    rng = np.random.default_rng(10)
    draws = [tuple(distinct_uniform(rng, 5, 2).tolist()) for _ in range(DRAWS)]
    assert all(a != b for a, b in draws)
    observed = np.array(list(Counter(draws).values()))
    assert observed.shape == (20,)
    assert stats.chisquare(observed).pvalue > ALPHA
    with pytest.raises(ValueError):
        distinct_uniform(rng, 3, 4)


def test_lazy_ranks_map_to_the_nodes_not_excluded() -> None:
    excluded = np.array([0, 3, 4, 9])
    lazy = [v for v in range(12) if v not in excluded]
    assert lazy_rank_to_index(excluded, np.arange(8)).tolist() == lazy
