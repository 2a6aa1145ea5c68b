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

from service.errors import InvalidParameter
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


def graph_file_in(directory: Path | None, name: str) -> Path:
    """The file ``name`` names inside ``directory`` (``PPR_GRAPH_DIR``), and never elsewhere.

    ``name`` is relative to the directory; after resolving ``..`` and symbolic links the file
    must still lie inside it and exist. Raises ``InvalidParameter("path", ...)`` otherwise, and
    when no directory is configured.
    """
    if directory is None:
        raise InvalidParameter(
            "path",
            "loading a graph from a chosen file is off: set PPR_GRAPH_DIR to the directory "
            "admins may load graph files from (or reload the configured file with no body)",
        )
    if not name or "\x00" in name or Path(name).is_absolute():
        raise InvalidParameter("path", "must be a file name relative to PPR_GRAPH_DIR")
    root = directory.resolve()
    candidate = (root / name).resolve()
    if not candidate.is_relative_to(root) or candidate == root:
        raise InvalidParameter("path", "must name a file inside PPR_GRAPH_DIR")
    if not candidate.is_file():
        raise InvalidParameter("path", f"no such file in PPR_GRAPH_DIR: {name!r}")
    return candidate


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

    def load(self, path: Path | None = None) -> LoadedGraph:
        """Load from ``path`` (default: the current location) and swap it in; the old graph
        serves until then. A new ``path`` becomes the current location only if it loads."""
        with self._reload_lock:
            start = time.perf_counter()
            source_path = path if path is not None else self._path
            graph = self._loader(source_path)
            walk_operator(graph)  # build the kernel before the graph takes traffic
            if self._on_load is not None:
                self._on_load(graph)
            source = str(source_path) if source_path is not None else "demo"
            loaded = LoadedGraph(graph, source, time.time(), time.perf_counter() - start)
            self._path = source_path
            self._current = loaded  # a single reference assignment: atomic for readers
            log.info(
                "graph loaded",
                extra={"graph_version": graph.version, "nodes": graph.n, "edges": graph.m,
                       "load_seconds": round(loaded.load_seconds, 3)},
            )  # fmt: skip
            return loaded
