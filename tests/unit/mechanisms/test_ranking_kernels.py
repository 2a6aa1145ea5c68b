"""The compiled ranking steps give the numbers of the numpy they replaced, value for value."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.ranking_kernels import (
    SHORT_RUN,
    first_distinct,
    geometric_levels,
    kth_largest,
    ranked_positions,
    warm_up,
)


def _numpy_ranked(scores: np.ndarray, indices: np.ndarray, r: int) -> np.ndarray:
    """The ranking as numpy computed it before: lexsort over the scores at least the r-th."""
    size = scores.shape[0]
    r = min(int(r), size)
    if r <= 0:
        return np.zeros(0, dtype=np.int64)
    if r < size:
        part = np.argpartition(-scores, r - 1)[:r]
        part = np.flatnonzero(scores >= scores[part].min())
    else:
        part = np.arange(size)
    return part[np.lexsort((indices[part], -scores[part]))][:r].astype(np.int64)


def _tied_scores(rng: np.random.Generator, size: int, levels: int) -> np.ndarray:
    """Scores on a coarse grid (long runs of ties) with signed zeros among them."""
    scores = rng.integers(-levels, levels + 1, size=size) * 0.5
    scores[rng.random(size) < 0.2] = -0.0
    return scores


@pytest.mark.parametrize("size", [1, 2, 17, 300, 4400])
@pytest.mark.parametrize("levels", [0, 3, 40, 100_000])
def test_the_compiled_ranking_is_numpys_lexsort_over_the_top(size: int, levels: int) -> None:
    rng = np.random.default_rng(size * 7 + levels)
    for _ in range(6):
        scores = _tied_scores(rng, size, levels)
        indices = rng.integers(0, max(2, size // 3), size=size)  # repeats: ties by position
        for r in sorted({1, 2, size // 2, size - 1, size, size + 5, SHORT_RUN + 1}):
            got = ranked_positions(scores, indices, r)
            assert got.tolist() == _numpy_ranked(scores, indices, r).tolist(), (size, r)


def test_runs_of_ties_longer_and_shorter_than_the_insertion_limit_are_ordered_alike() -> None:
    scores = np.array([1.0] * (SHORT_RUN + 5) + [2.0] * (SHORT_RUN - 3) + [0.0] * 4)
    indices = np.arange(scores.shape[0])[::-1].copy()
    got = ranked_positions(scores, indices, scores.shape[0] - 2)
    assert got.tolist() == _numpy_ranked(scores, indices, scores.shape[0] - 2).tolist()
    assert ranked_positions(scores, indices, 0).shape == (0,)


@pytest.mark.parametrize(
    "scores",
    [
        np.arange(5000.0),  # ascending
        np.arange(5000.0)[::-1].copy(),  # descending
        np.zeros(3000),  # all equal
        np.concatenate([np.arange(2000.0), np.full(2000, 7.0)]),
    ],
    ids=["ascending", "descending", "equal", "half-equal"],
)
def test_the_kth_largest_is_numpys_partition_on_ordered_and_tied_scores(
    scores: np.ndarray,
) -> None:
    size = scores.shape[0]
    for r in (1, 2, 17, size // 2, size - 1, size):
        assert kth_largest(scores, r) == np.partition(scores, size - r)[size - r]
    with pytest.raises(ValueError):
        kth_largest(scores, size + 1)


def test_the_kth_largest_of_random_tied_scores() -> None:
    rng = np.random.default_rng(5)
    for size in (1, 9, 250, 4000):
        scores = _tied_scores(rng, size, 6)
        for r in {1, size // 3 + 1, size}:
            assert kth_largest(scores, r) == np.partition(scores, size - r)[size - r]


def _numpy_first_distinct(stream: np.ndarray, count: int) -> np.ndarray:
    _, first = np.unique(stream, return_index=True)
    return stream[np.sort(first)[:count]]


def test_first_distinct_is_numpys_first_occurrences_in_stream_order() -> None:
    rng = np.random.default_rng(3)
    for m in (1, 5, 100, 10**6, 2**62):
        stream = rng.integers(0, m, size=3000, dtype=np.int64)
        for count in (1, 10, 2000, 5000):
            expected = _numpy_first_distinct(stream, count)
            assert first_distinct(stream, count).tolist() == expected.tolist(), (m, count)
    assert first_distinct(np.array([4, 4], dtype=np.int64), 0).shape == (0,)


def _numpy_levels(z: np.ndarray, a: int | None, b: int | None) -> np.ndarray:
    g = np.abs(z[z != 0]) - 1
    if a is not None and a >= 1:
        above: np.ndarray = a + (g if b is None else g % (b - a))
        return above
    assert b is not None
    below: np.ndarray = (b - 1) - (g if a is None else g % (b - a))
    return below


@pytest.mark.parametrize("a, b", [(1, None), (3, 7), (2, 3), (None, 0), (-9, -2), (None, -4)])
def test_a_ranges_levels_are_numpys_mapping_of_the_draws(a: int | None, b: int | None) -> None:
    z = np.random.default_rng(11).integers(-50, 51, size=4000)
    got = geometric_levels(z, a, b)
    assert got.dtype == np.int64
    assert got.tolist() == _numpy_levels(z, a, b).tolist()


@pytest.mark.parametrize("a, b", [(None, None), (0, None), (-3, 5), (None, 1)])
def test_a_range_across_zero_is_not_mapped(a: int | None, b: int | None) -> None:
    with pytest.raises(ValueError, match="neither above 0 nor below it"):
        geometric_levels(np.array([1, -2]), a, b)


def test_warm_up_runs_each_kernel() -> None:
    assert warm_up() == 1 + 2 + 2
