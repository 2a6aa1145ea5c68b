"""The sandbox: a synthetic release served with charging off, for backend developers.

With ``PPR_GRAPH_IS_SYNTHETIC=true`` (which ``serve`` also sets for its workers when the graph
file's SHA-256 is that of a synthetic release the ledger recorded), the service serves a
synthetic graph: the file must be, byte for
byte, a release this ledger stored (``synthesize --out`` or a job's download), else ``serve``
refuses to start. Answers are computed from the ledger's stored copy of that release (never
from whatever the file holds later) as exact personalized PageRank: the graph is already a DP
release, so anything computed from it is post-processing and charges nothing. Every answer
says ``synthetic: true``; no charge, release or read figure is written.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import numpy as np

from service.errors import Forbidden, ServiceError
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.ledger import Ledger
from service.ledger.synthesis_jobs import JobRecord
from service.mechanisms.exact import exact_ppr
from service.mechanisms.postprocess import RankedNode
from service.serving.batch import BatchItem, BatchRequest
from service.serving.schemas import Answer, QueryRequest

#: The mechanism name sandbox answers carry.
SANDBOX_MECHANISM = "synthetic_exact"


class NotASyntheticRelease(ServiceError):
    code = "not_a_synthetic_release"
    status = 422


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def synthetic_release_of(
    graph_path: Path | None, ledger: Ledger, *, required: bool
) -> JobRecord | None:
    """The synthetic release the graph file is (by SHA-256), or None when it is none and not
    ``required``; NotASyntheticRelease when ``required`` and the ledger does not know it."""
    if graph_path is None:
        if required:
            raise NotASyntheticRelease(
                "PPR_GRAPH_IS_SYNTHETIC needs a graph file (--graph / PPR_GRAPH_PATH) that is a "
                "synthetic release of this ledger; the built-in demo graph is not one"
            )
        return None
    if not required and not ledger.any_synthetic_release():
        return None  # nothing to recognise: the file is not hashed
    job = ledger.synthetic_release_by_sha256(file_sha256(graph_path))
    if job is None and required:
        raise NotASyntheticRelease(
            f"{graph_path} is not a synthetic release this ledger recorded (no finished "
            "synthesis run has its SHA-256): serve the file synthesize --out wrote or a job's "
            "download, unchanged, against the ledger that made it",
            details={"graph": str(graph_path)},
        )
    return job


class SandboxQueries:
    """Answers on the stored synthetic release: exact PPR, nothing charged."""

    def __init__(self, ledger: Ledger, job: JobRecord, *, beta: float) -> None:
        from service.synthetic.release import decode_payload

        payload = ledger.synthesis_payload(job.job_id)
        if payload is None:  # pragma: no cover - a done job always has its payload
            raise NotASyntheticRelease(f"synthetic release {job.job_id} has no stored payload")
        _, text = decode_payload(payload)
        self.job = job
        self.graph: Graph = load_edge_list("synthetic release", raw=text)
        self._ledger = ledger
        self._beta = beta

    def answer(self, req: QueryRequest) -> Answer:
        if req.principal.type == "admin":
            raise Forbidden("admin accounts cannot query; use a user or service key")
        graph = self.graph
        seed = graph.index_of(req.node)  # unknown_node
        scores = exact_ppr(graph, seed, self._beta)
        hidden = np.zeros(graph.n, dtype=bool)
        hidden[seed] = True
        if req.exclude_neighbors:
            hidden[graph.indices[graph.indptr[seed] : graph.indptr[seed + 1]]] = True
        candidates = np.flatnonzero(~hidden)
        order = candidates[np.argsort(-scores[candidates], kind="stable")[: req.k]]
        ids = graph.external_ids(order)
        return Answer(
            node=req.node,
            graph_version=self.job.graph_version,
            results=[RankedNode(n, float(s)) for n, s in zip(ids, scores[order], strict=True)],
            mechanism={
                "name": SANDBOX_MECHANISM,
                "mode": req.mode.value,
                "epsilon": 0.0,
                "delta": 0.0,
                "noise_scale": 0.0,
                "beta": self._beta,
            },
            budget=self._ledger.budget(req.principal.account_id),
            replayed=False,
            request_id=req.request_id or uuid.uuid4().hex,
            charged_account_id=req.principal.account_id,
            epsilon_charged=0.0,
        )

    def answer_batch(self, request: BatchRequest) -> list[BatchItem[Answer]]:
        if request.principal.type == "admin":
            raise Forbidden("admin accounts cannot query; use a user or service key")
        items: list[BatchItem[Answer]] = []
        for node in request.nodes:
            req = QueryRequest(
                principal=request.principal, node=node, k=request.k, epsilon=request.epsilon,
                mode=request.mode, exclude_neighbors=request.exclude_neighbors,
                request_id=request.request_id,
            )  # fmt: skip
            try:
                items.append(BatchItem(node=node, answer=self.answer(req)))
            except ServiceError as exc:
                items.append(BatchItem(node=node, error=exc))
        return items
