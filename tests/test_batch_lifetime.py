"""A batch driver that dies takes its work with it: its pool processes stop at once (even after
SIGKILL, which the driver cannot catch), its temporary Parquet output is private (0600) and gone
after any exit it sees (SIGTERM) or after the next run with the same run id (SIGKILL); the rerun
still charges every user exactly once. On the demo graph: no shared data needed."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.batch import run_batch
from service.batch.sinks import RunInfo, remove_stale_outputs
from tests.batch_support import STEPS, assert_exactly_once, migrated, options, run_charges

REPO = Path(__file__).resolve().parents[1]
SEEDS = 120
BLOCK = 60  # two blocks, one per pool process: a pool that went on would answer whole blocks


def _seeds(tmp_path: Path) -> Path:
    path = tmp_path / "seeds.txt"
    path.write_text("".join(f"{i}\n" for i in range(SEEDS)))
    return path


def _children(pid: int, marker: bytes) -> list[int]:
    """Child processes of ``pid`` whose command line holds ``marker``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), -1
        )
        if ppid == pid and marker in cmdline:
            found.append(int(entry.name))
    return found


def _pool(driver: int) -> tuple[int, list[int]]:
    """The driver's fork server and the pool processes it forked (their command line is the
    fork server's)."""
    (server,) = _children(driver, b"multiprocessing.forkserver")
    return server, _children(server, b"multiprocessing.forkserver")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"gave up waiting {timeout:g} s for {what}")


def _start_driver(
    url: str, seeds: Path, out: Path, run_id: str, *, extra: list[str] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PPR_STEPS": str(STEPS)}
    for name in ("PPR_GRAPH_PATH", "PPR_REDIS_URL"):
        env.pop(name, None)
    command = [
        sys.executable, "-m", "service", "batch", "--accounts", str(seeds), "--out", str(out),
        "--run-id", run_id, "--create-missing-accounts", "--workers", "2",
        "--block-size", str(BLOCK), "--k", "10", "--epsilon", "0.1", "--database-url", url,
        "--no-progress", *(extra or []),
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


@pytest.fixture
def driver_cleanup() -> Iterator[list[int]]:
    """Pids this test started (the driver and its pool), killed if a failure left them."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _tmp_outputs(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.*"))


def _running_with_a_private_tmp(
    url: str, run_id: str, out: Path, driver: subprocess.Popen[bytes], pids: list[int]
) -> list[int]:
    """Wait until the run has charged a few seeds; check its temporary output; its pool
    processes and the fork server that forked them."""
    _wait_for(
        lambda: len(run_charges(url, run_id)) >= 3 or driver.poll() is not None,
        120,
        "the first charges",
    )
    assert driver.poll() is None, driver.stderr.read().decode() if driver.stderr else ""
    server, pool = _pool(driver.pid)
    pids.extend([server, *pool])
    assert len(pool) == 2
    (tmp,) = _tmp_outputs(out)
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o600, "users' recommendations, owner only"
    return [server, *pool]


@pytest.mark.slow
def test_a_sigkilled_driver_takes_its_pool_with_it_and_the_rerun_cleans_up(
    sqlite_url: str, tmp_path: Path, driver_cleanup: list[int]
) -> None:
    url = migrated(sqlite_url)
    seeds = _seeds(tmp_path)
    out = tmp_path / "recs.parquet"
    driver = _start_driver(url, seeds, out, "killed")
    driver_cleanup.append(driver.pid)
    pool = _running_with_a_private_tmp(url, "killed", out, driver, driver_cleanup)

    driver.kill()  # SIGKILL: no handler runs in the driver
    driver.wait()
    _wait_for(lambda: not any(_alive(pid) for pid in pool), 60, "the pool to stop")
    charged = len(run_charges(url, "killed"))
    # Each pool process was inside its block of 60 seeds: one that went on without its driver
    # would have answered (and charged) the rest of it.
    assert charged < BLOCK, f"the pool kept answering after its driver died: {charged} charges"
    assert len(_tmp_outputs(out)) == 1, "a SIGKILLed driver cannot remove its temporary file"

    summary = run_batch(options(url, None, seeds, out, run_id="killed", block_size=BLOCK))
    assert summary.failed == 0 and summary.answered + summary.replayed == SEEDS
    assert _tmp_outputs(out) == [], "the rerun with the same run id removed the stale file"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert_exactly_once(url, "killed", [str(i) for i in range(SEEDS)])


@pytest.mark.slow
def test_a_terminated_driver_removes_its_temporary_output_and_stops_its_pool(
    sqlite_url: str, tmp_path: Path, driver_cleanup: list[int]
) -> None:
    url = migrated(sqlite_url)
    out = tmp_path / "recs.parquet"
    driver = _start_driver(url, _seeds(tmp_path), out, "stopped")
    driver_cleanup.append(driver.pid)
    pool = _running_with_a_private_tmp(url, "stopped", out, driver, driver_cleanup)

    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 128 + signal.SIGTERM
    _wait_for(lambda: not any(_alive(pid) for pid in pool), 60, "the pool to stop")
    assert _tmp_outputs(out) == [] and not out.exists()
    assert len(run_charges(url, "stopped")) < BLOCK


def test_only_dead_writers_temporary_files_are_removed(tmp_path: Path) -> None:
    """A temporary file whose writer still holds its lock (a live driver of the same run id)
    stays; one nobody holds goes; other runs' and other files' are not touched."""
    import fcntl

    out = tmp_path / "recs.parquet"
    info = RunInfo("nightly", "v", "personalized", 0.1, 10)
    dead = tmp_path / ".recs.parquet.nightly.111.tmp"
    live = tmp_path / ".recs.parquet.nightly.222.tmp"
    other_run = tmp_path / ".recs.parquet.weekly.333.tmp"
    other_file = tmp_path / ".other.parquet.nightly.444.tmp"
    for path in (dead, live, other_run, other_file):
        path.write_bytes(b"x")
    fd = os.open(live, os.O_RDONLY)  # its own open file description: the lock conflicts
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        removed = remove_stale_outputs(out, info.run_id)
    finally:
        os.close(fd)
    assert removed == [dead]
    assert live.exists() and other_run.exists() and other_file.exists()


_REAPED_DRIVER = """
import importlib.util, subprocess, sys, time
# the module alone (the reaper imports nothing of the service): no numba start-up here
spec = importlib.util.spec_from_file_location("ray_reaper", "service/batch/ray_reaper.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
Reaper = module.Reaper
before = subprocess.Popen(["sleep", "600"])  # not the instance's: started before the reaper
reaper = Reaper()
instance = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600"])  # a process with a child
time.sleep(0.2)
reaper.watch_started_processes()
print(before.pid, instance.pid, reaper.process.pid, flush=True)
if sys.stdin.readline().strip() == "close":  # as after ray.shutdown
    reaper.close()
    print("closed", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("ending", ["sigkill", "close"])
def test_the_ray_reaper_ends_the_instances_processes_and_no_other(
    tmp_path: Path, ending: str, driver_cleanup: list[int]
) -> None:
    """The processes a local Ray instance started (stand-ins here: a shell and its child) end
    at once when the driver dies or closes the reaper; a process the driver had before stays."""
    driver = subprocess.Popen(
        [sys.executable, "-c", _REAPED_DRIVER],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    driver_cleanup.append(driver.pid)
    assert driver.stdout is not None
    before, instance, reaper = map(int, driver.stdout.readline().split())
    grandchildren = _children_of(instance)
    driver_cleanup.extend([before, instance, reaper, *grandchildren])
    assert grandchildren, "the instance's process has its child"
    if ending == "sigkill":
        driver.kill()
        driver.wait()
    else:
        assert driver.stdin is not None
        driver.stdin.write(b"close\n")
        driver.stdin.flush()
        assert driver.stdout.readline().strip() == b"closed"
    _wait_for(lambda: not any(_alive(pid) for pid in [instance, *grandchildren]), 30,
              "the instance's processes to end")  # fmt: skip
    _wait_for(lambda: not _alive(reaper), 30, "the reaper to exit")
    assert _alive(before)
    os.kill(before, signal.SIGKILL)


def _children_of(pid: int) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _ppid(entry) == pid
        ]
        if found:
            return found
        time.sleep(0.05)
    return []


def _ppid(entry: Path) -> int:
    try:
        return int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
