"""An all-node edge-mode embedding release: ONE graph-wide release, its files and its index.

``python -m service embeddings release`` computes edge-mode DP-IE
(:mod:`service.embeddings.all_nodes`) for every node of the served graph version, or for a given
node list, and records it the way a synthesis run is recorded (:mod:`service.synthetic.release`;
the payload in the form of :mod:`service.release_payload`): admitted against the graph-wide cap
and charged to the graph-wide exposure in one transaction BEFORE anything is computed
(:meth:`GraphReleases.graph_release`); the vectors are computed inside ``draw()`` and stored in the
ledger as the release's payload, with the method, parameters and privacy unit, before any file
is written; a failed or interrupted computation refunds the charge and leaves no file. While it
computes, the release beats its heartbeat (``graph_releases.heartbeat_at``, the mechanism a
synthesis run uses), so a server's reconciler refunds it only once its process stopped beating.

**What it costs.** Each node's embedding is pure eps-DP for one edge, ANY edge (`edge` mode:
Theorems 4.3 and 5.1), and every edge can move every node's embedding, so the N embeddings are N
eps-DP releases about the same edges. They compose: the release is charged the N-fold sum of the
one-release curve (the Laplace curve at eps; RDP curves add under composition), which is pure
N eps and, converted at the exposure's delta, much less for small eps. No parallel composition
applies. `personalized` (joint-DP) embeddings are never pooled like this (spec-embeddings.md,
"All-node releases").

Files, in the ``--out`` directory (each written atomically, :mod:`service.atomic_files`: a 0600
temporary file, fsynced and renamed into place):

- ``<tag>.npz``: the released vectors (float32, exact: they are multiples of a power-of-two
  grid) and the node ids, row by row - the same bytes as the ledger's payload body;
- ``<tag>.usearch``: the nearest-neighbour index over them (:mod:`service.embeddings.similar`);
- ``current.json``: written LAST, it names the release, its graph version and both files with
  their SHA-256. The server (``PPR_EMBEDDING_RELEASE_DIR``) serves the release it names.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.atomic_files import atomic_file, check_output_path, write_atomically
from service.embeddings.all_nodes import check_rounds, edge_embeddings
from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_FLOOR,
    check_k,
    check_sigma,
    dp_instant_embedding_curve,
    plan_for_graph,
)
from service.embeddings.hashing import embedding_hashes, new_salt
from service.embeddings.similar import INDEX_SUFFIX, POINTER, build_index, measure_recall
from service.errors import InvalidParameter
from service.graph.model import Graph
from service.ledger import GraphCap, Ledger
from service.privacy.synthetic import EDGE_LEVEL
from service.release_payload import decode_payload, encode_payload

__all__ = [
    "METHOD",
    "POINTER",
    "RELEASE_PREFIX",
    "EmbeddingRelease",
    "EmbeddingRequest",
    "read_vectors",
    "release_embeddings",
    "version_salt",
]

#: Prefix of the ledger's mechanism name of every all-node embedding release.
RELEASE_PREFIX = "embeddings:edge:"
METHOD = "dp_instant_embedding"
#: How a file's temporary name beside its final one begins while it is written.
_TEMPORARY = ".embeddings-"
#: A float32 holds a multiple of the grid exactly below this many grid steps.
_FLOAT32_EXACT_STEPS = 2.0**24

Progress = Callable[[int, int], None]


def version_salt(ledger: Ledger, graph_version: str) -> bytes:
    """The salt of ``graph_version``'s embedding hash functions: the one the ledger records
    for the version (``ledger.embedding_salts.embedding_salt``, insert-if-absent), so that
    these embeddings hash like every other embedding of the version."""
    return ledger.embedding_salts.embedding_salt(graph_version, new_salt)


@dataclass(frozen=True)
class EmbeddingRequest:
    epsilon: float  # per node
    k: int
    sigma: float
    rounds: int
    nodes: Sequence[str] | None = None  # None: every node of the graph


@dataclass(frozen=True)
class EmbeddingRelease:
    release_name: str
    graph_version: str
    method: str
    mode: str
    privacy_unit: str
    epsilon_per_node: float  # achieved (the scale is rounded up)
    epsilon: float  # pure epsilon of the whole release: nodes x epsilon_per_node
    nodes: int
    parameters: dict[str, Any]
    sha256: str  # of the .npz body
    note: str

    def header(self) -> dict[str, Any]:
        return asdict(self)


def _seeds(graph: Graph, nodes: Sequence[str] | None) -> np.ndarray:
    if nodes is None:
        return np.arange(graph.n, dtype=np.int64)
    if not nodes:
        raise InvalidParameter("nodes", "the node list is empty")
    seen: set[str] = set()
    out = []
    for node in nodes:
        if node in seen:
            raise InvalidParameter("nodes", f"node {node!r} is listed twice")
        if not graph.has_node(node):
            raise InvalidParameter("nodes", f"node {node!r} is not in the graph")
        seen.add(node)
        out.append(graph.index_of(node))
    return np.asarray(out, dtype=np.int64)


def _validate(request: EmbeddingRequest, graph: Graph) -> None:
    if not (isinstance(request.epsilon, int | float) and np.isfinite(request.epsilon)
            and request.epsilon > 0):  # fmt: skip
        raise InvalidParameter("epsilon", f"must be a finite number > 0, got {request.epsilon!r}")
    check_sigma(request.sigma)
    check_k(request.k)
    check_rounds(request.rounds)
    if graph.n < 2:
        raise InvalidParameter("graph", "the graph needs at least two nodes")


def _npz(vectors: np.ndarray, node_ids: list[str]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, vectors=vectors, nodes=np.asarray(node_ids, dtype=np.str_))
    return buffer.getvalue()


def read_vectors(body: bytes | Path) -> tuple[np.ndarray, list[str]]:
    """(float32 vectors, node ids) of a release's ``.npz`` body or file."""
    source: Any = io.BytesIO(body) if isinstance(body, bytes) else body
    with np.load(source, allow_pickle=False) as data:
        return np.asarray(data["vectors"]), [str(x) for x in data["nodes"]]


def _write_index(out_dir: Path, tag: str, vectors: np.ndarray, ef: int) -> dict[str, Any]:
    """Build the index into a 0600 temporary file beside its final name, measure its recall@10
    at depth ``ef`` against exact search, then rename it."""
    name = f"{tag}{INDEX_SUFFIX}"
    with atomic_file(out_dir / name, prefix=_TEMPORARY, suffix="") as staged:
        staged.file.close()  # the index library writes the file by its name
        build_index(vectors, staged.path)
        digest = hashlib.sha256(staged.path.read_bytes()).hexdigest()
        recall = measure_recall(staged.path, ef)
    return {"name": name, "sha256": digest, "recall_at_10": recall, "ef": ef}


def release_embeddings(
    ledger: Ledger,
    graph: Graph,
    request: EmbeddingRequest,
    out_dir: Path,
    *,
    cap: GraphCap | None,
    rng_factory: Callable[[], np.random.Generator],
    progress: Progress | None = None,
    search_ef: int = 128,
    heartbeat_seconds: float = 5.0,
) -> EmbeddingRelease:
    """Admit and charge, compute, store in the ledger, then write the files and the index.
    ``graph`` is the served graph (its ``version`` the public id the ledger records);
    ``search_ef`` is the servers' PPR_SIMILAR_EF, at which the index's recall is measured.
    While the vectors are computed the release's heartbeat is refreshed every
    ``heartbeat_seconds`` (PPR_RELEASE_HEARTBEAT_SECONDS; 0: never), so the reconciler of a
    server sharing the ledger does not take a long run for a dead one and refund it."""
    _validate(request, graph)
    seeds = _seeds(graph, request.nodes)
    if not out_dir.is_dir():
        raise InvalidParameter("out", f"{out_dir} is not an existing directory")
    check_output_path(out_dir / POINTER, prefix=_TEMPORARY)
    plan = plan_for_graph(request.epsilon, request.sigma, graph, rounds=request.rounds)
    count = int(seeds.size)
    curve = dp_instant_embedding_curve(plan.epsilon) * count
    salt = version_salt(ledger, graph.version)
    tag = uuid.uuid4().hex
    name = f"{RELEASE_PREFIX}{tag}"
    kept: dict[str, Any] = {}

    def draw() -> bytes:
        hashes = embedding_hashes(graph.node_ids, salt, request.k)
        released, grid, _ = edge_embeddings(
            graph, hashes, seeds, request.epsilon, request.sigma, rng_factory(),
            rounds=request.rounds, progress=progress,
        )  # fmt: skip
        if released.size and float(np.abs(released).max()) >= _FLOAT32_EXACT_STEPS * grid:
            raise InvalidParameter("sigma", "a coordinate does not fit float32 exactly")
        vectors = released.astype(np.float32)
        body = _npz(vectors, graph.external_ids(seeds))
        release = EmbeddingRelease(
            release_name=name,
            graph_version=graph.version,
            method=METHOD,
            mode="edge",
            privacy_unit=EDGE_LEVEL,
            epsilon_per_node=plan.epsilon,
            epsilon=curve.pure,
            nodes=count,
            parameters={
                "k": request.k,
                "sigma": request.sigma,
                "rounds": request.rounds,
                "alpha": 1.0 - EMBEDDING_BETA,
                "floor": EMBEDDING_FLOOR,
                "noise_scale": plan.scale,
                "grid": grid,
                "salt": salt.hex(),
                "epsilon_requested": request.epsilon,
                "composition": f"{count}-fold RDP sum of the Laplace curve at "
                f"{plan.epsilon:g} (pure {curve.pure:g})",
            },
            sha256=hashlib.sha256(body).hexdigest(),
            note="",
        )
        kept["release"], kept["body"], kept["vectors"] = release, body, vectors
        return encode_payload(release.header(), body)

    payload = ledger.graph_releases.graph_release(
        graph.version, name, epsilon=curve.pure, curve=curve, draw=draw, cap=cap,
        heartbeat_seconds=heartbeat_seconds,
    )  # fmt: skip
    if "body" not in kept:  # another process stored this exact release: read it back
        header, body = decode_payload(payload)
        kept["release"], kept["body"] = EmbeddingRelease(**header), body
        kept["vectors"] = read_vectors(body)[0]
    release: EmbeddingRelease = kept["release"]
    vectors_name = f"{tag}.npz"
    write_atomically(out_dir / vectors_name, kept["body"], prefix=_TEMPORARY)
    pointer = {
        **release.header(),
        "files": {
            "vectors": {"name": vectors_name, "sha256": release.sha256},
            "index": _write_index(out_dir, tag, kept["vectors"], search_ef),
        },
    }
    pointer_text = json.dumps(pointer, indent=1, sort_keys=True).encode()
    write_atomically(out_dir / POINTER, pointer_text, prefix=_TEMPORARY)
    return release
