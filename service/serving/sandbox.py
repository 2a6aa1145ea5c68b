"""The sandbox: a synthetic release served to backend developers, each account charged once.

With ``PPR_GRAPH_IS_SYNTHETIC=true`` (which ``serve`` also sets for its workers when the graph
file's SHA-256 is that of a synthetic release the ledger recorded), the service serves a
synthetic graph: the file must be, byte for byte, a release this ledger stored (``synthesize
--out`` or a job's download), else ``serve`` refuses to start. Answers are computed from the
ledger's stored copy of that release (never from whatever the file holds later) as exact
personalized PageRank: post-processing of the release.

Every answer an account receives is inside its promise: before anything computed from the
release leaves the process (the answer, or whether a node exists in the synthetic graph), the
release is charged to the account the answer is for, once per release, the way a graph
version's degree release is charged once per version to each account that receives
``popular`` (docs/privacy.md, section 6b):

- what is charged: the release's own recorded curve (``synthetic_release`` charge); for a
  ``chung_lu`` release, which is post-processing of the graph version's degree release and
  nothing else, that degree release itself (the same charge ``popular`` makes, so an account
  that paid it there pays nothing here, and the reverse);
- who pays: the caller (a user; a service account in ``edge`` mode), or the seed user when a
  service account granted ``personalized`` asks (within the service account's 24-hour quota),
  exactly as the degree release; a service account also counts the release in its read figure
  (refused past its read cap) before it receives anything;
- past the cap: ``403 budget_exhausted`` and nothing charged. The ledger decides under the
  account's lock, backed by a unique index: concurrent requests on any worker charge it once.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.errors import Forbidden, ServiceError
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.ledger import BudgetView, DegreeCharge, Ledger, ReadCapExhausted, SyntheticCharge
from service.ledger.synthesis_jobs import JobRecord
from service.mechanisms.exact import exact_ppr
from service.mechanisms.postprocess import RankedNode
from service.privacy.sampler import stored_release_delta
from service.release_payload import decode_payload
from service.serving.batch import BatchItem, BatchRequest
from service.serving.pipeline.prepare import charged_account
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
    if not required and not ledger.synthesis.any_synthetic_release():
        return None  # nothing to recognise: the file is not hashed
    job = ledger.synthesis.synthetic_release_by_sha256(file_sha256(graph_path))
    if job is None and required:
        raise NotASyntheticRelease(
            f"{graph_path} is not a synthetic release this ledger recorded (no finished "
            "synthesis run has its SHA-256): serve the file synthesize --out wrote or a job's "
            "download, unchanged, against the ledger that made it",
            details={"graph": str(graph_path)},
        )
    return job


@dataclass(frozen=True)
class SandboxRules:
    """What the sandbox needs of the settings: who pays, and the service accounts' limits."""

    create_seed_accounts: bool = False
    default_cap_epsilon: float = 1.0
    account_delta: float = 1e-6
    service_quota_epsilon: float | None = None
    service_read_cap_epsilon: float | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> SandboxRules:
        return cls(
            create_seed_accounts=settings.create_seed_accounts,
            default_cap_epsilon=settings.default_cap_epsilon,
            account_delta=settings.account_delta,
            service_quota_epsilon=settings.service_quota_epsilon,
            service_read_cap_epsilon=settings.service_read_cap_epsilon,
        )


@dataclass(frozen=True)
class _Paid:
    """A receipt for the release, as this sandbox charged it (or found it paid)."""

    budget: BudgetView
    charged: bool


class SandboxQueries:
    """Answers on the stored synthetic release: exact PPR, the release charged once per account
    that receives one."""

    def __init__(
        self, ledger: Ledger, job: JobRecord, *, beta: float, rules: SandboxRules | None = None
    ) -> None:
        payload = ledger.synthesis.synthesis_payload(job.job_id)
        if payload is None:  # pragma: no cover - a done job always has its payload
            raise NotASyntheticRelease(f"synthetic release {job.job_id} has no stored payload")
        _, text = decode_payload(payload)
        self.job = job
        self.graph: Graph = load_edge_list("synthetic release", raw=text)
        self._ledger = ledger
        self._beta = beta
        self._rules = rules or SandboxRules()
        self.charged_release = _charged_release(ledger, job)

    # -- the charge ---------------------------------------------------------------------------

    def _charged_account(self, req: QueryRequest) -> int:
        """The account the answer is for: the caller, or the seed user (a service account in
        personalized mode), as for the degree release. Users may ask about any node: the
        synthetic graph is the release they pay for."""
        r = self._rules
        return charged_account(
            self._ledger, req.principal, req.node, req.mode,
            create_seed_accounts=r.create_seed_accounts, cap_epsilon=r.default_cap_epsilon,
            delta=r.account_delta,
        )  # fmt: skip

    def _pay(self, req: QueryRequest, account_id: int) -> _Paid:
        """Count the release in a service account's read figure, then admit its charge to
        ``account_id`` (free when paid already; BudgetExhausted past the cap): in the ledger,
        before anything computed from the release is sent."""
        principal = req.principal
        release = self.charged_release
        if principal.type == "service":
            try:
                self._ledger.read_figures.record_reads(
                    principal.account_id,
                    graph_release=(release.graph_version, release.name),
                    default_cap_epsilon=self._rules.service_read_cap_epsilon,
                )
            except ReadCapExhausted as refusal:
                self._ledger.reports.record_refusal(
                    refusal.code, principal_account_id=principal.account_id, mode=req.mode.value
                )
                raise
        quota = None
        if principal.type == "service" and account_id != principal.account_id:
            quota = principal.quota_epsilon
            if quota is None:
                quota = self._rules.service_quota_epsilon
        if release.degree is not None:
            receipt = self._ledger.quota_and_degree.admit_degree_release(
                charged_account_id=account_id, principal_account_id=principal.account_id,
                seed=req.node, mode=req.mode.value, degree=release.degree,
                request_id=req.request_id, quota_epsilon=quota,
            )  # fmt: skip
        else:
            receipt = self._ledger.quota_and_degree.admit_synthetic_release(
                charged_account_id=account_id, principal_account_id=principal.account_id,
                seed=req.node, mode=req.mode.value,
                release=SyntheticCharge(release.graph_version, release.name),
                request_id=req.request_id, quota_epsilon=quota,
            )  # fmt: skip
        return _Paid(receipt.budget, receipt.charged)

    # -- the answers --------------------------------------------------------------------------

    def answer(self, req: QueryRequest) -> Answer:
        if req.principal.type == "admin":
            raise Forbidden("admin accounts cannot query; use a user or service key")
        account_id = self._charged_account(req)
        return self._answer(req, account_id, self._pay(req, account_id))

    def _answer(self, req: QueryRequest, account_id: int, paid: _Paid) -> Answer:
        graph = self.graph
        seed = graph.index_of(req.node)  # unknown_node, once the release is paid for
        scores = exact_ppr(graph, seed, self._beta)
        hidden = np.zeros(graph.n, dtype=bool)
        hidden[seed] = True
        if req.exclude_neighbors:
            hidden[graph.indices[graph.indptr[seed] : graph.indptr[seed + 1]]] = True
        candidates = np.flatnonzero(~hidden)
        order = candidates[np.argsort(-scores[candidates], kind="stable")[: req.k]]
        ids = graph.external_ids(order)
        release = self.charged_release
        return Answer(
            node=req.node,
            graph_version=self.job.graph_version,
            results=[RankedNode(n, float(s)) for n, s in zip(ids, scores[order], strict=True)],
            mechanism={
                "name": SANDBOX_MECHANISM,
                "mode": req.mode.value,
                "epsilon": release.epsilon,
                "delta": release.delta,
                "noise_scale": 0.0,
                "beta": self._beta,
                "release": self.job.release_name,
                "privacy_unit": self.job.privacy_unit,
                "release_charge": release.how_charged,
            },
            budget=paid.budget,
            replayed=False,
            request_id=req.request_id or uuid.uuid4().hex,
            charged_account_id=account_id,
            epsilon_charged=release.epsilon if paid.charged else 0.0,
        )

    def answer_batch(self, request: BatchRequest) -> list[BatchItem[Answer]]:
        """Each item as the single query, in order; an item that fails carries its error."""
        if request.principal.type == "admin":
            raise Forbidden("admin accounts cannot query; use a user or service key")
        items: list[BatchItem[Answer]] = []
        paid: dict[int, _Paid] = {}  # accounts this call found paid (charges are never refunded)
        for node in request.nodes:
            req = QueryRequest(
                principal=request.principal, node=node, k=request.k, epsilon=request.epsilon,
                mode=request.mode, exclude_neighbors=request.exclude_neighbors,
                request_id=request.request_id,
            )  # fmt: skip
            try:
                account_id = self._charged_account(req)
                if account_id in paid:
                    receipt = _Paid(paid[account_id].budget, charged=False)
                else:
                    receipt = self._pay(req, account_id)
                    paid[account_id] = receipt
                items.append(BatchItem(node=node, answer=self._answer(req, account_id, receipt)))
            except ServiceError as exc:
                items.append(BatchItem(node=node, error=exc))
        return items


@dataclass(frozen=True)
class ChargedRelease:
    """The release an account pays for to receive a sandbox's answers: the synthetic release
    itself, or (``chung_lu``) the degree release it post-processes (``degree`` set)."""

    graph_version: str
    name: str
    epsilon: float
    delta: float
    how_charged: str
    degree: DegreeCharge | None = None


def _charged_release(ledger: Ledger, job: JobRecord) -> ChargedRelease:
    """What receiving this release costs an account, from the ledger's record of it."""
    source = job.parameters.get("post_processing_of") if job.method == "chung_lu" else None
    name = str(source) if source is not None else job.release_name
    cost = ledger.graph_releases.graph_release_cost(job.graph_version, name)
    if cost is None:
        raise NotASyntheticRelease(
            f"the release {name} behind {job.release_name} is not a live release of this ledger"
        )
    epsilon, curve = cost
    if source is not None:
        return ChargedRelease(
            job.graph_version, name, epsilon, stored_release_delta(epsilon, curve.sampler_tv),
            "post-processing of the graph version's degree release "
            f"({name}): that release is charged to each account once per version, with its "
            "first answer built on it (popular, blended or this sandbox)",
            DegreeCharge(job.graph_version, epsilon, curve),
        )  # fmt: skip
    return ChargedRelease(
        job.graph_version, name, epsilon, float(job.delta),
        "one per synthetic release: charged to each account once, with its first answer "
        "computed from it",
    )  # fmt: skip
