"""The graph a deployment is configured with: its edge-list file (or the demo graph), read
with its node list and through its memory-mapped snapshot, and the files an admin may choose
inside ``PPR_GRAPH_DIR``.

Every process that serves or reads the configured graph loads it here: the workers, the
supervisor, the prefix-table builder, the batch driver and its workers, and the commands.
"""

from __future__ import annotations

from pathlib import Path

from service.errors import InvalidParameter, shown
from service.graph.model import Graph


def load_configured_graph(
    path: Path | None, snapshot_dir: Path | None = None, nodes_path: Path | None = None
) -> Graph:
    """The graph of an edge-list file (the demo graph, whose node set is fixed, for None).
    With ``nodes_path`` (PPR_NODES_PATH) the node set is that file's list, not the ids the
    edges name. With ``snapshot_dir``, served from the file's memory-mapped snapshot there
    (written first if there is none), so that all the workers of a machine share one copy
    (:mod:`service.graph.snapshot`)."""
    if path is None:
        from service.graph.demo import demo_graph

        return demo_graph()
    from service.graph.loader import load_edge_list, read_node_list

    def parse(source: Path, raw: bytes | None) -> Graph:
        nodes = None if nodes_path is None else read_node_list(nodes_path)
        return load_edge_list(source, raw=raw, nodes=nodes)

    if snapshot_dir is None:
        return parse(path, None)
    from service.graph.snapshot import load_with_snapshot

    return load_with_snapshot(path, snapshot_dir, parse, node_list=nodes_path)


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
    try:
        candidate = (root / name).resolve()
        if not candidate.is_relative_to(root) or candidate == root:
            raise InvalidParameter("path", "must name a file inside PPR_GRAPH_DIR")
        if not candidate.is_file():
            raise InvalidParameter("path", f"no such file in PPR_GRAPH_DIR: {shown(name)}")
    except OSError as exc:  # a name too long for the file system, a loop of links, ...
        raise InvalidParameter(
            "path", f"cannot be opened in PPR_GRAPH_DIR: {exc.strerror}"
        ) from None
    return candidate
