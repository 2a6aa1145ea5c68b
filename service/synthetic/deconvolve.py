"""The degree distribution behind a noisy degree vector (pure post-processing).

The released degrees are d_u + Lap(b) with b = 2 / eps_degrees known. Their empirical
distribution is the true degree distribution convolved with that Laplace law, so at eps 1 on a
sparse graph (b = 2.3 against true degrees mostly 1-5) it is far wider than the truth: taken as
they are, the noisy values put too many nodes at degree 1 and at degrees 6-9 (Cora: KS 0.13).

:func:`deconvolved_degrees` estimates the true distribution by nonparametric maximum likelihood
(EM over the integer degrees ``floor`` .. K from the noisy values' own histogram, the noise law
known, the noisy values binned, stopped early as smoothing), then
gives each node the quantile of that distribution at its rank among the noisy values: the
ordering of the nodes (all that link prediction reads) is the noisy release's, the distribution
is the deconvolved one. Nodes whose noisy value is far above the bulk (more than ``tail_scales``
noise scales above ``floor + tail_degrees``) keep their noisy value: there the noise is small
relative to the degree and the EM support would be needlessly wide.

Nothing here reads the graph: it is a function of the released vector and the public b.
"""

from __future__ import annotations

import math

import numpy as np

#: EM iterations from the noisy histogram. Early stopping is the smoothing: run to convergence,
#: the NPMLE concentrates on a few spikes and the degree KS distance grows again (measured on
#: Cora, docs/synthetic.md).
ITERATIONS = 100
#: Bin width of the noisy values, in noise scales.
BIN_SCALES = 0.125


def deconvolved_distribution(
    noisy: np.ndarray, scale: float, support: np.ndarray, iterations: int = ITERATIONS
) -> np.ndarray:
    """Weights over ``support`` (integers) maximising the likelihood of ``noisy`` under
    support + Lap(``scale``)."""
    width = BIN_SCALES * scale
    low = float(noisy.min())
    bins = np.floor((noisy - low) / width).astype(np.int64)
    counts = np.bincount(bins)
    centres = low + (np.arange(counts.size) + 0.5) * width
    keep = counts > 0
    counts, centres = counts[keep].astype(np.float64), centres[keep]
    density = np.exp(-np.abs(centres[:, None] - support[None, :]) / scale)  # bins x support
    # start from the noisy values' own histogram on the support (rounded, clipped): the EM then
    # only narrows it; a uniform start over a wide support (small eps) would leave mass far out
    start = np.clip(np.rint(noisy), support[0], support[-1]) - support[0]
    weights = np.bincount(start.astype(np.int64), minlength=support.size).astype(np.float64)
    weights = (weights + 1e-3) / (weights + 1e-3).sum()
    for _ in range(iterations):
        mixture = density @ weights
        weights = weights * (density.T @ (counts / np.maximum(mixture, 1e-300))) / counts.sum()
    out: np.ndarray = weights / weights.sum()
    return out


def deconvolved_degrees(
    noisy: np.ndarray,
    scale: float,
    floor: int,
    tail_degrees: int = 64,
    tail_scales: float = 20.0,
) -> np.ndarray:
    """Each node's degree: the deconvolved distribution's quantile at the node's rank among the
    noisy values (see the module docstring). Real-valued; the caller rescales and rounds."""
    noisy = np.asarray(noisy, dtype=np.float64)
    out = noisy.copy()
    threshold = floor + tail_degrees + tail_scales * scale
    bulk = np.flatnonzero(noisy <= threshold)
    if bulk.size > 0 and math.isfinite(scale) and scale > 0.0:
        out[bulk] = _rank_quantiles(noisy[bulk], scale, floor, threshold)
    clipped: np.ndarray = np.maximum(out, float(floor))
    return clipped


def _rank_quantiles(noisy: np.ndarray, scale: float, floor: int, threshold: float) -> np.ndarray:
    top = math.ceil(min(float(noisy.max()), threshold))
    support = np.arange(floor, max(top, floor) + 1, dtype=np.float64)
    weights = deconvolved_distribution(noisy, scale, support)
    ranks = np.argsort(np.argsort(noisy, kind="stable"), kind="stable")
    cumulative = np.cumsum(weights)
    cumulative[-1] = 1.0
    quantiles: np.ndarray = support[np.searchsorted(cumulative, (ranks + 0.5) / noisy.size)]
    return quantiles
