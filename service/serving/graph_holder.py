"""The graph a process serves, swapped atomically on reload.

A request reads ``holder.current`` once and works on that object to the end, so queries in
flight finish on the old version while new ones see the new version. A reload that fails
leaves the old graph serving and raises the loader's error.

Every worker and replica serves the version recorded in the ledger database (``versions``):
a load or reload records its version there, and each holder compares the recorded version
with its own at most every ``check_seconds`` (when ``current`` is read, i.e. once per
request) and, if they differ, loads the graph again from its configured location and swaps
it in. The database decides, not process memory. A worker whose configured file does not
yield the recorded version keeps serving what it has and says so in the log (once per
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

from service.graph.model import Graph
from service.mechanisms.operator import walk_operator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedGraph:
    graph: Graph
    source: str
    loaded_at: float
    load_seconds: float


def load_configured_graph(path: Path | None) -> Graph:
    if path is None:
        from service.graph.demo import demo_graph

        return demo_graph()
    from service.graph.loader import load_edge_list

    return load_edge_list(path)


class VersionRecord(Protocol):
    """Where the version to serve is recorded (the ledger database)."""

    def current_graph_version(self) -> str | None: ...

    def set_current_graph_version(self, version: str) -> None: ...


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
    def current(self) -> Graph:
        self.follow()
        loaded = self._current
        if loaded is None:
            raise RuntimeError("no graph loaded yet")
        return loaded.graph

    def load(self, *, publish: bool = True) -> LoadedGraph:
        """Load from the configured location and swap it in; the old graph serves until then.
        With ``publish``, record its version as the one every worker serves."""
        with self._reload_lock:
            loaded = self._load_locked()
            if publish and self._versions is not None:
                self._versions.set_current_graph_version(loaded.graph.version)
            self._unreachable = None
            self._next_check = time.monotonic() + self._check_seconds
            return loaded

    def _load_locked(self) -> LoadedGraph:
        start = time.perf_counter()
        graph = self._loader(self._path)
        walk_operator(graph)  # build the kernel before the graph takes traffic
        if self._on_load is not None:
            self._on_load(graph)
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
            previous = self._current
            try:
                loaded = self._load_locked()
            except Exception as exc:
                self._unreachable = wanted
                log.error("cannot load the recorded graph version %s: %s", wanted, exc)
                return
            if loaded.graph.version != wanted:
                self._current = previous  # what the file holds now is not what was recorded
                self._unreachable = wanted
                log.error(
                    "the configured graph has version %s, not the recorded %s; still serving %s",
                    loaded.graph.version, wanted, served,
                )  # fmt: skip
        finally:
            self._reload_lock.release()
