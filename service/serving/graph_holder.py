"""The graph a process serves, swapped atomically on reload.

A request reads ``holder.current`` once and works on that object to the end, so queries in
flight finish on the old version while new ones see the new version. A reload that fails
leaves the old graph serving and raises the loader's error.

Every worker and replica serves the version recorded in the ledger database (``versions``):
a load or reload records its version there, and each holder compares the recorded version
with its own at most every ``check_seconds`` (when ``current`` is read, i.e. once per
request) and, if they differ, loads the graph again and swaps it in: from the file recorded
with the version (e.g. one an admin chose inside ``PPR_GRAPH_DIR``), else from its configured
location. The database decides, not process memory. A worker whose file does not yield the
recorded version keeps serving what it has and says so in the log (once per
recorded version).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from service.graph.configured import load_configured_graph
from service.graph.model import Graph
from service.mechanisms.engine import warm_engine
from service.mechanisms.operator import walk_operator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedGraph:
    graph: Graph
    source: str
    loaded_at: float
    load_seconds: float


class VersionRecord(Protocol):
    """Where the version to serve, and the file it was loaded from, are recorded (the ledger
    database)."""

    def current_graph_version(self) -> str | None: ...

    def current_graph_path(self) -> str | None: ...

    def current_graph_configuration(self) -> str | None: ...

    def set_current_graph_version(
        self, version: str, path: str | None = None, configured: str | None = None
    ) -> None: ...


class GraphHolder:
    def __init__(
        self,
        path: Path | None,
        loader: Callable[[Path | None], Graph] = load_configured_graph,
        on_load: Callable[[Graph], None] | None = None,
        *,
        versions: VersionRecord | None = None,
        check_seconds: float = 1.0,
    ) -> None:
        self._path = path
        self._configured = path  # the deployment's own setting (PPR_GRAPH_PATH), never changed
        self._loader = loader
        self._on_load = on_load
        self._reload_lock = threading.Lock()
        self._current: LoadedGraph | None = None
        self._versions = versions
        self._check_seconds = check_seconds
        self._next_check = 0.0
        self._unreachable: str | None = None  # a recorded version this worker cannot load

    @property
    def source(self) -> str:
        return str(self._path) if self._path is not None else "demo"

    @property
    def loaded(self) -> LoadedGraph | None:
        self.follow()
        return self._current

    @property
    def served(self) -> Graph | None:
        """The graph served now, without checking the recorded version."""
        loaded = self._current
        return None if loaded is None else loaded.graph

    @property
    def current(self) -> Graph:
        self.follow()
        loaded = self._current
        if loaded is None:
            raise RuntimeError("no graph loaded yet")
        return loaded.graph

    def start(self) -> LoadedGraph:
        """The first load of a worker.

        If the ledger records a version published under this same configuration (e.g. an
        admin's reload to another file, and this worker was restarted after a crash), the
        worker loads that file. Otherwise (a new deployment, a changed ``PPR_GRAPH_PATH``, or
        new contents of the configured file) it loads its configured file and publishes it.
        Reading or writing the record is best-effort here: a worker that starts while the
        database is down serves its configured file and follows the record once it answers.
        """
        configured = _setting(self._configured)
        recorded_path: str | None = None
        follow = False
        if self._versions is not None:
            try:
                follow = (
                    self._versions.current_graph_version() is not None
                    and self._versions.current_graph_configuration() == configured
                )
                recorded_path = self._versions.current_graph_path() if follow else None
            except Exception as exc:
                log.warning("cannot read the recorded graph version at start: %s", exc)
        if follow and recorded_path is not None and recorded_path != configured:
            try:
                return self.load(Path(recorded_path), publish=False)
            except Exception as exc:
                log.error("cannot load the recorded graph file %s: %s", recorded_path, exc)
        try:
            return self.load()
        except Exception as exc:
            if self._current is None or not _is_database_error(exc):
                raise
            log.warning("cannot record the graph version at start: %s", exc)
            return self._current

    def load(self, path: Path | None = None, *, publish: bool = True) -> LoadedGraph:
        """Load from ``path`` (default: the current location) and swap it in; the old graph
        serves until then. A new ``path`` becomes the current location only if it loads.
        With ``publish``, record its version (and file) as what every worker serves."""
        with self._reload_lock:
            loaded = self._load_locked(path)
            if publish and self._versions is not None:
                self._versions.set_current_graph_version(
                    loaded.graph.version, _setting(self._path), _setting(self._configured)
                )
            self._unreachable = None
            self._next_check = time.monotonic() + self._check_seconds
            return loaded

    def _load_locked(self, path: Path | None = None) -> LoadedGraph:
        start = time.perf_counter()
        source_path = path if path is not None else self._path
        graph = self._loader(source_path)
        warm_engine(graph, walk_operator(graph))  # compile the kernels before any traffic
        if self._on_load is not None:
            self._on_load(graph)
        self._path = source_path
        loaded = LoadedGraph(graph, self.source, time.time(), time.perf_counter() - start)
        self._current = loaded  # a single reference assignment: atomic for readers
        log.info(
            "graph loaded",
            extra={"graph_version": graph.version, "nodes": graph.n, "edges": graph.m,
                   "load_seconds": round(loaded.load_seconds, 3)},
        )  # fmt: skip
        return loaded

    def follow(self) -> None:
        """Swap to the recorded version if it is not the one served (at most every
        ``check_seconds``; a reader never waits for another thread's check or load)."""
        if self._versions is None or self._current is None:
            return
        now = time.monotonic()
        if now < self._next_check or not self._reload_lock.acquire(blocking=False):
            return
        try:
            self._next_check = now + self._check_seconds
            try:
                wanted = self._versions.current_graph_version()
            except Exception as exc:  # the database is down: keep serving, check again later
                log.warning("graph version check failed: %s", exc)
                return
            served = self._current.graph.version
            if wanted is None or wanted == served or wanted == self._unreachable:
                return
            log.info("graph version changed elsewhere; reloading",
                     extra={"graph_version": served, "recorded_version": wanted})  # fmt: skip
            previous, previous_path = self._current, self._path
            try:
                recorded_path = self._versions.current_graph_path()
                loaded = self._load_locked(
                    Path(recorded_path) if recorded_path is not None else None
                )
            except Exception as exc:
                self._path = previous_path
                self._unreachable = wanted
                log.error("cannot load the recorded graph version %s: %s", wanted, exc)
                return
            if loaded.graph.version != wanted:
                self._current = previous  # what the file holds now is not what was recorded
                self._path = previous_path
                self._unreachable = wanted
                log.error(
                    "the configured graph has version %s, not the recorded %s; still serving %s",
                    loaded.graph.version, wanted, served,
                )  # fmt: skip
        finally:
            self._reload_lock.release()


def _setting(path: Path | None) -> str:
    """A graph location as recorded in the ledger ("" for the demo graph)."""
    return "" if path is None else str(path)


def _is_database_error(exc: BaseException) -> bool:
    from service.ledger.ledger import LedgerUnavailable

    return isinstance(exc, LedgerUnavailable)
