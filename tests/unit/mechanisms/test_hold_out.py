"""The compiled hold-out check reads the same tops, and stops at the same weight, as numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms.blended import mix, ranked_first
from service.mechanisms.hold_out import settled_tops, warm_up


def _pool(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts on a coarse grid and few distinct degrees: many tied scores, signed zeros."""
    values = rng.integers(-3, 4, size=size) * 0.25
    values[rng.random(size) < 0.1] = -0.0
    z = rng.choice(np.array([-1.5, -0.0, 0.0, 0.5, 2.0]), size=size)
    ids = rng.permutation(10 * size)[:size].astype(np.int64)
    return values, z, ids


def _weights() -> tuple[np.ndarray, np.ndarray]:
    w = np.linspace(0.0, 1.0, 11)
    return w * 0.7, (1.0 - w) * 0.9


def _reference_stop(
    a_s: np.ndarray, b_s: np.ndarray, values: np.ndarray, z: np.ndarray, r: int,
    bound: tuple[int, float | None, float],
) -> int:  # fmt: skip
    """The first weight whose r-th largest score does not pass U(a, b), as numpy reads it."""
    undrawn, threshold_value, z_head = bound
    for w, (a, b) in enumerate(zip(a_s, b_s, strict=True)):
        scores = mix(a, values, b, z)
        kth = float(np.partition(scores, scores.shape[0] - r)[scores.shape[0] - r])
        if undrawn == 0:
            continue
        if threshold_value is None:
            limit = math.inf if a > 0.0 else float(mix(a, np.zeros(1), b, np.array([z_head]))[0])
        else:
            limit = float(mix(a, np.array([threshold_value]), b, np.array([z_head]))[0])
        if not kth > limit:
            return w
    return int(a_s.shape[0])


@pytest.mark.parametrize("size, r", [(7, 1), (7, 7), (60, 5), (400, 50), (2500, 20)])
def test_every_settled_weights_top_is_ranked_first_of_its_blend(size: int, r: int) -> None:
    rng = np.random.default_rng(size * 100 + r)
    a_s, b_s = _weights()
    for _ in range(20):
        values, z, ids = _pool(rng, size)
        tops = np.full((a_s.shape[0], r), -1, dtype=np.int64)
        assert settled_tops(a_s, b_s, values, z, ids, r, 0, (0, None, 0.0), tops) == a_s.shape[0]
        for w in range(a_s.shape[0]):
            expected = ranked_first(mix(a_s[w], values, b_s[w], z), ids, r)
            assert tops[w].tolist() == expected.tolist()


BOUNDS: list[tuple[int, float | None, float]] = [
    (5, None, 0.5), (5, None, -1.0), (5, 0.25, 0.5), (5, -0.5, 2.0), (5, 0.75, -1.5),
]  # fmt: skip


def test_the_pass_stops_at_the_first_weight_not_settled() -> None:
    rng = np.random.default_rng(7)
    a_s, b_s = _weights()
    stops = set()
    for bound in BOUNDS:
        for _ in range(40):
            values, z, ids = _pool(rng, 80)
            r = int(rng.integers(1, 12))
            tops = np.full((a_s.shape[0], r), -1, dtype=np.int64)
            for start in (0, 3):
                stop = settled_tops(a_s, b_s, values, z, ids, r, start, bound, tops)
                expected = _reference_stop(a_s[start:], b_s[start:], values, z, r, bound)
                assert stop == expected + start
                stops.add(stop)
                assert (tops[stop:] == -1).all()  # a weight not settled is not written
    assert len(stops) > 3  # the cases stop at several weights, and pass them all


def test_a_top_larger_than_the_pool_is_refused() -> None:
    values, z, ids = _pool(np.random.default_rng(1), 5)
    tops = np.empty((1, 6), dtype=np.int64)
    with pytest.raises(ValueError, match="top's size"):
        settled_tops(np.ones(1), np.ones(1), values, z, ids, 6, 0, (0, None, 0.0), tops)


def test_the_warm_up_runs_the_compiled_pass() -> None:
    assert warm_up() == 1  # a pool of one node, nothing undrawn: its one weight is settled
