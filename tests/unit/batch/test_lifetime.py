"""``die_with_driver``: a pool process ends once its driver is gone, although the driver is not
its parent (pool processes are forked by the driver's fork server), by the pidfd watch and by
the polling fallback, and at once when the driver is already gone."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

#: A pool process stand-in: it watches the given driver pid, then idles.
WATCHER = """
import sys, time
from service.batch import lifetime
if sys.argv[2] == "poll":
    lifetime._watch_by_pidfd = lambda pid: False
lifetime.die_with_driver(int(sys.argv[1]))
print("watching", flush=True)
time.sleep(120)
"""


def _watcher(driver_pid: int, how: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(driver_pid), how], stdout=subprocess.PIPE, text=True
    )
    return process


@pytest.mark.parametrize("how", ["pidfd", "poll"])
def test_a_watcher_that_is_not_the_drivers_child_ends_when_the_driver_dies(how: str) -> None:
    driver = subprocess.Popen(["sleep", "120"])  # a sibling, not the watcher's parent
    watcher = _watcher(driver.pid, how)
    try:
        assert watcher.stdout is not None and watcher.stdout.readline() == "watching\n"
        time.sleep(0.2)
        assert watcher.poll() is None, "the watcher ended while its driver was alive"
        driver.kill()
        driver.wait()
        assert watcher.wait(timeout=30) == 1
    finally:
        for process in (driver, watcher):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_watcher_whose_driver_is_already_gone_ends_at_once() -> None:
    driver = subprocess.Popen(["true"])
    driver.wait()
    watcher = _watcher(driver.pid, "pidfd")
    try:
        assert watcher.wait(timeout=30) == 1
        assert watcher.stdout is not None and watcher.stdout.read() == ""
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
