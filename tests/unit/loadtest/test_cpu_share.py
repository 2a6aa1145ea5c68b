"""service/loadtest/cpu_share.py: the CPU a phase cost per request, by who spent it. A busy
process serving on the run's port counts as the server (and one on another port does not),
this process's own work as the driver; the figures are milliseconds per request over the
interval, the machine's busy share is between 0 and 1, and without samples or answers there is
no figure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from service.loadtest.cpu_share import CpuSample, describe, per_request, sample

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc only")

#: Burns CPU until its standard input closes; its command line names a server on a port.
BUSY = """
import sys, threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
sys.stdin.read()
"""


@contextmanager
def _busy(port: int) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-c", BUSY, "serve", "--port", str(port)], stdin=subprocess.PIPE
    )
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=10)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spent(pid: int, seconds: float) -> None:
    """Wait until the process has used ``seconds`` more CPU (however busy the machine is)."""
    start = _cpu_seconds(pid)
    for _ in range(3000):  # at most 30 s of waiting
        if _cpu_seconds(pid) - start >= seconds:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not use {seconds} s of CPU")


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_server_on_the_port_and_the_driver_are_counted_per_request() -> None:
    with _busy(47311) as process:
        before = sample(47311)
        elsewhere = sample(47312)
        _spent(process.pid, 0.25)
        _burn(0.3)
        after = sample(47311)
        elsewhere_after = sample(47312)
        assert process.poll() is None
    assert before is not None and after is not None
    assert elsewhere is not None and elsewhere_after is not None
    cpu = per_request(before, after, 100)
    assert cpu is not None
    assert cpu["server"] >= 0.24 * 1000 / 100  # the child's 0.25 s of CPU, per request
    assert cpu["driver"] >= 0.25 * 1000 / 100  # this process burned 0.3 s
    assert 0.0 < cpu["machine_busy"] <= 1.0
    assert elsewhere_after.seconds["server"] - elsewhere.seconds["server"] < 0.05
    assert describe(cpu).startswith(f"server {cpu['server']:.2f} ms, postgres")


def test_no_samples_or_no_answers_give_no_figure() -> None:
    now = CpuSample({"server": 1.0, "postgres": 0.0, "redis": 0.0, "driver": 0.0}, 10, 20)
    later = CpuSample({"server": 3.0, "postgres": 0.5, "redis": 0.0, "driver": 0.1}, 25, 40)
    assert per_request(None, later, 10) is None
    assert per_request(now, None, 10) is None
    assert per_request(now, later, 0) is None
    cpu = per_request(now, later, 10)
    assert cpu == pytest.approx(
        {"server": 200.0, "postgres": 50.0, "redis": 0.0, "driver": 10.0, "machine_busy": 0.75}
    )
    assert describe(None) == "not measured (no /proc)"
