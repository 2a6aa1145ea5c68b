"""Worker processes that end with their driver, and a driver that ends cleanly on a signal.

A pool process answers seeds for a driver that writes the answers to the sink. If the driver
dies (killed, even with SIGKILL, which it cannot catch), a pool process that went on would
charge users for answers nobody receives. So each pool process, first thing, has the kernel
tell it when the driver is gone:

- it opens a pidfd on the driver (Linux ``pidfd_open``), which becomes readable the moment the
  driver exits, however it was killed; a daemon thread waits on it and ends the process. No
  polling interval and no pipe to keep open. The driver need not be the process's parent:
  pool processes are forked by the fork server the driver started
  (:func:`service.batch.engines.pool_context`). This watch is what ends them: the fork
  server itself waits for the driver AND every process it forked to close its pipe, so it
  outlives a dead driver for as long as its pool processes do;
- it asks for ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` as well, so it also ends with its parent
  (the fork server, should it be killed; or the driver itself, for a spawned pool).

The pidfd is opened after the process started, so a driver that died in between is caught
then (no such process). Where pidfds do not exist (not Linux, or a kernel before 5.3), a daemon
thread polls the driver's pid twice a second instead.

A process killed mid-seed leaves at most that seed's charge admitted, with nothing released:
the next run with the same run id refunds it before answering the seed (see
:mod:`service.batch.worker`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: ``PR_SET_PDEATHSIG`` from <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the driver's pid where pidfds are not available.
DRIVER_POLL_SECONDS = 0.5


def _set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _exit_when_readable(pidfd: int) -> None:
    select.select([pidfd], [], [])  # readable once the process has exited
    os._exit(1)


def _watch_by_pidfd(driver_pid: int) -> bool:
    """Exit once ``driver_pid`` has (at once if it already has); False without pidfds."""
    try:
        pidfd = os.pidfd_open(driver_pid)
    except ProcessLookupError:  # the driver died before the pool process got here
        os._exit(1)
    except (AttributeError, OSError):
        return False
    threading.Thread(target=_exit_when_readable, args=(pidfd,), daemon=True).start()
    return True


def _poll_driver(driver_pid: int) -> None:
    while True:
        try:
            os.kill(driver_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # it exists (owned by another user)
            pass
        time.sleep(DRIVER_POLL_SECONDS)


def die_with_driver(driver_pid: int) -> None:
    """Make this (pool) process end as soon as ``driver_pid``, the driver that started its
    pool, is gone, or its own parent is.

    Called first in every pool process (the pool's ``initializer``).
    """
    _set_parent_death_signal(signal.SIGKILL)
    if not _watch_by_pidfd(driver_pid):
        threading.Thread(target=_poll_driver, args=(driver_pid,), daemon=True).start()


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
