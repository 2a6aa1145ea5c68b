"""``blended``'s small statistics computed in bulk give the numbers of their one-at-a-time
forms: the hold-out gains of several tops in one reduction, and the chosen weight's median."""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms.blended import (
    TIE_TOLERANCE,
    WEIGHTS,
    choose_weight,
    recovery_gain,
    recovery_gains,
)


@pytest.mark.parametrize("depth", [1, 2, 7, 8, 9, 16, 33, 50])
def test_recovery_gains_are_each_rows_recovery_gain(depth: int) -> None:
    rng = np.random.default_rng(depth)
    rows = rng.random((len(WEIGHTS), depth)) < rng.random((len(WEIGHTS), 1))
    tops = rng.integers(0, 40, size=(len(WEIGHTS) + 3, depth))
    expected = [recovery_gain(row) for row in rows]
    assert recovery_gains(rows).tolist() == expected  # the same floats, not close ones
    # a slice of a larger array of tops, as the hold-out check passes it
    sliced = tops[2:9] < 20
    assert recovery_gains(sliced).tolist() == [recovery_gain(row) for row in sliced]


def _numpy_choice(gains: np.ndarray) -> float:
    """The weight as numpy's median of the weights within the tolerance of the best."""
    return float(np.median(WEIGHTS[gains >= gains.max() * (1.0 - TIE_TOLERANCE)]))


def test_the_chosen_weight_is_numpys_median() -> None:
    rng = np.random.default_rng(4)
    cases = [np.zeros(len(WEIGHTS)), np.arange(len(WEIGHTS), dtype=np.float64)]
    for _ in range(3000):  # subsets of every size: odd and even, ends and middles
        gains = rng.random(len(WEIGHTS))
        gains[rng.random(len(WEIGHTS)) < rng.random()] = gains.max()
        cases.append(gains)
    for gains in cases:
        assert choose_weight(gains) == _numpy_choice(gains)
