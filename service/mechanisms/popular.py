"""``popular``: the degree vector plus Laplace noise, one release per graph version.

    d~ = d + Lap(b)^n,   b = 2 / eps_d   (rounded up; privacy/laplace.py)

One edge changes exactly two degrees by 1, so the l1 sensitivity is 2 and the release is pure
eps_d-DP in both privacy models. It is released once per graph version and shared by every
query on that version: its cost belongs to the graph-wide exposure, not to any account
(docs/ranking.md). Ranking every seed's candidates by d~ is post-processing.

The noisy vector is stored as bytes (:func:`degrees_to_bytes`) so that every worker process
serves the same single release.
"""

from __future__ import annotations

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.exact_laplace import grid_laplace
from service.mechanisms.postprocess import checked_count_grid
from service.mechanisms.randomness import fresh_generator
from service.privacy.laplace import DEGREE_SENSITIVITY, LaplacePlan

__all__ = ["degrees_from_bytes", "degrees_to_bytes", "noisy_degrees"]

_DTYPE = np.dtype("<f8")


def noisy_degrees(
    graph: Graph,
    plan: LaplacePlan,
    rng: np.random.Generator | None = None,
    *,
    grid: float | None = None,
) -> np.ndarray:
    """d + g N: exactly round_g(d + Lap(b')^n) with b' = dyadic_scale(plan.scale) >=
    plan.scale, N drawn by the exact sampler (:func:`service.mechanisms.exact_laplace.
    grid_laplace`; docs/privacy.md, "The Laplace sampler and its stated delta"). ``grid`` is a
    power of two at most 1 (default :func:`count_grid` of the scale); ``rng`` defaults to a
    fresh OS-entropy generator."""
    if plan.sensitivity < DEGREE_SENSITIVITY:
        raise InvalidParameter(
            "sensitivity", f"the degree vector has sensitivity {DEGREE_SENSITIVITY}"
        )
    rng = rng if rng is not None else fresh_generator()
    grid = checked_count_grid(grid, plan.scale)
    released: np.ndarray = graph.degrees.astype(np.float64) + grid_laplace(
        rng, plan.scale, grid, count=graph.n
    )
    released.setflags(write=False)
    return released


def degrees_to_bytes(released: np.ndarray) -> bytes:
    """Little-endian float64 bytes of a released degree vector."""
    return np.ascontiguousarray(released, dtype=_DTYPE).tobytes()


def degrees_from_bytes(payload: bytes, n: int) -> np.ndarray:
    """The released vector back from :func:`degrees_to_bytes` (read-only); checks its length."""
    if len(payload) != n * _DTYPE.itemsize:
        raise ValueError(f"a stored degree release has {len(payload)} bytes, expected {8 * n}")
    released = np.frombuffer(payload, dtype=_DTYPE).astype(np.float64)
    released.setflags(write=False)
    return released
