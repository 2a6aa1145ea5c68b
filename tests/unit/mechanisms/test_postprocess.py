"""Released scores are rounded to a power-of-two grid well above float64 spacing (post-processing
against the low-bit attack on floating-point Laplace noise) and well below the noise scale."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.mechanisms.diffusion import noisy_diffusion
from service.mechanisms.postprocess import (
    NOISELESS_GRID,
    ranked_indices,
    ranked_results,
    round_to_grid,
    score_grid,
    top_k,
    top_k_reference,
    top_k_units,
)
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode
from tests.graph_helpers import random_graph


@pytest.mark.parametrize("scale", [8e-6, 7.99969e-06, 1e-7, 0.5, 20.0, 2.0**-20])
def test_the_grid_is_a_power_of_two_far_below_the_noise_scale(scale: float) -> None:
    grid = score_grid(scale)
    exponent = math.log2(grid)
    assert exponent == int(exponent)
    assert scale / 512 < grid <= scale / 256


def test_a_noiseless_release_still_has_a_grid() -> None:
    assert score_grid(0.0) == NOISELESS_GRID


def test_rounding_is_exact_and_moves_a_score_by_at_most_half_a_step() -> None:
    rng = np.random.default_rng(3)
    scores = rng.laplace(0.01, 8e-6, 10_000)
    grid = score_grid(8e-6)
    rounded = round_to_grid(scores, grid)
    steps = rounded / grid
    assert np.array_equal(steps, np.round(steps))
    assert np.max(np.abs(rounded - scores)) <= grid / 2
    # Nothing below the grid survives: the low mantissa bits of every score are zero.
    mantissa_bits = np.frexp(rounded[rounded != 0])[0] * 2.0**53
    low_bits = 53 - int(math.log2(0.02 / grid)) - 1
    assert np.all(np.mod(mantissa_bits, 2.0**low_bits) == 0)


@pytest.mark.parametrize("mode", list(Mode))
def test_released_rankings_are_multiples_of_the_grid(mode: Mode) -> None:
    graph = random_graph(60, 0.1, np.random.default_rng(1))
    plan = plan_diffusion(0.5, 1e-6, 30, 0.8, 1e-7, mode)
    grid = score_grid(plan.config.noise_scale)
    scores = noisy_diffusion(graph, 0, plan.config)
    results = ranked_results(graph, 0, scores, 20, grid=grid)
    values = [r.score for r in results]
    assert all((v / grid).is_integer() for v in values)
    assert values == sorted(values, reverse=True)


def exclusions_and_k(rng: np.random.Generator, trial: int, n: int) -> tuple[np.ndarray | None, int]:
    """A ranking trial's excluded entries (none on every third trial; else up to 3, repeated
    or negative) and its k (up to 2 past the n entries)."""
    exclude = rng.integers(-n, n, int(rng.integers(0, 4))) if trial % 3 else None
    return exclude, int(rng.integers(1, n + 3))


def test_top_k_ranks_every_vector_as_the_reference_does() -> None:
    """The partition-and-stable-sort ranking is the two-key sort's, index for index: ties
    (many, signed zeros, infinities), excluded entries (repeated, negative), k past the
    candidates."""
    rng = np.random.default_rng()
    for trial in range(4000):
        n = int(rng.integers(1, 50))
        kind = trial % 4
        if kind == 0:
            scores = rng.integers(-3, 4, n).astype(float)
        elif kind == 1:
            scores = rng.standard_normal(n)
        elif kind == 2:
            scores = np.where(rng.random(n) < 0.5, -0.0, rng.random(n))
        else:
            scores = rng.integers(0, 3, n).astype(float)
            scores[rng.random(n) < 0.1] = np.inf
        exclude, k = exclusions_and_k(rng, trial, n)
        expected = top_k_reference(scores, k, exclude)
        got = top_k(scores, k, exclude)
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), (
            scores, k, exclude,
        )  # fmt: skip


def test_top_k_units_ranks_integer_scores_as_top_k_does() -> None:
    """The integer keys rank integer-valued scores as :func:`top_k` does, index for index:
    many ties, negative scores and signed zeros (clipped to 0), scores up to 2^40, excluded
    entries (repeated, negative), k past the candidates, index widths of 1 to 13 bits."""
    rng = np.random.default_rng(20261201)
    for trial in range(3000):
        n = int(rng.integers(1, 70)) if trial % 10 else int(rng.integers(70, 5000))
        kind = trial % 3
        if kind == 0:
            units = rng.integers(-3, 4, n).astype(float)
        elif kind == 1:
            units = np.rint(rng.standard_normal(n) * 2.0 ** int(rng.integers(0, 40)))
        else:
            units = np.where(rng.random(n) < 0.5, -0.0, rng.integers(0, 5, n).astype(float))
        exclude, k = exclusions_and_k(rng, trial, n)
        got = top_k_units(units, k, exclude)
        expected = top_k(units, k, exclude)
        assert got is not None
        assert got.dtype == np.int64 and got.tolist() == expected.tolist(), (units, k, exclude)


def test_top_k_units_declines_scores_its_keys_cannot_hold() -> None:
    """With 4039 entries an index takes 12 bits: a clipped score must stay below 2^51. At the
    bound, NaN or infinity the caller ranks with top_k."""
    units = np.zeros(4039)
    units[7] = 2.0**51 - 1
    units[9] = 2.0**51 - 2
    ranked = top_k_units(units, 3)
    assert ranked is not None and ranked.tolist() == top_k(units, 3).tolist() == [7, 9, 0]
    for bad in (2.0**51, np.inf, np.nan):
        units[7] = bad
        assert top_k_units(units, 3) is None
    with pytest.raises(ValueError, match="k must be"):
        top_k_units(np.zeros(3), 0)
    with pytest.raises(IndexError):
        top_k_units(np.zeros(3), 1, np.array([3]))


@pytest.mark.parametrize("grid", [2.0**-20, 2.0**-3, 3e-7])
def test_ranked_indices_rank_the_rounded_scores(grid: float) -> None:
    """Through the keys (a power-of-two grid) or through top_k (any other grid): the ranking
    and the values of top_k over round_to_grid's scores."""
    graph = random_graph(300, 0.05, np.random.default_rng(2))
    rng = np.random.default_rng(3)
    for trial in range(40):
        scores = rng.standard_normal(graph.n) * 2.0**-16 * (1 + trial % 5)
        scores[rng.random(graph.n) < 0.2] = 0.0
        seed = int(rng.integers(graph.n))
        for exclude_neighbors in (False, True):
            best, values = ranked_indices(graph, seed, scores, 50, grid=grid,
                                          exclude_neighbors=exclude_neighbors)  # fmt: skip
            rounded = round_to_grid(scores, grid)
            exclude = [seed, *graph.neighbors(seed).tolist()] if exclude_neighbors else [seed]
            expected = top_k(rounded, 50, np.array(exclude))
            assert best.tolist() == expected.tolist()
            assert values.tolist() == np.maximum(rounded[expected], 0.0).tolist()


def test_rounding_to_the_grid_is_numpys_round_bit_for_bit() -> None:
    rng = np.random.default_rng()
    grid = 2.0**-22
    scores = np.concatenate([rng.laplace(size=5000) * 1e-3, (np.arange(-8, 8) + 0.5) * grid])
    expected = np.round(scores / grid) * grid
    assert round_to_grid(scores, grid).view(np.int64).tolist() == expected.view(np.int64).tolist()
