"""A naive noisy diffusion in the style of the papers' public code: benchmark baseline only.

One float64 scipy sparse product per step over a freshly normalised matrix, and
``numpy.random.laplace`` noise at every step (no noise-free prefix, no caching). It uses the
same noise scale and the same two Laplace draws per node per step as the spec, so it releases
the same distribution as the all-steps mechanism; only its speed differs. Never served.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from service.graph.model import Graph
from service.privacy.modes import Mode


def naive_noisy_diffusion(
    graph: Graph,
    seed: int,
    *,
    beta: float,
    steps: int,
    eta: float,
    noise_scale: float,
    mode: Mode,
) -> np.ndarray:
    n = graph.n
    adjacency = sp.csr_matrix(
        (np.ones(graph.indices.shape[0], dtype=np.float64), graph.indices, graph.indptr),
        shape=(n, n),
    )
    degrees = np.asarray(adjacency.sum(axis=0)).ravel()
    inv = np.divide(1.0, degrees, out=np.zeros_like(degrees), where=degrees > 0)
    transition = adjacency @ sp.diags(inv)  # P = A D^-1
    keep = sp.diags((degrees == 0).astype(np.float64))
    walk = (sp.identity(n, format="csr") + transition + keep) * 0.5
    t = eta * degrees
    if mode is Mode.PERSONALIZED:
        t[seed] = 1.0
    x = np.zeros(n)
    x[seed] = 1.0
    first_noisy = 2 if mode is Mode.PERSONALIZED else 1
    for k in range(1, steps + 1):
        x = beta * (walk @ np.minimum(np.maximum(x, 0.0), t))
        x[seed] += 1.0 - beta
        if k >= first_noisy:
            x = x + np.random.laplace(0.0, noise_scale, n) + np.random.laplace(0.0, noise_scale, n)
    return x
