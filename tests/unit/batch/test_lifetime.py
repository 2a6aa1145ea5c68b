"""``die_with_driver``: a pool process ends once its driver is gone, although the driver is not
its parent (pool processes are forked by the driver's fork server), by the pidfd watch and by
the polling fallback, and at once when the driver is already gone."""

from __future__ import annotations

import multiprocessing
import subprocess
import time

import pytest

from service.batch import lifetime

# it mostly waits (3.2 s, 0.2 CPU-s in a run of the suite): scheduled apart, conftest.py
pytestmark = pytest.mark.waits

FORK = multiprocessing.get_context("fork")


def _pool_process(driver_pid: int) -> None:
    """A pool process stand-in: it watches the driver, then idles (exit 0 if never ended)."""
    lifetime.die_with_driver(driver_pid)
    time.sleep(60)


@pytest.mark.parametrize("how", ["pidfd", "poll"])
def test_a_pool_process_that_is_not_the_drivers_child_ends_when_the_driver_dies(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "poll":  # as where pidfds do not exist
        monkeypatch.setattr(lifetime, "_watch_by_pidfd", lambda pid: False)
    driver = subprocess.Popen(["sleep", "120"])  # a sibling, not the pool process's parent
    pool_process = FORK.Process(target=_pool_process, args=(driver.pid,))
    pool_process.start()
    try:
        time.sleep(3 * lifetime.DRIVER_POLL_SECONDS)
        assert pool_process.is_alive(), "it ended while its driver was alive"
        driver.kill()
        driver.wait()
        pool_process.join(timeout=30)
        assert pool_process.exitcode == 1
    finally:
        driver.kill()
        driver.wait()
        if pool_process.is_alive():
            pool_process.kill()
            pool_process.join()


def test_a_pool_process_whose_driver_is_already_gone_ends_at_once() -> None:
    driver = subprocess.Popen(["true"])
    driver.wait()
    pool_process = FORK.Process(target=_pool_process, args=(driver.pid,))
    pool_process.start()
    pool_process.join(timeout=30)
    try:
        assert pool_process.exitcode == 1
    finally:
        if pool_process.is_alive():
            pool_process.kill()
            pool_process.join()
