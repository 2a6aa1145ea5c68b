"""The CPU a load phase cost, per request, by who spent it (Linux, from ``/proc``).

A share of ``/healthz`` moves with the machine's own speed, and on a shared 2-core machine
that moves by a fifth between runs. The CPU spent per answer does not: measured over the same
phase, it tells a faster path from a faster machine. Read before and after a phase:

* ``server``: the processes of ``service serve`` on the run's port (its workers are forked
  from it and carry its command line);
* ``postgres`` and ``redis``: every process of those servers on the machine;
* ``driver``: this process and the children it has waited for (``wrk`` is one, once it exits);
* the machine's busy share over the phase, from ``/proc/stat``.

Where ``/proc`` cannot be read (not Linux) nothing is measured and the report says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

#: The groups, in the order a report lists them.
GROUPS = ("server", "postgres", "redis", "driver")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds by group, and the machine's busy and total jiffies, at one moment."""

    seconds: dict[str, float]
    busy_jiffies: int
    total_jiffies: int


def _stat_fields(pid: str) -> tuple[str, list[str]] | None:
    """A process's name and the fields after it in ``/proc/PID/stat`` (None: it is gone)."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return name, stat.rsplit(")", 1)[1].split()


def _group(pid: str, name: str, server_flag: str) -> str | None:
    if name.startswith("postgres"):
        return "postgres"
    if name.startswith("redis"):
        return "redis"
    try:
        command = (
            (PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return None
    if " serve " in command and server_flag in command + " ":
        return "server"
    return None


def sample(port: int) -> CpuSample | None:
    """CPU seconds by group now, for a server listening on ``port``; None without ``/proc``."""
    if not (PROC / "stat").exists():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    seconds = dict.fromkeys(GROUPS, 0.0)
    server_flag = f"--port {port} "
    own = str(os.getpid())
    for entry in PROC.iterdir():
        pid = entry.name
        if not pid.isdigit():
            continue
        found = _stat_fields(pid)
        if found is None:
            continue
        name, fields = found
        if pid == own:  # utime, stime, and the waited-for children's cutime, cstime
            seconds["driver"] += sum(int(f) for f in fields[11:15]) / tick
            continue
        group = _group(pid, name, server_flag)
        if group is not None:
            seconds[group] += (int(fields[11]) + int(fields[12])) / tick
    cpu = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)  # idle and iowait
    return CpuSample(seconds, sum(cpu) - idle, sum(cpu))


def per_request(
    before: CpuSample | None, after: CpuSample | None, requests: int
) -> dict[str, float] | None:
    """Milliseconds of CPU per request by group between two samples, and ``machine_busy``
    (the machine's busy share, 0 to 1); None if either sample is missing or nothing was
    answered. A process that ended between the samples (other than a waited-for driver)
    is not counted."""
    if before is None or after is None or requests <= 0:
        return None
    out = {
        group: max(0.0, after.seconds[group] - before.seconds[group]) * 1000.0 / requests
        for group in GROUPS
    }
    total = after.total_jiffies - before.total_jiffies
    out["machine_busy"] = (after.busy_jiffies - before.busy_jiffies) / total if total else 0.0
    return out


def describe(cpu: dict[str, float] | None) -> str:
    """``server 3.65 ms, postgres 0.66 ms, redis 0.06 ms, driver 0.21 ms; machine 92% busy``."""
    if cpu is None:
        return "not measured (no /proc)"
    parts = ", ".join(f"{group} {cpu[group]:.2f} ms" for group in GROUPS)
    return f"{parts}; machine {100 * cpu['machine_busy']:.0f}% busy"
