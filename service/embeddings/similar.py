"""Nearest neighbours over an all-node embedding release: the index, and a worker's copy of it.

The index is usearch's HNSW over the released vectors with the cosine metric, chosen on the
measurements in docs/notes/2026-11-embedding-release-measurements.md
(``benchmarks/embedding_ann.py``). The release measures its recall@10 against exact search
(:func:`measure_recall`); below :data:`RECALL_TARGET` the answers use usearch's exact search
over the same memory-mapped vectors instead (on noise-dominated vectors, as the 100k-node
benchmark's are, no HNSW library reached 0.95). Cosine, because
InstantEmbedding is feature hashing, which preserves inner products in expectation, and the
Laplace noise is zero-mean, independent between nodes and of the same scale on every row, so
the normalized inner product compares two nodes' log-mass vectors without their overall scale.

Everything here is post-processing of the release: the index and every answer are functions
of the released vectors only, so they cost nothing beyond the release (which was charged once,
graph-wide, when it was made: :mod:`service.embeddings.all_node_release`).

A worker holds one :class:`SimilarIndex` (:class:`SimilarIndexHolder`): the index file memory
mapped (usearch's ``view``: one copy in the page cache for every worker of the machine), the
node ids in memory. Each answer first compares the release pointer's file status with the one
it loaded, so a new release is picked up by the next answer in every worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.errors import ServiceError

__all__ = [
    "EF_CONSTRUCTION",
    "INDEX_SUFFIX",
    "LINKS",
    "POINTER",
    "NoEmbeddingRelease",
    "NodeNotInRelease",
    "SimilarIndex",
    "SimilarIndexHolder",
    "build_index",
    "measure_recall",
]

INDEX_SUFFIX = ".usearch"
#: HNSW links per node (M) and insertion depth (ef_construction), as benchmarked.
LINKS = 16
EF_CONSTRUCTION = 200
#: The file naming the current release, written last.
POINTER = "current.json"


class NoEmbeddingRelease(ServiceError):
    """No all-node embedding release is served for the current graph version."""

    code = "no_embedding_release"
    status = 404


class NodeNotInRelease(ServiceError):
    """The node is in the graph but the release does not cover it (a node-list release)."""

    code = "node_not_in_release"
    status = 404

    def __init__(self, node: str, release: str) -> None:
        super().__init__(
            f"node {node!r} is in the graph but not in the embedding release {release}; an "
            "admin can release embeddings for it",
            details={"node": node, "release": release},
        )


def build_index(vectors: np.ndarray, path: Path, threads: int = 0) -> None:
    """An HNSW index (cosine) of ``vectors``, row i under key i, saved to ``path``."""
    from usearch.index import Index

    index = Index(ndim=int(vectors.shape[1]), metric="cos", dtype="f32",
                  connectivity=LINKS, expansion_add=EF_CONSTRUCTION)  # fmt: skip
    if vectors.shape[0]:
        index.add(np.arange(vectors.shape[0], dtype=np.uint64),
                  np.ascontiguousarray(vectors, dtype=np.float32), threads=threads)  # fmt: skip
    index.save(str(path))


#: The recall@10 against exact search an approximate answer must have been measured at; a
#: release whose index falls short is answered by exact search (usearch's ``exact=True``).
RECALL_TARGET = 0.95
#: How many released nodes the release measures the index's recall on.
RECALL_SAMPLE = 200


def _other(keys: np.ndarray, row: int, count: int) -> list[int]:
    return [int(x) for x in keys if int(x) != row][:count]


def measure_recall(path: Path, ef: int, sample: int = RECALL_SAMPLE) -> float:
    """recall@10 of the saved index at search depth ``ef`` against exact search, each of up
    to ``sample`` random rows querying with its own vector, itself left out."""
    from usearch.index import Index

    index: Any = Index.restore(str(path), view=True)
    rows = len(index)
    if rows <= 1:
        return 1.0
    top = min(10, rows - 1)
    index.expansion_search = max(ef, top + 1)
    picked = np.random.default_rng().choice(rows, min(sample, rows), replace=False)
    hits = 0
    for row in picked:
        vector = np.asarray(index.get(int(row)), dtype=np.float32)
        exact = _other(index.search(vector, top + 1, exact=True, threads=1).keys, row, top)
        approx = _other(index.search(vector, top + 1, threads=1).keys, row, top)
        hits += len(set(exact) & set(approx))
    return hits / (top * picked.size)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class SimilarIndex:
    """One release's index, loaded."""

    release: dict[str, Any]  # the pointer file's contents
    nodes: list[str]
    row_of: dict[str, int]
    index: Any  # usearch.index.Index, a memory-mapped view

    @classmethod
    def load(cls, directory: Path) -> SimilarIndex:
        """The release ``directory/current.json`` names; its files' SHA-256 are checked."""
        from usearch.index import Index

        release = json.loads((directory / POINTER).read_text())
        files = release["files"]
        vectors = directory / files["vectors"]["name"]
        index_path = directory / files["index"]["name"]
        for path, entry in ((vectors, files["vectors"]), (index_path, files["index"])):
            if _sha256(path) != entry["sha256"]:
                raise NoEmbeddingRelease(
                    f"the embedding release's file {path.name} does not match its SHA-256; "
                    "an admin should release the embeddings again"
                )
        with np.load(vectors, allow_pickle=False) as data:
            nodes = [str(x) for x in data["nodes"]]
        index = Index.restore(str(index_path), view=True)
        return cls(release, nodes, {node: i for i, node in enumerate(nodes)}, index)

    def exact(self, ef: int) -> bool:
        """Whether answers search exactly: the release measured the index below
        RECALL_TARGET, or at a greater depth than ``ef`` (PPR_SIMILAR_EF)."""
        measured = self.release["files"]["index"]
        return bool(measured["recall_at_10"] < RECALL_TARGET or ef < measured["ef"])

    def neighbours(self, node: str, k: int, ef: int) -> list[tuple[str, float]]:
        """The ``k`` nearest other nodes by cosine similarity of the released vectors."""
        row = self.row_of.get(node)
        if row is None:
            raise NodeNotInRelease(node, str(self.release["release_name"]))
        vector = np.asarray(self.index.get(row), dtype=np.float32)
        if self.exact(ef):
            found = self.index.search(vector, k + 1, exact=True, threads=1)
        else:
            if self.index.expansion_search != max(ef, k + 1):
                self.index.expansion_search = max(ef, k + 1)
            found = self.index.search(vector, k + 1, threads=1)
        out: list[tuple[str, float]] = []
        for key, distance in zip(found.keys, found.distances, strict=True):
            if int(key) != row and len(out) < k:
                out.append((self.nodes[int(key)], float(1.0 - distance)))
        return out


class SimilarIndexHolder:
    """A worker's current index: reloaded when the release pointer changes."""

    def __init__(
        self, directory: Path | None, *, release_is_live: Callable[[str, str], bool]
    ) -> None:
        self._directory = directory
        self._release_is_live = release_is_live
        self._lock = threading.Lock()
        self._loaded: SimilarIndex | None = None
        self._status: tuple[int, int, int] | None = None

    def current(self, graph_version: str) -> SimilarIndex:
        """The loaded index of ``graph_version``'s release, or :class:`NoEmbeddingRelease`."""
        if self._directory is None:
            raise NoEmbeddingRelease(
                "no embedding release is served: the server has no PPR_EMBEDDING_RELEASE_DIR "
                "(an admin releases embeddings with 'embeddings release')"
            )
        pointer = self._directory / POINTER
        try:
            info = os.stat(pointer)
        except FileNotFoundError:
            raise NoEmbeddingRelease(
                "no embedding release has been made for the served graph version yet (an "
                "admin releases one with 'embeddings release')"
            ) from None
        status = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if self._loaded is None or status != self._status:
                loaded = SimilarIndex.load(self._directory)
                name = str(loaded.release["release_name"])
                if not self._release_is_live(str(loaded.release["graph_version"]), name):
                    raise NoEmbeddingRelease(
                        f"the embedding release {name} is not recorded as released in the "
                        "ledger; an admin should release the embeddings again"
                    )
                self._loaded, self._status = loaded, status
            loaded = self._loaded
        if loaded.release["graph_version"] != graph_version:
            raise NoEmbeddingRelease(
                f"the embedding release {loaded.release['release_name']} is for graph version "
                f"{loaded.release['graph_version']}, not the served {graph_version}; an admin "
                "releases embeddings for the served version with 'embeddings release'"
            )
        return loaded
