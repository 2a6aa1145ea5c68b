"""The evaluation's floors, both edge-level pure eps-DP:

- ``chung_lu``: the service's degree release d + Lap(2 / eps), clipped at 0, as Chung-Lu
  weights; |E| = half the sum of the released degrees. Post-processing of the degree release,
  so free where that release already exists.
- ``erdos_renyi``: |E| + Lap(1 / eps) uniformly placed edges.
"""

from __future__ import annotations

import numpy as np

from service.synthetic.sampling import chung_lu, erdos_renyi


def chung_lu_synthesize(
    indptr: np.ndarray, epsilon: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    n = int(indptr.size - 1)
    released = np.diff(indptr) + rng.laplace(0.0, 2.0 / epsilon, n)
    weights = np.maximum(released, 0.0)
    return chung_lu(weights, round(weights.sum() / 2.0), rng)


def erdos_renyi_synthesize(
    indptr: np.ndarray, epsilon: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    n = int(indptr.size - 1)
    released = (indptr[-1] / 2.0) + rng.laplace(0.0, 1.0 / epsilon)
    return erdos_renyi(n, round(max(released, 0.0)), rng)
