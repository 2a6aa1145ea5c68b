"""Calibrations shared across workers are verified before use: a poisoned cache costs time,
never privacy."""

from __future__ import annotations

import pytest

from service.cache.byte_stores import MemoryStore
from service.cache.caches import CalibrationCache, CalibrationKey
from service.privacy.calibration import calibrate, calibration_at, plan_diffusion
from service.privacy.modes import Mode
from service.serving.planner import DiffusionPlanner

TARGET = (0.1, 1e-6, 40, 0.8)


def test_plans_equal_the_direct_calibration() -> None:
    planner = DiffusionPlanner(CalibrationCache(MemoryStore(1 << 20)))
    for mode in Mode:
        plan = planner.plan(*TARGET, 1e-7, mode)
        assert plan == plan_diffusion(*TARGET, 1e-7, mode)


def test_a_second_worker_reuses_the_shared_value() -> None:
    store = MemoryStore(1 << 20)
    first = DiffusionPlanner(CalibrationCache(store)).plan(*TARGET, 1e-7, Mode.EDGE)
    shared = CalibrationCache(store)
    second = DiffusionPlanner(shared).plan(*TARGET, 2e-7, Mode.EDGE)
    assert shared.stats()["hits"] == 1
    assert second.config.noise_scale == pytest.approx(2 * first.config.noise_scale)
    assert second.curve == first.curve


@pytest.mark.parametrize("poison", ["0.5", "1e-300", "nan", "-3", "garbage", "inf"])
def test_a_poisoned_value_is_discarded(poison: str) -> None:
    store = MemoryStore(1 << 20)
    key = CalibrationKey(Mode.PERSONALIZED.value, 0.8, 40, 0.1, 1e-6)
    store.set(key.encode(), poison.encode())
    cache = CalibrationCache(store)
    plan = DiffusionPlanner(cache).plan(*TARGET, 1e-7, Mode.PERSONALIZED)
    honest = calibrate(*TARGET, Mode.PERSONALIZED)
    assert plan.config.noise_scale == pytest.approx(1e-7 * honest.c)
    assert plan.epsilon <= 0.1
    assert store.get(key.encode()) == repr(honest.c).encode()  # overwritten with the truth


def test_calibration_at_refuses_under_noise() -> None:
    honest = calibrate(*TARGET, Mode.EDGE)
    assert calibration_at(honest.c, *TARGET, Mode.EDGE) == honest
    assert calibration_at(honest.c * 0.99, *TARGET, Mode.EDGE) is None
    bigger = calibration_at(honest.c * 2, *TARGET, Mode.EDGE)
    assert bigger is not None and bigger.epsilon < honest.epsilon
