"""Serving node embeddings: DP-IE answers and the free embedding of a stored release.

A DP-IE answer follows the same path as a ranking, through the same ledger calls and stages
(:mod:`service.serving.dp_embeddings`): one request is a group of one, a group (the embedding
batch) is admitted in one transaction and stored in one, as a ranking batch.

The free embedding of a stored release is post-processing: the caller names a query whose
release it may replay (node, mode, epsilon, ranking mechanism); the answer is the
InstantEmbedding of that stored release under the version's hash functions, charges nothing,
and names the release it came from. A caller who could not replay it gets the refusal a
replay would.

This module uses the ranking pipeline's stages (:mod:`service.serving.pipeline`: the charged
account from ``prepare``, stored releases and read figures from ``replay``), so both kinds
answer alike.
"""

from __future__ import annotations

import math

from service.config import MechanismSettings
from service.embeddings.dp import MAX_K as DP_IE_MAX_K
from service.embeddings.release import FREE_EMBEDDING, free_embedding_of
from service.errors import Forbidden, InvalidParameter, NotFound, shown
from service.graph.model import Graph
from service.ledger.records import ReleaseKey, StoredRelease
from service.mechanisms.registry import RankingMechanism, resolve_mechanism
from service.privacy.modes import Mode
from service.serving.dp_embeddings import DpEmbeddings
from service.serving.embedding_schemas import (
    EmbeddingAnswer,
    EmbeddingRequest,
    FreeEmbeddingRequest,
)
from service.serving.embedding_spaces import EmbeddingSpaces
from service.serving.pipeline.items import Run
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


class NoRelease(NotFound):
    """No stored release of the named query that the caller may replay."""

    code = "no_release"


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
        self.settings = settings
        self.spaces = spaces if spaces is not None else EmbeddingSpaces(queries.ledger)
        self.dp = DpEmbeddings(queries, self.spaces, self.validate)

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

    # -- DP-IE (DpEmbeddings) ------------------------------------------------------------------

    def answer(self, req: EmbeddingRequest) -> EmbeddingAnswer:
        """A DP-IE answer: a group of one through the stages."""
        return self.dp.answer(req)

    def answer_many(
        self, reqs: list[EmbeddingRequest], run: Run
    ) -> list[EmbeddingAnswer | BaseException]:
        """DP-IE answers to ``reqs`` (or each one's error), admitted in one ledger transaction
        and stored in one, as a ranking batch's (:meth:`GroupAnswers.answer_many`)."""
        return self.dp.answer_many(reqs, run)

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
                f"no stored {name.value} release of node {shown(req.node)} in {req.mode.value} "
                f"mode at epsilon {epsilon:g} on the current graph version for this account; ask "
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
            budget=self.ledger.budgets.budget(account_id),  # read now: the same on every worker
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
            account = self.ledger.accounts.account_for_node(node)
            if account is None:
                raise NoRelease(
                    f"no stored release of node {shown(node)}: it has no account",
                    details={"node": node},
                )
            return account.account_id
        return self._preparing.charged_account(principal, node, mode, graph)
