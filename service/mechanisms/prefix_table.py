"""Every seed's noise-free prefix x_m of one graph, computed by the engine's own block kernel.

Row s of the table is x_m of seed s for one (mode, beta, eta, m): the first m = K - L steps of
a query, which carry no noise and depend only on the graph and these parameters. The rows are
computed ``block`` seeds at a time as columns of the engine's block (:func:`run_jobs` with no
generator), so each row is, bit for bit, the vector :func:`noise_free_prefix` returns (every
column of a block is the same sequential float64 sum in CSR order, whatever the block's
width). Nothing here draws noise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.graph.model import Graph
from service.mechanisms.engine import DiffusionJob, run_jobs
from service.privacy.calibration import DiffusionConfig, validate_diffusion_parameters
from service.privacy.modes import Mode

#: Seeds computed together (the engine's default ``PPR_ENGINE_MAX_BATCH``).
BLOCK = 64


def prefix_config(mode: Mode, beta: float, eta: float, m: int) -> DiffusionConfig:
    """The noise-free diffusion of m steps that yields x_m."""
    return DiffusionConfig(
        mode=Mode(mode), beta=beta, steps=m, eta=eta, noise_scale=0.0, noisy_steps=0
    )


def fill_prefix_table(
    graph: Graph,
    mode: Mode,
    beta: float,
    eta: float,
    m: int,
    out: np.ndarray,
    *,
    seeds: range | None = None,
    block: int = BLOCK,
    after_block: Callable[[int], None] | None = None,
) -> None:
    """Write x_m of every seed into ``out`` (row i = the i-th of ``seeds``, all seeds in
    order by default), ``block`` seeds at a time. ``after_block(done)`` is called after each
    block with the number of rows written (e.g. to stop early by raising)."""
    validate_diffusion_parameters(beta=beta, eta=eta)
    seeds = range(graph.n) if seeds is None else seeds
    if out.shape != (len(seeds), graph.n):
        raise ValueError(f"out must be {len(seeds)} x {graph.n}, got {out.shape}")
    if m < 1:
        raise ValueError("a prefix table has m >= 1 noise-free steps")
    if seeds and not 0 <= min(seeds) <= max(seeds) < graph.n:
        raise ValueError("seeds must be nodes of the graph")
    config = prefix_config(mode, beta, eta, m)
    for start in range(0, len(seeds), block):
        jobs = [
            DiffusionJob(seed, config, rng=None, keep_prefix=False)
            for seed in seeds[start : start + block]
        ]
        run_jobs(graph, jobs)
        for row, job in enumerate(jobs, start):
            out[row] = job.future.result().scores
        if after_block is not None:
            after_block(start + len(jobs))


def prefix_table(
    graph: Graph, mode: Mode, beta: float, eta: float, m: int, seeds: range | None = None
) -> np.ndarray:
    """The rows of ``seeds`` (default: the whole table) in process memory (for tests and
    small graphs)."""
    seeds = range(graph.n) if seeds is None else seeds
    out = np.empty((len(seeds), graph.n), dtype=np.float64)
    fill_prefix_table(graph, mode, beta, eta, m, out, seeds=seeds)
    return out
