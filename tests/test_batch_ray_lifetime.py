"""``batch --engine ray`` when its driver or a part of Ray goes away: a SIGKILLed driver's local
Ray instance and its tasks stop (no more charges), and a lost raylet ends the run with one line
naming it and a non-zero exit. Each test runs its own driver, which starts its own local Ray
instance (never another test's)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.batch_support import migrated, run_charges
from tests.test_batch_lifetime import (
    BLOCK,
    _alive,
    _seeds,
    _start_driver,
    _tmp_outputs,
    _wait_for,
    driver_cleanup,
)

pytest.importorskip("ray")

__all__ = ["driver_cleanup"]  # the fixture, used by name


def _descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``, with its command line."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("PPid:"):
                parents[int(entry.name)] = int(line.split()[1])
        commands[int(entry.name)] = command
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = commands.get(child, "")
                frontier.append(child)
    return found


#: Seeds of the SIGKILL run: many more blocks than the two Ray runs at once, so tasks that went
#: on without their driver would charge far more than the blocks in flight at the kill.
RAY_SEEDS = 6 * BLOCK


def _ray_driver(
    url: str, tmp_path: Path, run_id: str, seeds: int | None = None
) -> subprocess.Popen[bytes]:
    path = _seeds(tmp_path)
    if seeds is not None:
        path.write_text("".join(f"{i}\n" for i in range(seeds)))
    return _start_driver(url, path, tmp_path / "recs.parquet", run_id,
                         extra=["--engine", "ray"])  # fmt: skip


@pytest.mark.slow
def test_a_sigkilled_ray_driver_stops_its_instance_and_its_tasks(
    sqlite_url: str, tmp_path: Path, driver_cleanup: list[int]
) -> None:
    url = migrated(sqlite_url)
    driver = _ray_driver(url, tmp_path, "ray-killed", seeds=RAY_SEEDS)
    driver_cleanup.append(driver.pid)
    _wait_for(
        lambda: len(run_charges(url, "ray-killed")) >= 3 or driver.poll() is not None,
        180,
        "the first charges",
    )
    assert driver.poll() is None, driver.stderr.read().decode() if driver.stderr else ""
    below = _descendants(driver.pid)
    driver_cleanup.extend(below)
    assert any("raylet" in command for command in below.values())

    driver.kill()
    driver.wait()
    _wait_for(lambda: not any(_alive(pid) for pid in below), 90, "Ray's processes to stop")
    # A Ray task admits its block of seeds in one transaction, so the (at most two) blocks in
    # flight at the kill may all be charged; tasks that went on would charge the other blocks.
    charged = len(run_charges(url, "ray-killed"))
    assert charged <= 2 * BLOCK, f"tasks went on without their driver: {charged} charges"
    assert len(_tmp_outputs(tmp_path / "recs.parquet")) == 1


@pytest.mark.slow
def test_a_lost_raylet_ends_the_run_with_one_line_naming_it(
    sqlite_url: str, tmp_path: Path, driver_cleanup: list[int]
) -> None:
    url = migrated(sqlite_url)
    driver = _ray_driver(url, tmp_path, "ray-lost")
    driver_cleanup.append(driver.pid)
    _wait_for(
        lambda: len(run_charges(url, "ray-lost")) >= 3 or driver.poll() is not None,
        180,
        "the first charges",
    )
    assert driver.poll() is None, driver.stderr.read().decode() if driver.stderr else ""
    below = _descendants(driver.pid)
    driver_cleanup.extend(below)
    (raylet,) = [pid for pid, command in below.items() if "raylet/raylet" in command]

    os.kill(raylet, signal.SIGKILL)
    assert driver.wait(timeout=180) != 0
    assert driver.stderr is not None
    lines = driver.stderr.read().decode().strip().splitlines()
    assert lines, "the driver said nothing"
    assert lines[-1].startswith("error [ray_component_lost]: "), lines[-5:]
    assert "raylet" in lines[-1]
    assert _tmp_outputs(tmp_path / "recs.parquet") == []
