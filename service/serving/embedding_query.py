"""Serving node embeddings: DP-IE answers and the free embedding of a stored release.

A DP-IE answer follows the same path as a ranking, through the same ledger calls:
validation -> authorization (the charged account, as for rankings) -> a stored release or an
Idempotency-Key binding answers it as a replay -> admission (one transaction: charged, refused
past the cap before anything is drawn, twins joined) -> the service account's read figure ->
PushFlowCap, InstantEmbedding, fresh OS-entropy Laplace noise -> the release stored (its
charge marked released) -> the answer. A failure before the noise draw refunds the charge.

The free embedding of a stored release is post-processing: the caller names a query whose
release it may replay (node, mode, epsilon, ranking mechanism); the answer is the
InstantEmbedding of that stored release under the version's hash functions, charges nothing,
and names the release it came from. A caller who could not replay it gets the refusal a
replay would.

This module uses the ranking pipeline's stages (:mod:`service.serving.pipeline`: the charged
account from ``prepare``, quotas and the graph-wide cap from ``admit``, stored releases, twins
and read figures from ``replay``, storing from ``store``), so both kinds answer alike.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.config import MechanismSettings
from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_ROUNDS,
    dp_instant_embedding,
    dp_instant_embedding_curve,
    plan_dp_instant_embedding,
)
from service.embeddings.dp import MAX_K as DP_IE_MAX_K
from service.embeddings.hashing import EmbeddingHashes, embedding_hashes, new_salt
from service.embeddings.release import (
    DP_IE,
    FREE_EMBEDDING,
    embedding_key_mechanism,
    free_embedding_of,
    mechanism_block,
    stored_embedding,
    stored_values,
)
from service.errors import Forbidden, InvalidParameter, NotFound
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import (
    Admission,
    BudgetView,
    ReadCapExhausted,
    ReleaseKey,
    StoredRelease,
)
from service.mechanisms.pushflowcap import pushflowcap
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.registry import RankingMechanism, resolve_mechanism
from service.privacy.modes import Mode
from service.serving.pipeline.errors import IdempotencyKeyReused, RequestInProgress
from service.serving.ppr_query import PprQueryService
from service.serving.rankings import degree_release_name
from service.serving.schemas import Principal, QueryRequest

__all__ = [
    "EmbeddingAnswer",
    "EmbeddingQueryService",
    "EmbeddingRequest",
    "EmbeddingSpaces",
    "FreeEmbeddingRequest",
    "NoRelease",
]

#: How often admission is retried after the twin it joined was refunded.
_MAX_ADMISSIONS = 3


class NoRelease(NotFound):
    """No stored release of the named query that the caller may replay."""

    code = "no_release"


@dataclass(frozen=True)
class EmbeddingRequest:
    principal: Principal
    node: str
    k: int | None = None  # None: PPR_EMBEDDING_DEFAULT_K
    sigma: float | None = None  # None: PPR_EMBEDDING_DEFAULT_SIGMA
    epsilon: float | None = None  # None: PPR_DEFAULT_EPSILON
    mode: Mode = Mode.PERSONALIZED
    fresh: bool = False
    idempotency_key: str | None = None
    request_id: str = ""


@dataclass(frozen=True)
class FreeEmbeddingRequest:
    """The free embedding of the stored release of the ranking query (node, mode, epsilon,
    mechanism) the caller may replay."""

    principal: Principal
    node: str
    k: int | None = None
    epsilon: float | None = None
    mode: Mode = Mode.PERSONALIZED
    mechanism: str | None = None  # None: the ranking default for the mode
    request_id: str = ""


@dataclass(frozen=True)
class EmbeddingAnswer:
    node: str
    graph_version: str
    embedding: list[float]
    mechanism: dict[str, Any]
    budget: BudgetView
    replayed: bool
    request_id: str
    charged_account_id: int
    epsilon_charged: float = 0.0
    #: The free embedding: the stored release it was computed from.
    source: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class EmbeddingSpaces:
    """The hash functions h_k, h_sgn of each (graph version, k), keyed by the version's salt
    as the ledger records it (drawn once per version, the same on every worker), kept for the
    last ``capacity`` pairs in this process."""

    def __init__(self, ledger: Ledger, capacity: int = 8) -> None:
        self._ledger = ledger
        self._capacity = capacity
        self._lock = threading.Lock()
        self._salts: dict[str, bytes] = {}
        self._spaces: OrderedDict[tuple[str, int], EmbeddingHashes] = OrderedDict()

    def salt(self, graph_version: str) -> bytes:
        """The version's salt (recorded once, never changed: safe to keep)."""
        hit = self._salts.get(graph_version)
        if hit is None:
            hit = self._ledger.embedding_salt(graph_version, new_salt)
            with self._lock:
                if len(self._salts) > 64:
                    self._salts.clear()
                self._salts[graph_version] = hit
        return hit

    def hashes(self, graph: Graph, k: int) -> EmbeddingHashes:
        key = (graph.version, k)
        with self._lock:
            hit = self._spaces.get(key)
            if hit is not None:
                self._spaces.move_to_end(key)
                return hit
        ids = graph.external_ids(np.arange(graph.n, dtype=np.int64))
        made = embedding_hashes(ids, self.salt(graph.version), k)
        with self._lock:
            self._spaces[key] = made
            while len(self._spaces) > self._capacity:
                self._spaces.popitem(last=False)
        return made


class EmbeddingQueryService:
    """DP-IE answers and free embeddings, on the ranking path's ledger and helpers."""

    def __init__(
        self,
        queries: PprQueryService,
        settings: MechanismSettings,
        spaces: EmbeddingSpaces | None = None,
    ) -> None:
        self.queries = queries
        self.ledger = queries.ledger
        # the ranking pipeline's stages this path shares
        self._preparing = queries.preparing
        self._replaying = queries.replaying
        self._admitting = queries.admitting
        self._storing = queries.storing
        self.settings = settings
        self.spaces = spaces if spaces is not None else EmbeddingSpaces(queries.ledger)

    # -- validation -----------------------------------------------------------------------

    def _own_node_only(self, principal: Principal, node: str) -> None:
        if principal.type == "user" and principal.node_id != node:
            # before the graph lookup: the same 403 for another user's node and a missing one
            raise Forbidden("a user account may query only its own node")

    def _dimension(self, k: int | None) -> int:
        s = self.settings
        k = s.embedding_default_k if k is None else k
        largest = min(s.max_k, DP_IE_MAX_K)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= largest:
            raise InvalidParameter(
                "k", f"must be an integer in [1, {largest}] (the dimension), got {k}"
            )
        return k

    def _epsilon(self, epsilon: float | None) -> float:
        s = self.settings
        epsilon = s.default_epsilon if epsilon is None else epsilon
        if not math.isfinite(epsilon) or not s.epsilon_min <= epsilon <= s.epsilon_max:
            raise InvalidParameter(
                "epsilon", f"must be in [{s.epsilon_min}, {s.epsilon_max}], got {epsilon}"
            )
        return float(epsilon)

    def _sigma(self, sigma: float | None) -> float:
        s = self.settings
        sigma = s.embedding_default_sigma if sigma is None else sigma
        if not math.isfinite(sigma) or not s.embedding_min_sigma <= sigma <= s.embedding_max_sigma:
            raise InvalidParameter(
                "sigma",
                f"must be in [{s.embedding_min_sigma:g}, {s.embedding_max_sigma:g}], got {sigma}",
            )
        return float(sigma)

    def parameters(
        self, k: int | None, sigma: float | None, epsilon: float | None
    ) -> tuple[int, float, float]:
        """(k, sigma, epsilon) with the defaults filled in, or the 4xx for a bad one (what a
        batch checks once for all its items)."""
        return self._dimension(k), self._sigma(sigma), self._epsilon(epsilon)

    def validate(self, req: EmbeddingRequest) -> tuple[int, float, float]:
        """(k, sigma, epsilon) of a DP-IE request, or the 4xx for a bad one."""
        self._own_node_only(req.principal, req.node)
        return self.parameters(req.k, req.sigma, req.epsilon)

    # -- DP-IE ------------------------------------------------------------------------------

    def answer(self, req: EmbeddingRequest) -> EmbeddingAnswer:
        k, sigma, epsilon = self.validate(req)
        graph = self.queries.graphs.current  # one version for the whole request
        seed = graph.index_of(req.node)
        account_id = self._preparing.charged_account(req.principal, req.node, req.mode, graph)
        key = ReleaseKey(
            account_id, req.node, graph.version, req.mode.value, epsilon,
            embedding_key_mechanism(k, sigma),
        )  # fmt: skip
        query = _as_query(req, epsilon)
        if req.idempotency_key is not None:
            stored = self._replaying.release_for_idempotency_key(query)
            if stored is not None:
                if stored.key != key:
                    raise IdempotencyKeyReused()
                return self._replay(stored, query, graph, account_id)
        if not req.fresh:
            stored = self._replaying.find_release(key)
            if stored is not None and self._bound_to(stored, query):
                return self._replay(stored, query, graph, account_id)
        hashes = self.spaces.hashes(graph, k)  # the salt is not noise: before admission
        plan = plan_dp_instant_embedding(epsilon, sigma, graph.n)
        block = mechanism_block(
            plan, req.mode, sigma, k, EMBEDDING_BETA, EMBEDDING_ROUNDS, hashes.salt_hex
        )
        admission = Admission(
            charged_account_id=account_id,
            principal_account_id=req.principal.account_id,
            seed=req.node,
            mechanism=DP_IE,
            mode=req.mode.value,
            params=block,
            query_curve=dp_instant_embedding_curve(plan.epsilon),
            query_epsilon=plan.epsilon,
            graph_version=graph.version,
            request_id=req.request_id,
            idempotency_key=req.idempotency_key,
            release_key=None if req.fresh else key,
            quota_epsilon=self._admitting.quota_for(req.principal, account_id),
        )
        for _ in range(_MAX_ADMISSIONS):
            receipt = self.ledger.admit(
                admission,
                graph_cap=self._admitting.graph_cap(graph),
                stale_after_seconds=self.queries.policy.stale_after_seconds,
            )
            if not (receipt.reused or receipt.joined):
                break
            # an identical request (or a retry under the same key) was admitted first: its
            # release is the answer once stored; if it was refunded, admission runs again
            twin = self._replaying.wait_for_release(receipt.charge_id)
            if twin is not None:
                if twin.key != key:
                    raise IdempotencyKeyReused()
                self._replaying.cache_bound([(twin, req.principal.account_id, req.idempotency_key)])
                return self._replay(twin, query, graph, account_id)
        else:
            raise RequestInProgress(
                "an identical request is still being answered; retry shortly", retry_after=1
            )
        charge_id = receipt.charge_id
        # the ranking path's replays on this worker show the budget after this charge
        self._replaying.note_budget(account_id, receipt.budget)
        if req.principal.type == "service":
            try:  # before any noise is drawn: a refused read refunds the fresh charge
                self._replaying.reads.record(query, graph.version, charge_id, None)
            except ReadCapExhausted:
                reason = "refused by the service account's read cap before any noise was drawn"
                self.ledger.refund(charge_id, reason=reason)
                raise
        try:
            capped = pushflowcap(graph, seed, EMBEDDING_BETA, EMBEDDING_ROUNDS, sigma, req.mode)
            rng = fresh_generator()
        except BaseException:
            self.ledger.refund(charge_id, reason="failed before any noise was drawn")
            raise
        drawn = dp_instant_embedding(
            graph, seed, hashes, epsilon, sigma, req.mode, EMBEDDING_BETA, EMBEDDING_ROUNDS,
            rng=rng, capped=capped,
        )  # fmt: skip
        stored = StoredRelease(
            key, charge_id, stored_embedding(drawn.values), block, req.request_id
        )
        self._storing.store(stored, query)  # before the answer leaves the process, or none
        return EmbeddingAnswer(
            node=req.node,
            graph_version=graph.version,
            embedding=[float(x) for x in drawn.values],
            mechanism=block,
            budget=receipt.budget,
            replayed=False,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=plan.epsilon,
        )

    def _bound_to(self, stored: StoredRelease, query: QueryRequest) -> bool:
        """A stored release answers a keyed request only once the key is bound to it (a key
        bound to another charge goes on to admission, which answers with that charge's)."""
        if query.idempotency_key is None:
            return True
        principal = query.principal.account_id
        bound = self.ledger.bind_idempotency_keys(
            [(principal, query.idempotency_key, stored.charge_id)]
        )
        if bound[0] != stored.charge_id:
            return False
        self._replaying.cache_bound([(stored, principal, query.idempotency_key)])
        return True

    def _replay(
        self, stored: StoredRelease, query: QueryRequest, graph: Graph, account_id: int
    ) -> EmbeddingAnswer:
        if query.principal.type == "service":  # counted before the replay is sent
            self._replaying.reads.record(query, stored.key.graph_version, stored.charge_id, None)
        return EmbeddingAnswer(
            node=query.node,
            graph_version=graph.version,
            embedding=stored_values(stored.results),
            mechanism=stored.mechanism,
            budget=self.ledger.budget(account_id),  # read now: the same on every worker
            replayed=True,
            request_id=query.request_id,
            charged_account_id=account_id,
            epsilon_charged=0.0,
            extra={"original_request_id": stored.request_id},
        )

    # -- the free embedding of a stored release ----------------------------------------------

    def free(self, req: FreeEmbeddingRequest) -> EmbeddingAnswer:
        self._own_node_only(req.principal, req.node)
        k = self._dimension(req.k)
        epsilon = self._epsilon(req.epsilon)
        name = resolve_mechanism(req.mechanism, req.mode, self.settings.default_mechanism)
        if name is RankingMechanism.POPULAR:
            raise InvalidParameter(
                "mechanism",
                "popular has no stored release per query (it ranks the graph version's degree "
                "release); name a mechanism whose answer you received",
            )
        graph = self.queries.graphs.current
        seed = graph.index_of(req.node)
        account_id = self._replaying_account(req.principal, req.node, req.mode, graph)
        key = ReleaseKey(account_id, req.node, graph.version, req.mode.value, epsilon, name.value)
        stored = self._replaying.find_release(key)
        if stored is None:
            raise NoRelease(
                f"no stored {name.value} release of node {req.node!r} in {req.mode.value} mode at "
                f"epsilon {epsilon:g} on the current graph version for this account; ask "
                "GET /v1/ppr/{node} with these parameters first (charged), then ask again",
                details={"node": req.node, "mode": req.mode.value, "epsilon": epsilon,
                         "mechanism": name.value},
            )  # fmt: skip
        query = QueryRequest(
            principal=req.principal, node=req.node, k=1, epsilon=epsilon, mode=req.mode,
            request_id=req.request_id, mechanism=name.value,
        )  # fmt: skip
        if req.principal.type == "service":  # what a replay of it would count, once
            scale = stored.mechanism.get("degree_noise_scale")
            degree = None if scale is None else degree_release_name(float(scale))
            self._record_reads_of(query, stored, degree)
        hashes = self.spaces.hashes(graph, k)
        top = self.queries.replay_store_top
        normalize = name is not RankingMechanism.NOISY_DIFFUSION
        entries = list(stored.results[:top])
        values = free_embedding_of(graph, entries, seed, hashes, normalize)
        return EmbeddingAnswer(
            node=req.node,
            graph_version=graph.version,
            embedding=[float(x) for x in values],
            mechanism={
                "name": FREE_EMBEDDING,
                "mode": req.mode.value,
                "epsilon": 0.0,
                "delta": 0.0,
                "dimension": k,
                "hash_salt": hashes.salt_hex,
                "normalized": normalize,
                "entries": len(entries),
                "store_top": top,
            },
            budget=self.ledger.budget(account_id),  # read now: the same on every worker
            replayed=True,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=0.0,
            source={
                "release_request_id": stored.request_id,
                "node": req.node,
                "mode": req.mode.value,
                "epsilon": epsilon,
                "mechanism": stored.mechanism,
                "graph_version": stored.key.graph_version,
            },
        )

    def _record_reads_of(
        self, query: QueryRequest, stored: StoredRelease, degree: str | None
    ) -> None:
        self._replaying.reads.record(query, stored.key.graph_version, stored.charge_id, degree)

    def _replaying_account(self, principal: Principal, node: str, mode: Mode, graph: Graph) -> int:
        """The account whose release a replay by ``principal`` would return (never creates
        one: without a seed account there is no release to replay)."""
        if (
            principal.type == "service"
            and mode is Mode.PERSONALIZED
            and "personalized" in (principal.modes)
        ):
            account = self.ledger.account_for_node(node)
            if account is None:
                raise NoRelease(
                    f"no stored release of node {node!r}: it has no account",
                    details={"node": node},
                )
            return account.account_id
        return self._preparing.charged_account(principal, node, mode, graph)


def _as_query(req: EmbeddingRequest, epsilon: float) -> QueryRequest:
    """The request as the ranking path's helpers read it (principal, node, mode, keys)."""
    return QueryRequest(
        principal=req.principal,
        node=req.node,
        k=1,
        epsilon=epsilon,
        mode=req.mode,
        fresh=req.fresh,
        idempotency_key=req.idempotency_key,
        request_id=req.request_id,
        mechanism=DP_IE,
    )
