"""Calibrated plans for queries, shared across workers through the calibration cache.

A calibration takes tens of milliseconds the first time a process sees a target; the shared
cache lets one worker's result serve the others. A shared value is an input to verify, never
to trust: it is used only if its own curve meets the target (:func:`calibration_at`), so a
corrupt or poisoned cache can cost time but never privacy.
"""

from __future__ import annotations

import threading

from service.cache.caches import CalibrationCache, CalibrationKey
from service.privacy.calibration import (
    Calibration,
    DiffusionPlan,
    calibrate,
    calibration_at,
    plan_diffusion,
    validate_diffusion_parameters,
)
from service.privacy.modes import Mode

_MAX_LOCAL = 4096


class DiffusionPlanner:
    def __init__(self, shared: CalibrationCache | None = None) -> None:
        self._shared = shared
        self._local: dict[tuple[float, float, int, float, Mode], Calibration] = {}
        self._lock = threading.Lock()

    def plan(
        self, epsilon: float, delta: float, steps: int, beta: float, eta: float, mode: Mode
    ) -> DiffusionPlan:
        validate_diffusion_parameters(epsilon=epsilon, delta=delta, steps=steps, beta=beta, eta=eta)
        key = (float(epsilon), float(delta), int(steps), float(beta), Mode(mode))
        cal = self._local.get(key)
        if cal is None:
            cal = self._calibrate(*key)
            with self._lock:
                if len(self._local) >= _MAX_LOCAL:
                    self._local.clear()
                self._local[key] = cal
        return plan_diffusion(epsilon, delta, steps, beta, eta, mode, calibration=cal)

    def _calibrate(
        self, epsilon: float, delta: float, steps: int, beta: float, mode: Mode
    ) -> Calibration:
        if self._shared is None:
            return calibrate(epsilon, delta, steps, beta, mode)
        verified: dict[float, Calibration] = {}

        def verify(c: float) -> bool:
            cal = calibration_at(c, epsilon, delta, steps, beta, mode)
            if cal is not None:
                verified[c] = cal
            return cal is not None

        c = self._shared.get_or_compute(
            CalibrationKey(mode.value, beta, steps, epsilon, delta),
            compute=lambda: calibrate(epsilon, delta, steps, beta, mode).c,
            verify=verify,
        )
        return verified.get(c) or calibrate(epsilon, delta, steps, beta, mode)
