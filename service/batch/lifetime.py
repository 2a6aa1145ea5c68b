"""Worker processes that end with their driver, and a driver that ends cleanly on a signal.

A pool process answers seeds for a driver that writes the answers to the sink. If the driver
dies (killed, even with SIGKILL, which it cannot catch), a pool process that went on would
charge users for answers nobody receives. So each pool process asks the kernel to kill it when
its parent dies: Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``. Why this and not a watch of the
parent: the kernel delivers the signal the moment the parent is gone, with no thread, no polling
interval and no pipe to keep open, and it covers a driver killed by any means. The request is
made after the process started, so a driver that died in between is caught by comparing the
parent pid with the driver's. Where ``prctl`` does not exist (not Linux), a daemon thread polls
the parent pid twice a second instead.

A process killed mid-seed leaves at most that seed's charge admitted, with nothing released:
the next run with the same run id refunds it before answering the seed (see
:mod:`service.batch.worker`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: ``PR_SET_PDEATHSIG`` from <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the parent pid where prctl is not available.
PARENT_POLL_SECONDS = 0.5


def _set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """Make this (worker) process end as soon as ``parent_pid``, its parent, is gone.

    Called first in every pool process (the pool's ``initializer``).
    """
    if not _set_parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # the driver died before the request was made
        os._exit(1)


class Terminated(SystemExit):
    """The driver received SIGTERM or SIGHUP: unwind (abort the sink, stop the pool) and exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def unwind_on_termination() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread while this is active, so
    ``finally`` blocks run (temporary outputs removed, workers stopped) as on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _raise_terminated) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
