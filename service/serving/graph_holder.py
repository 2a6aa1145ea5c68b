"""The graph a process serves, swapped atomically on reload.

A request reads ``holder.current`` once and works on that object to the end, so queries in
flight finish on the old version while new ones see the new version. A reload that fails
leaves the old graph serving and raises the loader's error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


class GraphHolder:
    def __init__(
        self,
        path: Path | None,
        loader: Callable[[Path | None], Graph] = load_configured_graph,
        on_load: Callable[[Graph], None] | None = None,
    ) -> None:
        self._path = path
        self._loader = loader
        self._on_load = on_load
        self._reload_lock = threading.Lock()
        self._current: LoadedGraph | None = None

    @property
    def source(self) -> str:
        return str(self._path) if self._path is not None else "demo"

    @property
    def loaded(self) -> LoadedGraph | None:
        return self._current

    @property
    def current(self) -> Graph:
        loaded = self._current
        if loaded is None:
            raise RuntimeError("no graph loaded yet")
        return loaded.graph

    def load(self) -> LoadedGraph:
        """Load from the configured location and swap it in; the old graph serves until then."""
        with self._reload_lock:
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
