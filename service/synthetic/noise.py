"""The synthetic generators' Laplace releases, drawn by the project's exact sampler.

Every noisy number a generator releases about the graph is an integer count ``c`` (an edge,
triangle or in-block count, a degree, a node-by-group count) plus Laplace noise of scale
``b = Delta / eps`` (its sensitivity over its share of the budget). It is drawn as every count
release of the service is (docs/privacy.md, "The Laplace sampler and its stated delta"):
``c + g N``, ``N`` exact draws of ``round(L / gamma)``, ``L ~ Lap(1)``, ``gamma = g / b'``, from
:func:`service.mechanisms.exact_laplace.grid_laplace`, on the grid ``g = count_grid(b)`` (a power
of two at most 1, so ``c`` is a multiple of it) at the scale ``b' = dyadic_scale(b)``, ``b <= b'
< b (1 + 2^-19)``. So the released value has exactly the law of ``round_g(c + Lap(b'))``:
post-processing of the exact Laplace mechanism at ``b' >= b``, pure ``(Delta / b')``-DP, at most
the planned ``eps``, with delta 0. The generator's only randomness here is its raw 64-bit words
(``bit_generator.random_raw``): no floating-point sampler touches the graph's numbers.
"""

from __future__ import annotations

import numpy as np

from service.mechanisms.exact_laplace import grid_laplace
from service.mechanisms.postprocess import count_grid

__all__ = ["noisy_count", "noisy_counts"]


def noisy_counts(counts: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """``counts`` (integers, any shape) plus exact grid Laplace noise of scale ``scale``."""
    values = np.asarray(counts, dtype=np.float64)
    noise = grid_laplace(rng, float(scale), count_grid(float(scale)), count=int(values.size))
    released: np.ndarray = values + noise.reshape(values.shape)
    return released


def noisy_count(count: float, scale: float, rng: np.random.Generator) -> float:
    """One integer ``count`` plus exact grid Laplace noise of scale ``scale``."""
    return float(noisy_counts(np.array([count]), scale, rng)[0])
