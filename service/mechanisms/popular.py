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
from service.mechanisms.randomness import fresh_generator, laplace_noise, rounded_noise
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
    """d + Lap(plan.scale)^n. ``rng`` defaults to a fresh OS-entropy generator. With ``grid``
    (a power of two), the noise is rounded to it before the exact addition of the degrees
    (docs/privacy.md, "The Laplace sampler and its stated delta")."""
    if plan.sensitivity < DEGREE_SENSITIVITY:
        raise InvalidParameter(
            "sensitivity", f"the degree vector has sensitivity {DEGREE_SENSITIVITY}"
        )
    rng = rng if rng is not None else fresh_generator()
    released: np.ndarray = graph.degrees.astype(np.float64) + rounded_noise(
        laplace_noise(rng, plan.scale, graph.n), grid
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
