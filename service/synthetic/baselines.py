"""The evaluation's floors, both edge-level pure eps-DP, their releases drawn by the exact
sampler (:mod:`service.synthetic.noise`; ``noise`` draws them, ``rng`` the graph):

- ``chung_lu``: the degree release d + Lap(2 / eps) (as the service's degree release), clipped
  at 0, as Chung-Lu weights; |E| = half the sum of the released degrees. Post-processing of
  the degree release, so free where that release already exists.
- ``erdos_renyi``: |E| + Lap(1 / eps) uniformly placed edges.
"""

from __future__ import annotations

import numpy as np

from service.synthetic.noise import noisy_count, noisy_counts
from service.synthetic.sampling import chung_lu, erdos_renyi


def chung_lu_synthesize(
    indptr: np.ndarray,
    epsilon: float,
    rng: np.random.Generator,
    *,
    noise: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    released = noisy_counts(np.diff(indptr), 2.0 / epsilon, rng if noise is None else noise)
    weights = np.maximum(released, 0.0)
    return chung_lu(weights, round(weights.sum() / 2.0), rng)


def erdos_renyi_synthesize(
    indptr: np.ndarray,
    epsilon: float,
    rng: np.random.Generator,
    *,
    noise: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    n = int(indptr.size - 1)
    released = noisy_count(indptr[-1] / 2.0, 1.0 / epsilon, rng if noise is None else noise)
    return erdos_renyi(n, round(max(released, 0.0)), rng)
