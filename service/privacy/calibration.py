"""Calibration: the noise scale for a target (epsilon, delta), and how many steps carry noise.

By scale invariance the diffusion's guarantee depends on eta and b only through c = b / eta,
so ``calibrate`` finds c once per (epsilon, delta, K, beta, mode) and caches it; the noise scale
for any eta is then ``b = eta * c``. c is found by bisection on the monotone map c -> epsilon
and rounded UP (never down) to six significant digits, so the released guarantee is never
weaker than the target.

The number L of noisy steps is the smallest L whose curve (noise only in the last L steps)
equals the all-steps curve at every order and at infinity (relative difference <= 1e-9):
the guarantee is identical and the work is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.errors import InvalidParameter
from service.privacy.accountant import RdpCurve
from service.privacy.curves import diffusion_rdp, min_noise_free_steps
from service.privacy.modes import Mode

#: Two curves are "the same guarantee" within this relative difference at every order.
CURVE_MATCH_RTOL = 1e-9
#: c is rounded up to this many significant digits.
SIGNIFICANT_DIGITS = 6
#: Largest number of diffusion steps the service accepts (bounds work and memory).
MAX_STEPS = 10_000


@dataclass(frozen=True)
class DiffusionConfig:
    """Everything the noisy diffusion needs to run: its privacy follows from these alone."""

    mode: Mode
    beta: float
    steps: int
    eta: float
    noise_scale: float
    noisy_steps: int

    @property
    def noise_free_steps(self) -> int:
        return self.steps - self.noisy_steps


@dataclass(frozen=True)
class Calibration:
    """Scale-free result of calibration: c = b / eta, L, the curve, the epsilon achieved."""

    c: float
    noisy_steps: int
    curve: RdpCurve
    epsilon: float


@dataclass(frozen=True)
class DiffusionPlan:
    """A calibrated mechanism: its configuration, its RDP cost and the epsilon it achieves."""

    config: DiffusionConfig
    curve: RdpCurve
    epsilon: float
    delta: float


def validate_diffusion_parameters(
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    steps: int | None = None,
    beta: float | None = None,
    eta: float | None = None,
) -> None:
    """Raise :class:`InvalidParameter` naming the first parameter outside its range."""

    def finite(name: str, value: float) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidParameter(name, f"must be a finite number, got {value!r}")

    if epsilon is not None:
        finite("epsilon", epsilon)
        if epsilon <= 0:
            raise InvalidParameter("epsilon", f"must be > 0, got {epsilon}")
    if delta is not None:
        finite("delta", delta)
        if not 0.0 < delta < 1.0:
            raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise InvalidParameter("steps", f"must be an integer, got {steps!r}")
        if not 1 <= steps <= MAX_STEPS:
            raise InvalidParameter("steps", f"must be in [1, {MAX_STEPS}], got {steps}")
    if beta is not None:
        finite("beta", beta)
        if not 0.0 < beta < 1.0:
            raise InvalidParameter("beta", f"must be in (0, 1), got {beta}")
    if eta is not None:
        finite("eta", eta)
        if eta <= 0:
            raise InvalidParameter("eta", f"must be > 0, got {eta}")


def _round_up(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    exponent = math.floor(math.log10(value)) - (digits - 1)
    quantum = 10.0**exponent
    rounded = float(f"{math.ceil(value / quantum - 1e-9)}e{exponent}")
    # Guard against the float product landing a hair below value.
    while rounded < value:
        rounded = math.nextafter(rounded, math.inf)
    return rounded


def _epsilon_at(c: float, delta: float, steps: int, beta: float, mode: Mode) -> float:
    rdp, pure = diffusion_rdp(c, steps, beta, mode)
    return RdpCurve(rdp, pure).epsilon(delta)


def _curves_match(a: tuple[np.ndarray, float], b: tuple[np.ndarray, float]) -> bool:
    (rdp_a, pure_a), (rdp_b, pure_b) = a, b
    scale = np.maximum(np.abs(rdp_b), np.finfo(float).tiny)
    if np.any(np.abs(rdp_a - rdp_b) > CURVE_MATCH_RTOL * scale):
        return False
    return abs(pure_a - pure_b) <= CURVE_MATCH_RTOL * max(abs(pure_b), np.finfo(float).tiny)


def choose_noisy_steps(c: float, steps: int, beta: float, mode: Mode) -> int:
    """Smallest L whose curve (noise in the last L steps only) equals the all-steps curve."""
    low = min_noise_free_steps(mode)
    if mode is Mode.PERSONALIZED and steps == 1:
        return 0
    full = diffusion_rdp(c, steps, beta, mode)
    for noisy in range(1, steps - low + 1):
        if _curves_match(diffusion_rdp(c, steps, beta, mode, steps - noisy), full):
            return noisy
    return steps - low  # the all-steps mechanism itself


@lru_cache(maxsize=4096)
def calibrate(epsilon: float, delta: float, steps: int, beta: float, mode: Mode) -> Calibration:
    """Smallest c = b/eta (rounded up) whose curve converts to <= epsilon at delta. Cached."""
    validate_diffusion_parameters(epsilon=epsilon, delta=delta, steps=steps, beta=beta)
    mode = Mode(mode)
    if mode is Mode.PERSONALIZED and steps == 1:
        # One step uses only the seed's own edges: no noise, no privacy cost.
        return Calibration(c=math.inf, noisy_steps=0, curve=RdpCurve.zero(), epsilon=0.0)

    # The pure value is linear in 1/c, and conversion never exceeds it: an upper bracket.
    _, pure_at_one = diffusion_rdp(1.0, steps, beta, mode)
    hi = pure_at_one / epsilon
    lo = hi
    while _epsilon_at(lo, delta, steps, beta, mode) <= epsilon:
        lo /= 2.0
    # Bisection in log space: eps(c) is non-increasing in c.
    for _ in range(200):
        if hi / lo - 1.0 < 1e-10:
            break
        mid = math.sqrt(lo * hi)
        if _epsilon_at(mid, delta, steps, beta, mode) <= epsilon:
            hi = mid
        else:
            lo = mid
    c = _round_up(hi)
    rdp, pure = diffusion_rdp(c, steps, beta, mode)
    curve = RdpCurve(rdp, pure)
    achieved = curve.epsilon(delta)
    if achieved > epsilon:  # pragma: no cover - monotonicity makes this unreachable
        raise AssertionError(f"calibration overshot: {achieved} > {epsilon}")
    return Calibration(
        c=c, noisy_steps=choose_noisy_steps(c, steps, beta, mode), curve=curve, epsilon=achieved
    )


def calibration_at(
    c: float, epsilon: float, delta: float, steps: int, beta: float, mode: Mode
) -> Calibration | None:
    """The calibration a given c yields (e.g. one shared by another process), or None when c
    does not meet ``epsilon`` at ``delta``: a value that would under-noise is never used."""
    mode = Mode(mode)
    if mode is Mode.PERSONALIZED and steps == 1:
        return calibrate(epsilon, delta, steps, beta, mode)
    if not (math.isfinite(c) and c > 0):
        return None
    rdp, pure = diffusion_rdp(c, steps, beta, mode)
    curve = RdpCurve(rdp, pure)
    achieved = curve.epsilon(delta)
    if not achieved <= epsilon:
        return None
    return Calibration(
        c=c, noisy_steps=choose_noisy_steps(c, steps, beta, mode), curve=curve, epsilon=achieved
    )


def plan_diffusion(
    epsilon: float,
    delta: float,
    steps: int,
    beta: float,
    eta: float,
    mode: Mode | str,
    *,
    calibration: Calibration | None = None,
) -> DiffusionPlan:
    """Calibrate the noisy diffusion for a per-query target (epsilon, delta).

    ``calibration`` may carry a result found elsewhere (see :func:`calibration_at`); it must
    be for the same target, and its epsilon is checked against it.
    """
    validate_diffusion_parameters(epsilon=epsilon, delta=delta, steps=steps, beta=beta, eta=eta)
    mode = Mode(mode)
    cal = calibration or calibrate(float(epsilon), float(delta), int(steps), float(beta), mode)
    if cal.epsilon > epsilon:
        raise ValueError(f"calibration for epsilon {cal.epsilon} used for target {epsilon}")
    noise_scale = 0.0 if math.isinf(cal.c) else eta * cal.c
    config = DiffusionConfig(
        mode=mode, beta=float(beta), steps=int(steps), eta=float(eta),
        noise_scale=noise_scale, noisy_steps=cal.noisy_steps,
    )  # fmt: skip
    return DiffusionPlan(config=config, curve=cal.curve, epsilon=cal.epsilon, delta=float(delta))


def config_curve(config: DiffusionConfig) -> RdpCurve:
    """The RDP curve of an explicit configuration (noise scale and noisy steps as given)."""
    if config.mode is Mode.PERSONALIZED and config.steps == 1:
        return RdpCurve.zero()
    if config.noise_scale <= 0:
        raise InvalidParameter("noise_scale", "a noisy diffusion needs a positive noise scale")
    rdp, pure = diffusion_rdp(
        config.noise_scale / config.eta, config.steps, config.beta, config.mode,
        config.noise_free_steps,
    )  # fmt: skip
    return RdpCurve(rdp, pure)
