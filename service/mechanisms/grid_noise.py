"""The noisy diffusion's noise on its state grid (docs/privacy.md, "The diffusion on a grid").

A noisy step of a column takes the kernel's ``phi(f(x))``, clamps it to ``[-INPUT_CLAMP,
INPUT_CLAMP]``, rounds it to the nearest multiple of the column's grid ``g``, adds ``g`` times the
integer noise ``N1 + N2`` (two vectors of n exact draws of ``round(L / gamma)``, L ~ Lap(1),
from :func:`service.mechanisms.exact_laplace.rounded_laplace`) and clamps the result to
``[-STATE_CLAMP, STATE_CLAMP]``. The compiled step kernel does this in its pass over the rows
(``service.mechanisms.kernels``); :func:`grid_step` is the same arithmetic in numpy, for the
path without numba and for the tests.
"""

from __future__ import annotations

import numpy as np

from service.mechanisms.exact_laplace import rounded_laplace
from service.mechanisms.exact_words import jit
from service.privacy.state_grid import INPUT_CLAMP, NOISE_SATURATION, StepNoise

__all__ = ["draw_pair_noise", "grid_step", "saturated_pair_sum"]


def draw_pair_noise(rng: np.random.Generator, plan: StepNoise, n: int, out: np.ndarray) -> None:
    """``out[:] = N1 + N2`` (int64) for one noisy step of one column: 2n exact draws from
    ``rng`` (N1 the first n, N2 the next n), each saturated at +-NOISE_SATURATION grid units
    (see :data:`service.privacy.state_grid.NOISE_SATURATION`)."""
    draws = rounded_laplace(rng, plan.s, plan.t, 2 * n)
    saturated_pair_sum(draws, np.int64(NOISE_SATURATION), out)


@jit
def saturated_pair_sum(
    draws: np.ndarray, bound: np.int64, out: np.ndarray
) -> None:  # pragma: no cover
    """``out[i] = clip(draws[i], +-bound) + clip(draws[n + i], +-bound)``, n = ``out``'s
    length (``draws`` holds 2n): numpy's clip and add in one pass."""
    n = out.shape[0]
    for i in range(n):
        first = min(max(draws[i], -bound), bound)
        second = min(max(draws[n + i], -bound), bound)
        out[i] = first + second


def grid_step(values: np.ndarray, noise: np.ndarray, grid: float, limit: int) -> np.ndarray:
    """One column's grid step: ``clip(round(clip(values, +-INPUT_CLAMP) / g) + noise,
    +-limit) * g``, as the compiled kernel computes it."""
    clamped = np.clip(np.asarray(values, dtype=np.float64), -INPUT_CLAMP, INPUT_CLAMP)
    units = np.rint(clamped / grid).astype(np.int64) + np.asarray(noise, dtype=np.int64)
    np.clip(units, -limit, limit, out=units)
    out: np.ndarray = units.astype(np.float64) * grid
    return out
