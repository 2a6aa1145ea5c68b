"""What one serving process sees of the machine-wide prefix tables of the graph it serves.

For the served graph it plans one table per mode (edge mode first: its queries run the
diffusion by default) at this deployment's beta, eta and m = K - L (L of the default epsilon
at the graph's default delta), as many as fit in ``PPR_PREFIX_TABLE_BYTES`` together; a graph
whose first table does not fit gets none. At most once per ``check_seconds`` (on a lookup or a
readiness check) it maps the planned tables that are complete, and if one is missing and no
process of the machine is building it (the graph's build lock is free), it starts the builder
(:mod:`service.cache.prefix_table_builder`) at nice 19 and hands it the lock. Until a table is
mapped, its queries go the old way (the per-process prefix cache, else computed in the query).
A new graph version gets its own tables and the old ones are dropped (their mapping goes with
the last row in use).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.cache.prefix_table_builder import command
from service.cache.prefix_table_file import (
    BUILD_LOCK_SUFFIX,
    TableSpec,
    graph_fingerprint,
    try_open_table,
)
from service.config import MechanismSettings
from service.graph.model import Graph
from service.graph.snapshot import private_directory
from service.privacy.calibration import calibrate
from service.privacy.modes import Mode

log = logging.getLogger(__name__)

#: The order tables are planned and built in when not all fit.
MODE_ORDER = (Mode.EDGE, Mode.PERSONALIZED)

EventHook = Callable[[str, str], None]


def planned_specs(
    graph: Graph, fingerprint: str, mechanism: MechanismSettings, bound_bytes: int
) -> tuple[list[TableSpec], list[TableSpec]]:
    """(tables to build, in order; tables left out because they do not fit the bound)."""
    delta = mechanism.account_delta
    fits: list[TableSpec] = []
    left_out: list[TableSpec] = []
    total = 0
    for mode in MODE_ORDER:
        noisy = calibrate(
            mechanism.default_epsilon, delta, mechanism.steps, mechanism.beta, mode
        ).noisy_steps
        spec = TableSpec(
            graph.version, fingerprint, graph.n, mode.value,
            float(mechanism.beta), float(mechanism.eta), mechanism.steps - noisy,
        )  # fmt: skip
        if spec.m < 1 or total + spec.nbytes > bound_bytes or left_out:
            left_out.append(spec)
            continue
        fits.append(spec)
        total += spec.nbytes
    return fits, left_out


@dataclass
class _Tables:
    """The tables of one graph version as this process sees them."""

    version: str
    fingerprint: str = ""
    source: str = ""
    planned: list[TableSpec] = field(default_factory=list)
    left_out: list[TableSpec] = field(default_factory=list)
    rows: dict[tuple[str, float, float, int], np.ndarray] = field(default_factory=dict)
    builder: subprocess.Popen[bytes] | None = None
    build_failed: bool = False


class SharedPrefixTables:
    def __init__(
        self,
        directory: Path | None,
        bound_bytes: int,
        mechanism: MechanismSettings,
        served: Callable[[], Graph | None],
        *,
        check_seconds: float = 1.0,
        on_event: EventHook | None = None,
    ) -> None:
        """``served``: the graph this process serves now (the tables follow it, not the
        graph of a query still running on an older version)."""
        self.directory = directory
        self.served = served
        self.bound_bytes = bound_bytes
        self.mechanism = mechanism
        self.check_seconds = check_seconds
        self._on_event = on_event
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._tables: _Tables | None = None
        self._closed = False
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None and self.bound_bytes > 0

    def lookup(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int
    ) -> np.ndarray | None:
        """Row ``seed`` of the mapped table of these parameters (a read-only view), or None."""
        if not self.enabled:
            return None
        self.follow()
        tables = self._tables
        if tables is None or tables.version != graph.version:
            return None
        rows = tables.rows.get((Mode(mode).value, float(beta), float(eta), int(m)))
        if rows is None:
            self._event("miss")
            return None
        self.hits += 1
        self._event("hit")
        row: np.ndarray = rows[seed]
        return row

    def follow(self, *, now: bool = False, wait: bool = False) -> None:
        """At most once per ``check_seconds`` (or ``now``): switch to the served graph's
        tables, map those that are complete (checking each file whole, so in a thread of its
        own unless ``wait``: the caller, a query, does not wait for it), start the builder if
        one is missing and no process of the machine builds it."""
        if not self.enabled or self._closed:
            return
        moment = time.monotonic()
        if not now and moment < self._next_check:
            return
        if not self._lock.acquire(blocking=False):
            return  # a check is running
        self._next_check = moment + self.check_seconds
        if wait:
            self._check_and_release()
        else:
            threading.Thread(
                target=self._check_and_release, name="ppr-prefix-tables", daemon=True
            ).start()

    def _check_and_release(self) -> None:
        try:
            graph = self.served()
            if graph is not None and not self._closed:
                self._refresh(graph)
        except Exception:  # the tables are an optimisation: never fail a query over them
            log.exception("prefix table check failed")
        finally:
            self._lock.release()

    def state(self) -> dict[str, Any]:
        """For readiness: ``off``, ``absent`` (none fits, or the build failed), ``building``
        or ``ready``, with the bytes mapped and each planned table."""
        self.follow()
        if not self.enabled:
            return {"status": "off", "bytes": 0, "bound_bytes": self.bound_bytes}
        tables = self._tables
        if tables is None:
            return {"status": "absent", "bytes": 0, "bound_bytes": self.bound_bytes}
        mapped = [spec for spec in tables.planned if spec.parameters in tables.rows]
        if tables.planned and len(mapped) == len(tables.planned):
            status = "ready"
        elif tables.planned and not tables.build_failed:
            status = "building"
        else:
            status = "absent"
        return {
            "status": status,
            "bytes": sum(spec.nbytes for spec in mapped),
            "bound_bytes": self.bound_bytes,
            "graph_version": tables.version,
            "tables": [
                {"mode": s.mode, "m": s.m, "bytes": s.nbytes,
                 "status": "ready" if s in mapped else status}
                for s in tables.planned
            ] + [
                {"mode": s.mode, "m": s.m, "bytes": s.nbytes, "status": "over_bound"}
                for s in tables.left_out
            ],
        }  # fmt: skip

    def close(self) -> None:
        """Stop this process's builder (another process starts one when it needs it)."""
        with self._lock:
            self._closed = True
            if self._tables is not None:
                _stop(self._tables.builder)

    # -- internals ----------------------------------------------------------------------

    def _event(self, result: str) -> None:
        if self._on_event is not None:
            self._on_event("prefix_table", result)

    def _refresh(self, graph: Graph) -> None:
        assert self.directory is not None
        tables = self._tables
        if tables is None or tables.version != graph.version:
            if tables is not None:
                _stop(tables.builder)  # it builds the old version's tables
            tables = self._plan(graph)
            self._tables = tables  # the old rows go with the last reference to them
        finished = tables.builder is not None and tables.builder.poll() is not None
        missing = [spec for spec in tables.planned if spec.parameters not in tables.rows]
        if not missing:
            return
        rows = dict(tables.rows)
        for spec in missing:
            opened = try_open_table(spec.path(self.directory), spec)
            if opened is not None:
                rows[spec.parameters] = opened
                log.info(
                    "prefix table mapped",
                    extra={"graph_version": spec.graph_version, "mode": spec.mode, "m": spec.m},
                )
        tables.rows = rows  # one reference assignment: atomic for readers
        if finished:
            assert tables.builder is not None
            if len(rows) < len(tables.planned):  # it failed: not again from this process
                log.warning("the prefix table builder exited with status %s; queries go on "
                            "without the missing tables", tables.builder.returncode)  # fmt: skip
                tables.build_failed = True
            tables.builder = None
        if len(rows) < len(tables.planned) and tables.builder is None and not tables.build_failed:
            self._start_builder(tables)

    def _plan(self, graph: Graph) -> _Tables:
        assert self.directory is not None
        tables = _Tables(graph.version, graph_fingerprint(graph), graph.stats.source)
        tables.planned, tables.left_out = planned_specs(
            graph, tables.fingerprint, self.mechanism, self.bound_bytes
        )
        if tables.left_out:
            log.info("prefix tables over PPR_PREFIX_TABLE_BYTES are not built",
                     extra={"graph_version": graph.version, "bound_bytes": self.bound_bytes,
                            "modes": [s.mode for s in tables.left_out]})  # fmt: skip
        if tables.planned:
            try:
                private_directory(self.directory)
            except OSError as exc:
                log.warning("prefix tables are off: cannot use %s: %s", self.directory, exc)
                tables.planned, tables.build_failed = [], True
        return tables

    def _start_builder(self, tables: _Tables) -> None:
        """Start the builder unless another process of the machine holds the build lock."""
        assert self.directory is not None
        lock = self.directory / f".{tables.fingerprint}{BUILD_LOCK_SUFFIX}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process of the machine builds them
                return
            os.utime(lock)  # in use (stale locks are removed with stale tables)
            missing = [spec for spec in tables.planned if spec.parameters not in tables.rows]
            missing = _fitting_on_disk(self.directory, missing)
            if not missing:
                tables.build_failed = True  # no room: not again from this process
                return
            argv = command(
                tables.source, self.directory, tables.fingerprint, missing, fd,
                getattr(self.mechanism, "nodes_path", None),
            )  # fmt: skip
            tables.builder = subprocess.Popen(argv, pass_fds=(fd,), stdin=subprocess.DEVNULL)
            log.info("prefix table builder started",
                     extra={"graph_version": tables.version, "builder_pid": tables.builder.pid,
                            "modes": [s.mode for s in missing]})  # fmt: skip
        finally:
            os.close(fd)  # the builder holds the lock now (its copy of the descriptor)


#: Disk space a table build leaves free in the snapshot directory's file system.
DISK_HEADROOM_BYTES = 1 << 30


def _fitting_on_disk(directory: Path, specs: list[TableSpec]) -> list[TableSpec]:
    """The leading ``specs`` whose files fit on the directory's file system with
    :data:`DISK_HEADROOM_BYTES` to spare (a full disk would fail the ledger's neighbours too)."""
    free = shutil.disk_usage(directory).free - DISK_HEADROOM_BYTES
    fitting: list[TableSpec] = []
    for spec in specs:
        if spec.nbytes > free:
            log.warning("prefix tables are not built: the disk has too little free space",
                        extra={"directory": str(directory), "needed_bytes": spec.nbytes,
                               "free_bytes": free + DISK_HEADROOM_BYTES})  # fmt: skip
            break
        fitting.append(spec)
        free -= spec.nbytes
    return fitting


def _stop(builder: subprocess.Popen[bytes] | None) -> None:
    if builder is None or builder.poll() is not None:
        return
    builder.terminate()
    try:
        builder.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - it stops between blocks
        builder.kill()
        builder.wait()
