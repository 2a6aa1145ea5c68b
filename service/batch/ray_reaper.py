"""Ends a local Ray instance's processes within a second of the driver that started it dying.

Ray ties the GCS and the raylet it starts to the driver (``prctl(PR_SET_PDEATHSIG)``), so
they die with it even on SIGKILL, and the task workers follow within about two seconds. The
raylet's two agents (the dashboard agent and the runtime-env agent) notice that their raylet is
gone, then report it to the GCS, which died too, and wait a fixed 60 s for that call before
they exit: without more, a SIGKILLed driver leaves them behind for a minute (no Ray setting
shortens that call).

So a driver that starts a local instance first starts this reaper, a small process outside
Ray reading a pipe from the driver. Once ``ray.init`` returned, the driver writes the
instance's processes to the pipe (every process that appeared below the driver during
``ray.init``, by pid and start time). When the pipe reports end of file (the driver closed it
after ``ray.shutdown``, or the kernel did because the driver died by any means), the reaper
SIGKILLs each of those still running (the same pid with the same start time: never a process
that took a pid over) and its descendants, then exits. Each is a process that Ray's own fate
sharing ends anyway, only later: the raylet and the GCS are gone by then. (Measured with
Ray 2.60: the agents' report is ``publish_error_to_driver``, whose 60 s timeout is fixed;
``RAY_gcs_rpc_server_reconnect_timeout_s`` does not shorten it.)

Linux only (it reads ``/proc``); elsewhere the driver does not start it and the instance ends
as Ray's fate sharing ends it. Run as a script (``python -I ray_reaper.py``): it imports
nothing from the service.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

#: How often, and how long at most, the reaper looks for processes of the instance left.
ROUND_SECONDS = 0.1
GIVE_UP_SECONDS = 10.0

Process = tuple[int, int]  # pid, start time (clock ticks after boot)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command: state (field 3), ppid (4), ..., starttime (22)
    return int(fields[1]), int(fields[19]), fields[0].decode()


def _table() -> dict[int, tuple[int, int, str]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                table[int(entry)] = found
    return table


def descendants(pid: int, *, table: dict[int, tuple[int, int, str]] | None = None) -> set[Process]:
    """Every live process below ``pid``, by pid and start time."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: set[Process] = set()
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if table[child][2] != "Z" and (child, table[child][1]) not in found:
                found.add((child, table[child][1]))
                frontier.append(child)
    return found


def reap(processes: set[Process]) -> None:
    """SIGKILL ``processes`` (those still running as the same process) and what is below
    them, until none is left or ``GIVE_UP_SECONDS`` passed."""
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while time.monotonic() < deadline:
        table = _table()
        alive = {
            (pid, started)
            for pid, started in processes
            if pid in table and table[pid][1] == started and table[pid][2] != "Z"
        }
        targets = set(alive)
        for pid, _ in alive:
            targets |= descendants(pid, table=table)
        if not targets:
            return
        for pid, _ in targets:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(ROUND_SECONDS)


def main() -> int:
    processes: set[Process] = set()
    pending = b""
    while chunk := os.read(sys.stdin.fileno(), 65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            pid, started = line.split()
            processes.add((int(pid), int(started)))
    reap(processes)
    return 0


class Reaper:
    """The driver's side of the reaper."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # its own session: a Ctrl-C or hang-up meant for the driver does not end it first
            start_new_session=True,
        )
        self._before = descendants(os.getpid())

    @staticmethod
    def supported() -> bool:
        return sys.platform.startswith("linux") and os.path.isdir("/proc/self")

    def watch_started_processes(self) -> None:
        """Hand the reaper every process that appeared below this driver since the reaper
        started (call right after ``ray.init``: the instance's GCS, raylet, agents and first
        workers)."""
        started = descendants(os.getpid()) - self._before
        lines = "".join(f"{pid} {start}\n" for pid, start in started)
        assert self.process.stdin is not None
        self.process.stdin.write(lines.encode())
        self.process.stdin.flush()

    def close(self, timeout: float = GIVE_UP_SECONDS + 5) -> None:
        """After ``ray.shutdown``: end whatever of the instance is left, and the reaper."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - reaping never takes this long
            self.process.kill()
            self.process.wait()


if __name__ == "__main__":
    sys.exit(main())
