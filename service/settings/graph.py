"""The graph's settings: the edge-list and node-list files, the directory an admin may load
graphs from, the memory-mapped snapshots shared by a machine's workers and how often a worker
follows a reload made elsewhere."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GraphSettings(BaseSettings):
    """The served graph: its files, snapshots and how workers follow reloads."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    graph_path: Path | None = Field(None, description="Edge-list file; unset: the demo graph.")
    nodes_path: Path | None = Field(
        None,
        description="Node-list file (one id per line): the node set, an input like the edges "
        "(nodes without edges are served; an edge naming a node not listed is refused). "
        "Unset: the node set is derived from the edges and is then public.",
    )
    graph_is_synthetic: bool = Field(
        False,
        description="Serve a synthetic release as a sandbox: exact answers marked synthetic, "
        "the release charged once to each account that receives one; the graph file must be a "
        "synthetic release the ledger recorded.",
    )
    graph_dir: Path | None = Field(
        None,
        description="Directory an admin may load graph files from by name "
        '(POST /v1/admin/graph/reload {"path": ...}); unset: only the configured file.',
    )
    graph_snapshots: bool = Field(
        True,
        description="Serve a graph file from a binary CSR snapshot that every worker of the "
        "machine memory-maps read-only (one copy of the graph per machine); written once per "
        "file contents. Off: each process parses the file and holds its own copy.",
    )
    graph_snapshot_dir: Path | None = Field(
        None,
        description="Directory of the graph snapshots (created 0700; they hold the graph); "
        "unset: ppr-graph-snapshots-<uid> in the system temp dir.",
    )
    graph_version_check_ms: float = Field(
        1000.0, ge=0.0,
        description="How often (at most) each worker compares its graph version with the one "
        "recorded in the ledger database by the last load or reload, and reloads if they "
        "differ; 0 turns following off.",
    )  # fmt: skip

    @property
    def snapshot_directory(self) -> Path | None:
        """Where graph snapshots go, or None when they are off."""
        if not self.graph_snapshots:
            return None
        if self.graph_snapshot_dir is not None:
            return self.graph_snapshot_dir
        from service.graph.snapshot import default_directory

        return default_directory()
