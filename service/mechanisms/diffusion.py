"""Noisy PPR diffusion (privacy-spec.md, Mechanism 1), in `personalized` and `edge` modes.

    f(x)   = min(max(x, 0), t),   t_i = eta d_i  (t_s = 1 in personalized mode)
    phi(x) = (1 - beta) e_s + beta W x
    x_k    = phi(f(x_{k-1}))                         for k = 1..m        (noise-free prefix)
    x_k    = phi(f(x_{k-1})) + xi1_k + xi2_k         for k = m+1..K      (L = K - m noisy steps)

with x_0 = e_s and xi1_k, xi2_k independent vectors of n i.i.d. Lap(b) draws (b is the SCALE).
In personalized mode m >= 1 (step 1 touches only the seed's own edges). Only x_K is released;
the prefix x_m is a deterministic function of (graph version, seed, mode, beta, eta, m), as
sensitive as the graph: it may be cached in protected memory, never returned or logged.
"""

from __future__ import annotations

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.engine import DiffusionJob, run_jobs
from service.mechanisms.randomness import fresh_generator
from service.privacy.calibration import DiffusionConfig, validate_diffusion_parameters
from service.privacy.curves import min_noise_free_steps
from service.privacy.modes import Mode

__all__ = ["DiffusionConfig", "noise_free_prefix", "noisy_diffusion", "thresholds"]


def thresholds(graph: Graph, seed: int, eta: float, mode: Mode) -> np.ndarray:
    """t = eta * d, with the seed unclipped (t_s = 1) in personalized mode."""
    t = eta * graph.degrees.astype(np.float64)
    if mode is Mode.PERSONALIZED:
        t[seed] = 1.0
    return t


def _check_seed(graph: Graph, seed: int) -> None:
    if not 0 <= seed < graph.n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {graph.n})")


def noise_free_prefix(
    graph: Graph, seed: int, mode: Mode, beta: float, eta: float, steps: int
) -> np.ndarray:
    """x_m after ``steps`` = m thresholded diffusion steps without noise (x_0 = e_s)."""
    validate_diffusion_parameters(beta=beta, eta=eta)
    _check_seed(graph, seed)
    if steps < 0:
        raise InvalidParameter("steps", f"a prefix has >= 0 steps, got {steps}")
    config = DiffusionConfig(
        mode=Mode(mode), beta=beta, steps=steps, eta=eta, noise_scale=0.0, noisy_steps=0
    )
    job = DiffusionJob(seed, config, rng=None, keep_prefix=False)
    run_jobs(graph, [job])
    x = np.array(job.future.result().scores, dtype=np.float64)
    x.setflags(write=False)
    return x


def _check_config(config: DiffusionConfig) -> None:
    validate_diffusion_parameters(steps=config.steps, beta=config.beta, eta=config.eta)
    low = min_noise_free_steps(config.mode)
    if config.mode is Mode.PERSONALIZED and config.steps == 1:
        if config.noisy_steps != 0:
            raise InvalidParameter("noisy_steps", "one personalized step is noise-free")
        return
    if not 1 <= config.noisy_steps <= config.steps - low:
        raise InvalidParameter(
            "noisy_steps", f"must be in [1, {config.steps - low}], got {config.noisy_steps}"
        )
    if not config.noise_scale > 0:
        raise InvalidParameter("noise_scale", f"must be > 0, got {config.noise_scale}")


def noisy_diffusion(
    graph: Graph,
    seed: int,
    config: DiffusionConfig,
    rng: np.random.Generator | None = None,
    prefix: np.ndarray | None = None,
) -> np.ndarray:
    """The released vector x_K. ``prefix`` (x_m for m = K - L) skips the noise-free steps.

    ``rng`` defaults to a generator freshly seeded from the OS entropy source; the serving
    path never passes one.
    """
    _check_config(config)
    _check_seed(graph, seed)
    m = config.noise_free_steps
    if prefix is None:
        prefix = noise_free_prefix(graph, seed, config.mode, config.beta, config.eta, m)
    elif prefix.shape != (graph.n,):
        raise InvalidParameter("prefix", f"expected shape ({graph.n},), got {prefix.shape}")
    if config.noisy_steps == 0:
        return np.array(prefix, dtype=np.float64)
    job = DiffusionJob(
        seed, config, rng if rng is not None else fresh_generator(), prefix, keep_prefix=False
    )
    run_jobs(graph, [job])
    return job.future.result().scores
