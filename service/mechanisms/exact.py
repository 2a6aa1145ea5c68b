"""Exact (noise-free, threshold-free) personalized PageRank: the evaluation's ground truth.

The target of the spec's diffusion without thresholds and noise is the fixed point of

    x = (1 - beta) e_s + beta W x,      W = (I + A D^-1) / 2,

with a node of degree 0 keeping its mass (W e_i = e_i), i.e. x = (1 - beta)(I - beta W)^-1 e_s.
W is column-stochastic, so the map is a beta-contraction in the L1 norm and power iteration
converges from any start; the iterate x_{k+1} is within beta / (1 - beta) ||x_{k+1} - x_k||_1 of
the fixed point, which is the stopping rule. Evaluation only: never served (no privacy).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from service.errors import InvalidParameter, ServiceError
from service.graph.model import Graph

__all__ = ["DEFAULT_MAX_ITER", "NotConvergedError", "exact_ppr", "ppr_from_adjacency"]

#: Iteration cap of the power iteration (beta = 0.8 needs ~125 steps for tol = 1e-12).
DEFAULT_MAX_ITER = 100_000


class NotConvergedError(ServiceError):
    """The power iteration did not reach the requested tolerance within its iteration cap."""

    code = "not_converged"
    status = 500


def _check(beta: float, tol: float, max_iter: int) -> None:
    if not (isinstance(beta, int | float) and math.isfinite(beta) and 0.0 < beta < 1.0):
        raise InvalidParameter("beta", f"must be in (0, 1), got {beta!r}")
    if not (isinstance(tol, int | float) and tol > 0 and math.isfinite(tol)):
        raise InvalidParameter("tol", f"must be a positive number, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise InvalidParameter("max_iter", f"must be an integer >= 1, got {max_iter!r}")


def ppr_from_adjacency(
    adjacency: sp.csr_matrix | sp.csr_array,
    seed: int,
    beta: float,
    tol: float = 1e-12,
    max_iter: int = DEFAULT_MAX_ITER,
) -> np.ndarray:
    """Exact PPR of ``seed`` on a symmetric 0/1 adjacency matrix (float64 power iteration).

    Returns x with ||x - x*||_1 <= tol, x >= 0, sum(x) = 1 (up to rounding).
    """
    _check(beta, tol, max_iter)
    n = int(adjacency.shape[0])
    if adjacency.shape != (n, n):
        raise InvalidParameter("adjacency", f"must be square, got shape {adjacency.shape}")
    if not 0 <= seed < n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {n})")
    matrix = sp.csr_matrix(adjacency, dtype=np.float64)
    degrees = np.asarray(matrix.sum(axis=0)).ravel()
    inv_degree = np.divide(1.0, degrees, out=np.zeros(n), where=degrees > 0)
    isolated = degrees == 0
    teleport = np.zeros(n)
    teleport[seed] = 1.0 - beta
    # Stop once beta / (1 - beta) * ||x_{k+1} - x_k||_1 <= tol (a bound on the true error).
    step_tol = tol * (1.0 - beta) / beta
    x = np.zeros(n)
    x[seed] = 1.0
    for _ in range(max_iter):
        walked = np.asarray(matrix @ (x * inv_degree), dtype=np.float64).reshape(n)
        walked += x
        walked[isolated] += x[isolated]
        walked *= 0.5 * beta
        walked += teleport
        change = float(np.abs(walked - x).sum())
        x = walked
        if change <= step_tol:
            return x
    raise NotConvergedError(
        f"power iteration did not reach tol={tol:g} in {max_iter} iterations (beta={beta})"
    )


def exact_ppr(
    graph: Graph,
    seed: int,
    beta: float,
    tol: float = 1e-12,
    max_iter: int = DEFAULT_MAX_ITER,
) -> np.ndarray:
    """(1 - beta)(I - beta W)^-1 e_s on ``graph`` to L1 accuracy ``tol``; ``seed`` is an index."""
    return ppr_from_adjacency(graph.adjacency, seed, beta, tol, max_iter)
