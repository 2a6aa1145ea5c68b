"""The noisy diffusion's noise on its state grid (docs/privacy.md, "The diffusion on a grid").

A noisy step of a column takes the kernel's ``phi(f(x))``, clamps it to ``[-INPUT_CLAMP,
INPUT_CLAMP]``, rounds it to the nearest multiple of the column's grid ``g``, adds ``g`` times the
integer noise ``M`` and clamps the result to ``[-STATE_CLAMP, STATE_CLAMP]``. ``M`` is a vector of
n exact draws of ``round((L1 + L2) / gamma)``, L1, L2 independent Lap(1): the spec's two noise
vectors ``xi1 + xi2`` drawn as their sum's law, one draw a node, and rounded once
(:func:`service.mechanisms.exact_laplace.rounded_laplace_pair_sum`'s law), from the query's
SFC64 word stream (:mod:`service.mechanisms.word_stream`, seeded by its generator) through
:func:`service.mechanisms.exact_laplace.pair_sum_from_stream` (or, for several columns of one
plan at once, :func:`service.mechanisms.exact_laplace.pair_sums_from_streams`: the same draws
in one compiled call). The compiled step kernel
does this in its pass over the rows (``service.mechanisms.kernels``); :func:`grid_step` is the
same arithmetic in numpy, for the path without numba and for the tests.
"""

from __future__ import annotations

import numpy as np

from service.mechanisms.exact_laplace import pair_sum_from_stream, pair_sums_from_streams
from service.privacy.state_grid import INPUT_CLAMP, NOISE_SATURATION, StepNoise

__all__ = ["draw_pair_noise", "draw_pair_noises", "grid_step"]


def draw_pair_noise(stream: np.ndarray, plan: StepNoise, n: int, out: np.ndarray) -> None:
    """``out[:n] = M`` (int64) for one noisy step of one column: n exact draws of the pair sum
    ``round((L1 + L2) / gamma)`` from the column's word stream ``stream`` (advanced past the
    words read), each saturated at +-NOISE_SATURATION grid units (see
    :data:`service.privacy.state_grid.NOISE_SATURATION`)."""
    pair_sum_from_stream(stream, plan.s, plan.t, out[:n], NOISE_SATURATION)


def draw_pair_noises(
    streams: np.ndarray, plan: StepNoise, out: np.ndarray, rows: np.ndarray
) -> None:
    """:func:`draw_pair_noise` for several columns of one plan: ``out[rows[c]]`` = column c's
    draws from its stream ``streams[c]`` (rows of 4 uint64 words, each advanced as
    :func:`draw_pair_noise` advances it), one draw for each of ``out``'s columns (the nodes)."""
    pair_sums_from_streams(streams, plan.s, plan.t, out, rows, NOISE_SATURATION)


def grid_step(values: np.ndarray, noise: np.ndarray, grid: float, limit: int) -> np.ndarray:
    """One column's grid step: ``clip(round(clip(values, +-INPUT_CLAMP) / g) + noise,
    +-limit) * g``, as the compiled kernel computes it."""
    clamped = np.clip(np.asarray(values, dtype=np.float64), -INPUT_CLAMP, INPUT_CLAMP)
    units = np.rint(clamped / grid).astype(np.int64) + np.asarray(noise, dtype=np.int64)
    np.clip(units, -limit, limit, out=units)
    out: np.ndarray = units.astype(np.float64) * grid
    return out
