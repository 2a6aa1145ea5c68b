"""Answering one block of seeds in a worker process, on the service's own query path.

Each worker process holds one :class:`BlockAnswerer` per (run settings, graph version): the
graph, a ledger connection pool, the caches and a :class:`PprQueryService` built as the API
builds it (:func:`build_ppr_query_service`), with one prefix cache shared by all blocks the
process answers. Every seed goes through :meth:`PprQueryService.answer`: authorize, admit
and charge in one transaction, noisy diffusion with fresh OS-entropy noise, stored release,
answer; with ``--output embeddings`` through :meth:`EmbeddingQueryService.answer`, the path of
``GET /v1/embeddings/{node}`` (the same ledger calls; PushFlowCap, InstantEmbedding, fresh
OS-entropy Laplace noise). Only then is the answer returned to the driver (and written to the
sink).

Exactly once, across retries and reruns:

* each seed's query carries the run's Idempotency-Key (:meth:`BatchSpec.idempotency_key`),
  so a seed whose release is stored is replayed, never charged again;
* before answering, an attempt *takes over* its seeds: charges still ``admitted`` under their
  keys belong to an attempt that ended (a worker that died, a task Ray retries, a run that was
  killed) and can never be released any more, so they are refunded (audited, nothing left any
  process). Should that earlier attempt still be alive somewhere, its release can no longer be
  stored once its charge is refunded, so its answer is discarded, never sent;
* a seed that fails after its charge (say the ledger became unreachable while storing) is
  refunded the same way at the end of its block, as reconciliation would do later.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Engine

from service.batch.spec import (
    BUDGET_CODES,
    NO_ACCOUNT_CODE,
    BatchSpec,
    BlockResult,
    FailureInjection,
    InjectedFailure,
    SeedOutcome,
    Status,
)
from service.cache.caches import build_caches
from service.errors import ServiceError
from service.graph.model import Graph
from service.ledger.graph_releases import GraphReleases
from service.ledger.ledger import AccountExists, Ledger
from service.ledger.records import ChargeSettled, StoredRelease, UnknownAccount
from service.ledger.settlement import Settlement
from service.ledger.synthesis_jobs import SynthesisJobs
from service.ledger.transactions import LedgerTransactions
from service.mechanisms.operator import walk_operator
from service.serving.embedding_query import (
    EmbeddingAnswer,
    EmbeddingQueryService,
    EmbeddingRequest,
)
from service.serving.graph_holder import GraphHolder
from service.serving.graph_identity import as_served
from service.serving.ppr_query import build_ppr_query_service
from service.serving.schemas import Answer, ChargedAnswer, Principal, QueryRequest

log = logging.getLogger(__name__)

_TAKEOVER_REASON = (
    "batch run {run}: an earlier attempt at this seed ended before its release was stored; "
    "nothing was released"
)
_FAILED_REASON = "batch run {run}: the seed failed before its release was stored ({code})"


class _FailingSettlement(Settlement):
    """TEST ONLY: settlement whose ``store_release`` fails once armed (see FailureInjection)."""

    def __init__(
        self,
        transactions: LedgerTransactions,
        graph_releases: GraphReleases,
        synthesis: SynthesisJobs,
        injection: FailureInjection,
    ) -> None:
        super().__init__(transactions, graph_releases, synthesis)
        self.injection = injection
        self._stores_left: int | None = None

    def arm(self, block: int) -> None:
        self._stores_left = None
        injection = self.injection
        if block != injection.block:
            return
        if injection.marker is not None:
            try:
                os.close(os.open(injection.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return  # fired already, in this or another process
        self._stores_left = injection.after

    def store_release(
        self, release: StoredRelease, *, idempotency_key: str | None, principal_account_id: int
    ) -> None:
        if self._stores_left is not None:
            if self._stores_left == 0:
                self._stores_left = None
                if self.injection.kill:
                    os._exit(70)  # charge admitted, noise drawn, release not stored
                raise InjectedFailure("injected failure before storing a release")
            self._stores_left -= 1
        super().store_release(
            release, idempotency_key=idempotency_key, principal_account_id=principal_account_id
        )


class _FailingLedger(Ledger):
    """TEST ONLY: a ledger whose settlement's ``store_release`` fails once armed."""

    def __init__(self, engine: Engine, injection: FailureInjection) -> None:
        super().__init__(engine)
        self.failing = _FailingSettlement(
            self.transactions, self.graph_releases, self.synthesis, injection
        )
        self.settlement = self.failing

    def arm(self, block: int) -> None:
        self.failing.arm(block)


@dataclass
class _Seed:
    node: str
    principal: Principal | None = None
    outcome: SeedOutcome | None = None


class BlockAnswerer:
    """One process's means to answer blocks of one run: graph, ledger, caches, query path."""

    def __init__(self, spec: BatchSpec, graph: Graph) -> None:
        settings = spec.settings
        opened = Ledger.from_url(settings.database_url, auto_migrate=False)
        if graph.degree_bound is None:  # as loaded: check the bounds, take the public id
            graph = as_served(
                graph, opened.graph_versions,
                max_degree_bound=settings.max_degree_bound,
                edge_count_bound=settings.edge_count_bound,
            )  # fmt: skip
        if graph.version != spec.graph_version:
            opened.dispose()
            raise ServiceError(
                f"this worker's graph is version {graph.version}, the run's is "
                f"{spec.graph_version}: every worker must load the same graph file"
            )
        self.ledger: Ledger = opened
        if spec.failure is not None:
            self.ledger = _FailingLedger(opened.engine, spec.failure)
        self.graph = graph
        self.cap_epsilon = settings.default_cap_epsilon
        self.delta = settings.account_delta
        caches = build_caches(settings, namespace=self.ledger.ledger_id)
        walk_operator(graph, threads=1)  # one query per core: the pool is the parallelism
        holder = GraphHolder(None, loader=lambda _path: graph)
        holder.load()
        self.queries = build_ppr_query_service(
            settings,
            graphs=holder,
            ledger=self.ledger,
            caches=caches,
            create_seed_accounts=False,  # accounts are created here, labelled with the run
            group_commit=False,  # each query in transactions of its own
        )
        # DP-IE (``--output embeddings``): the embedding endpoint's path on the same stages
        self.embeddings = EmbeddingQueryService(self.queries, settings)

    def close(self) -> None:
        self.queries.live.close()
        self.ledger.dispose()

    # -- principals ---------------------------------------------------------------------------

    def _user_account(self, spec: BatchSpec, node: str) -> int:
        existing = self.ledger.accounts.account_for_node(node)
        if existing is not None:
            return existing.account_id
        if not spec.create_missing_accounts:
            raise UnknownAccount(
                f"no account for node {node!r} (run with --create-missing-accounts to create "
                "one with the default cap)",
                details={"node": node},
            )
        actor = spec.service_account.account_id if spec.service_account is not None else None
        try:
            return self.ledger.accounts.create_account(
                "user",
                node_id=node,
                cap_epsilon=self.cap_epsilon,
                delta=self.delta,
                label=f"created by batch run {spec.run_id}",
                actor_account_id=actor,
            ).account_id
        except AccountExists:
            again = self.ledger.accounts.account_for_node(node)
            if again is None:  # pragma: no cover - the constraint said it exists
                raise
            return again.account_id

    def _principal(self, spec: BatchSpec, node: str) -> Principal:
        """Who asks for ``node``: the run's service account, or the seed's own user account."""
        service = spec.service_account
        if service is not None:
            if spec.mode.value == "personalized" and spec.create_missing_accounts:
                self._user_account(spec, node)  # the service path then finds it
            return service
        account_id = self._user_account(spec, node)
        return Principal(
            account_id=account_id, type="user", node_id=node, modes=("personalized", "edge")
        )

    # -- the block ----------------------------------------------------------------------------

    def answer_block(self, spec: BatchSpec, index: int, nodes: list[str]) -> BlockResult:
        cpu_start = time.process_time()
        if isinstance(self.ledger, _FailingLedger):
            self.ledger.arm(index)
        seeds = [_Seed(node) for node in nodes]
        for seed in seeds:
            try:
                seed.principal = self._principal(spec, seed.node)
            except ServiceError as exc:
                seed.outcome = _not_answered(seed.node, exc)
        reconciled = self._take_over(spec, seeds)
        for seed in seeds:
            if seed.outcome is None:
                seed.outcome = self._answer(spec, seed)
        failed = [s for s in seeds if s.outcome is not None and s.outcome.status == "failed"]
        reconciled += self._refund_failed(spec, failed)
        outcomes = [s.outcome for s in seeds if s.outcome is not None]
        return BlockResult(index, outcomes, reconciled, time.process_time() - cpu_start)

    def _take_over(self, spec: BatchSpec, seeds: list[_Seed]) -> int:
        """Refund charges that earlier attempts at these seeds left admitted (see module doc)."""
        pairs = [
            (s.principal.account_id, spec.idempotency_key(s.node))
            for s in seeds
            if s.principal is not None
        ]
        return refund_admitted(self.ledger, pairs, _TAKEOVER_REASON.format(run=spec.run_id))

    def _refund_failed(self, spec: BatchSpec, failed: list[_Seed]) -> int:
        refunded = 0
        for seed in failed:
            if seed.principal is None or seed.outcome is None:
                continue
            reason = _FAILED_REASON.format(run=spec.run_id, code=seed.outcome.code)
            pairs = [(seed.principal.account_id, spec.idempotency_key(seed.node))]
            try:
                refunded += refund_admitted(self.ledger, pairs, reason)
            except ServiceError:  # the ledger is down: reconciliation or a rerun settles it
                log.warning("could not refund a failed seed's charge", exc_info=True)
        return refunded

    def _embed(self, spec: BatchSpec, seed: _Seed) -> SeedOutcome:
        """The seed's DP-IE embedding, exactly as ``GET /v1/embeddings/{node}`` answers it."""
        assert seed.principal is not None
        request = EmbeddingRequest(
            principal=seed.principal,
            node=seed.node,
            k=spec.k,
            sigma=spec.sigma,
            epsilon=spec.epsilon,
            mode=spec.mode,
            fresh=spec.fresh,
            idempotency_key=spec.idempotency_key(seed.node),
            request_id=spec.request_id(seed.node),
        )
        return _seed_outcome(seed.node, request, self.embeddings.answer, _embedding_outcome)

    def _answer(self, spec: BatchSpec, seed: _Seed) -> SeedOutcome:
        """The seed's ranking, exactly as ``GET /v1/ppr/{node}`` answers it (or its embedding
        with ``--output embeddings``)."""
        if spec.output == "embeddings":
            return self._embed(spec, seed)
        assert seed.principal is not None
        request = QueryRequest(
            principal=seed.principal,
            node=seed.node,
            k=spec.k,
            epsilon=spec.epsilon,
            mode=spec.mode,
            fresh=spec.fresh,
            exclude_neighbors=spec.exclude_neighbors,
            idempotency_key=spec.idempotency_key(seed.node),
            request_id=spec.request_id(seed.node),
            mechanism=spec.mechanism,
            max_age_seconds=spec.max_age_seconds,
        )
        return _seed_outcome(seed.node, request, self.queries.answer, _ranking_outcome)


_Request = TypeVar("_Request", QueryRequest, EmbeddingRequest)
_Answer = TypeVar("_Answer", bound=ChargedAnswer)


def _seed_outcome(
    node: str,
    request: _Request,
    ask: Callable[[_Request], _Answer],
    outcome: Callable[[str, _Answer, Status, float], SeedOutcome],
) -> SeedOutcome:
    """``ask(request)`` as the seed's outcome (``outcome`` makes an answer's): a refusal is the
    seed's, skipped or failed; an unexpected error fails the seed alone (logged); an injected
    failure (test only) fails the whole attempt."""
    try:
        answer = ask(request)
    except InjectedFailure:
        raise  # test only: fails the whole attempt
    except ServiceError as exc:
        return _not_answered(node, exc)
    except Exception as exc:
        log.exception("batch seed failed", extra={"request_id": request.request_id})
        return SeedOutcome(
            node, "failed", code="internal_error", message=f"{type(exc).__name__}: {exc}"
        )
    return outcome(node, answer, *_status(answer, request.request_id))


def _ranking_outcome(node: str, answer: Answer, status: Status, charged: float) -> SeedOutcome:
    results = tuple((r.node, r.score) for r in answer.results)
    return SeedOutcome(node, status, results=results, epsilon_charged=charged)


def _embedding_outcome(
    node: str, answer: EmbeddingAnswer, status: Status, charged: float
) -> SeedOutcome:
    grid = answer.mechanism.get("score_grid")
    return SeedOutcome(
        node,
        status,
        epsilon_charged=charged,
        embedding=tuple(answer.embedding),
        hash_salt=str(answer.mechanism["hash_salt"]),
        score_grid=None if grid is None else float(grid),
    )


def _status(answer: ChargedAnswer, request_id: str) -> tuple[Status, float]:
    """A seed's status, and what this run was charged for it."""
    if not answer.replayed:
        return "answered", answer.epsilon_charged
    if answer.extra.get("original_request_id") == request_id:
        # Stored by a lost attempt of this same invocation: charged by this run.
        return "answered", float(answer.mechanism.get("epsilon", 0.0))
    return "replayed", answer.epsilon_charged


def refund_admitted(ledger: Ledger, pairs: list[tuple[int, str]], reason: str) -> int:
    """Refund the charges still admitted under these (principal, Idempotency-Key) pairs."""
    refunded = 0
    for charge in ledger.stored_releases.admitted_charges_for_keys(pairs):
        try:
            ledger.settlement.refund(charge.charge_id, reason=reason)
        except ChargeSettled:
            continue  # its release was stored meanwhile: the answer path replays it
        refunded += 1
    return refunded


def refund_dead_charges(ledger: Ledger, spec: BatchSpec, nodes: list[str], reason: str) -> int:
    """Refund what ended attempts at ``nodes`` left admitted (the driver, after a block failed
    on every attempt). Creates no account: a seed without one was never charged."""
    pairs: list[tuple[int, str]] = []
    for node in nodes:
        if spec.service_account is not None:
            principal_id = spec.service_account.account_id
        else:
            account = ledger.accounts.account_for_node(node)
            if account is None:
                continue
            principal_id = account.account_id
        pairs.append((principal_id, spec.idempotency_key(node)))
    return refund_admitted(ledger, pairs, reason)


def _not_answered(node: str, exc: ServiceError) -> SeedOutcome:
    skipped = exc.code in BUDGET_CODES or exc.code == NO_ACCOUNT_CODE
    return SeedOutcome(node, "skipped" if skipped else "failed", code=exc.code, message=exc.message)


# -- one answerer per process ---------------------------------------------------------------------

_answerers: dict[tuple[str, str], BlockAnswerer] = {}
_answerers_lock = threading.Lock()


def answerer_for(spec: BatchSpec, graph: Graph) -> BlockAnswerer:
    """This process's answerer for the run's settings and graph (built on first use)."""
    key = (spec.graph_version, spec.settings.model_dump_json() + repr(spec.failure))
    with _answerers_lock:
        answerer = _answerers.get(key)
        if answerer is None:
            for old in _answerers.values():
                old.close()
            _answerers.clear()
            answerer = BlockAnswerer(spec, graph)
            _answerers[key] = answerer
        return answerer
