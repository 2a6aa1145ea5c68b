"""DP-IE embeddings on the ranking path's stages: one request, or a group together.

A DP-IE answer follows the same path as a ranking, through the same ledger calls:
validation -> authorization (the charged account, as for rankings) -> a stored release or an
Idempotency-Key binding answers it as a replay -> admission (charged, refused past the cap
before anything is drawn, twins joined) -> the service account's read figure ->
PushFlowCap, InstantEmbedding, fresh OS-entropy Laplace noise -> the release stored (its
charge marked released) -> the answer. A failure before the noise draw refunds the charge.

One request is a group of one. A group (the embedding batch) runs the rankings' stages in
their order (:class:`GroupAnswers`): its keyed replays bind their keys in one transaction, its
items are admitted in one (:meth:`Admitter.admit`, each item all-or-nothing, in order, against
what the earlier items left), drawn concurrently, stored in one, and none is answered before
all are stored.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.embeddings.dp import (
    EMBEDDING_BETA,
    EMBEDDING_ROUNDS,
    dp_instant_embedding,
    dp_instant_embedding_curve,
    plan_for_graph,
)
from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.noise_free import NoiseFreeEmbeddings
from service.embeddings.release import (
    DP_IE,
    embedding_key_mechanism,
    mechanism_block,
    stored_embedding,
    stored_values,
)
from service.graph.model import Graph
from service.ledger.records import (
    Admission,
    ChargeReceipt,
    ReleaseKey,
    StoredRelease,
)
from service.mechanisms.randomness import fresh_generator
from service.privacy.laplace import LaplacePlan
from service.serving.embedding_schemas import EmbeddingAnswer, EmbeddingRequest
from service.serving.embedding_spaces import EmbeddingSpaces
from service.serving.pipeline.errors import IdempotencyKeyReused
from service.serving.pipeline.group import GroupAnswers
from service.serving.pipeline.items import Admitted, Ready, Run, Step, ToAdmit, ToBind
from service.serving.ppr_query import PprQueryService
from service.serving.schemas import QueryRequest

__all__ = ["DpEmbeddings", "EmbeddingPending"]


@dataclass(frozen=True)
class _Authorized:
    """A DP-IE request validated and authorized: what its release is keyed by."""

    req: QueryRequest  # as the ranking path's helpers read it (principal, node, mode, keys)
    graph: Graph  # one version for the whole request
    seed: int
    account_id: int  # the charged account
    key: ReleaseKey
    k: int
    sigma: float
    epsilon: float


@dataclass(frozen=True)
class _KeyedReplay:
    """A keyed request a stored release answers once its Idempotency-Key is bound to it."""

    asked: _Authorized
    stored: StoredRelease


@dataclass(frozen=True)
class EmbeddingPending:
    """A DP-IE request prepared for admission: everything decided before the ledger."""

    req: QueryRequest
    graph: Graph
    seed: int
    account_id: int
    key: ReleaseKey
    sigma: float
    epsilon: float
    hashes: EmbeddingHashes  # the version's hash functions at dimension k
    plan: LaplacePlan
    mechanism: dict[str, Any]  # what the answer states and the charge records


class DpEmbeddings(GroupAnswers[EmbeddingRequest, EmbeddingPending, _KeyedReplay, EmbeddingAnswer]):
    """DP-IE answers on the stages of ``queries`` (the ranking path's)."""

    def __init__(
        self,
        queries: PprQueryService,
        spaces: EmbeddingSpaces,
        validate: Callable[[EmbeddingRequest], tuple[int, float, float]],
    ) -> None:
        self.queries = queries
        self.ledger = queries.ledger
        self.spaces = spaces
        self._validate = validate  # (k, sigma, epsilon), or the 4xx for a bad one
        # the noise-free vectors last computed in this process (never released as they are)
        self.noise_free = NoiseFreeEmbeddings()
        # the ranking pipeline's stages this path shares
        self._preparing = queries.preparing
        self.replaying = queries.replaying
        self.admitting = queries.admitting
        self.storing = queries.storing
        self.live = queries.live
        self.refusals = queries.refusals

    # -- before admission ---------------------------------------------------------------------

    def prepare(
        self, req: EmbeddingRequest
    ) -> Step[EmbeddingAnswer, _KeyedReplay, EmbeddingPending]:
        """Everything before admission: validation, the charged account, replays of stored
        releases (a keyed request's only once its key is bound to the release), the plan."""
        k, sigma, epsilon = self._validate(req)
        graph = self.queries.graphs.current
        seed = graph.index_of(req.node)
        account_id = self._preparing.charged_account(req.principal, req.node, req.mode, graph)
        key = ReleaseKey(
            account_id, req.node, graph.version, req.mode.value, epsilon,
            embedding_key_mechanism(k, sigma),
        )  # fmt: skip
        asked = _Authorized(
            _as_query(req, epsilon), graph, seed, account_id, key, k, sigma, epsilon
        )
        if req.idempotency_key is not None:
            stored = self.replaying.release_for_idempotency_key(asked.req)
            if stored is not None:
                if stored.key != key:
                    raise IdempotencyKeyReused()
                return Ready(self._replay(stored, asked))
        if not req.fresh:
            stored = self.replaying.cached_release(key)
            if stored is not None:
                if req.idempotency_key is not None:
                    return ToBind(_KeyedReplay(asked, stored))
                return Ready(self._replay(stored, asked))
        return ToAdmit(self._plan(asked))

    def _plan(self, asked: _Authorized) -> EmbeddingPending:
        """The request prepared for admission: the hash functions (not noise: before
        admission), the Laplace plan and the mechanism description."""
        hashes = self.spaces.hashes(asked.graph, asked.k)
        plan = plan_for_graph(
            asked.epsilon, asked.sigma, asked.graph, rounds=EMBEDDING_ROUNDS, beta=EMBEDDING_BETA
        )
        block = mechanism_block(
            plan, asked.req.mode, asked.sigma, asked.k, EMBEDDING_BETA, EMBEDDING_ROUNDS,
            hashes.salt_hex,
        )  # fmt: skip
        return EmbeddingPending(
            asked.req, asked.graph, asked.seed, asked.account_id, asked.key, asked.sigma,
            asked.epsilon, hashes, plan, block,
        )  # fmt: skip

    def admission(self, p: EmbeddingPending) -> Admission:
        principal = p.req.principal
        return Admission(
            charged_account_id=p.account_id,
            principal_account_id=principal.account_id,
            seed=p.req.node,
            mechanism=DP_IE,
            mode=p.req.mode.value,
            params=p.mechanism,
            query_curve=dp_instant_embedding_curve(p.plan.epsilon),
            query_epsilon=p.plan.epsilon,
            graph_version=p.graph.version,
            request_id=p.req.request_id,
            idempotency_key=p.req.idempotency_key,
            release_key=None if p.req.fresh else p.key,
            quota_epsilon=self.queries.policy.quota_for(principal, p.account_id),
            read=self.queries.policy.read_for(principal, p.graph.version, None),
        )

    # -- after admission ----------------------------------------------------------------------

    def _draw(
        self, p: EmbeddingPending, receipt: ChargeReceipt, embedded: np.ndarray | None = None
    ) -> StoredRelease:
        """The admitted request's release, not yet stored (it must be, before answering).
        ``embedded``: its noise-free vector, if the group computed it already."""
        charge_id = receipt.charge_id
        # the ranking path's replays on this worker show the budget after this charge
        self.replaying.note_budget(p.account_id, receipt.budget)
        if p.req.principal.type == "service":  # counted by its admission: replays need no write
            self.replaying.reads.counted(p.req, p.graph.version, charge_id, None)
        try:
            if embedded is None:
                embedded = self.noise_free.vector(
                    p.graph, p.seed, p.hashes, p.sigma, p.req.mode, EMBEDDING_BETA,
                    EMBEDDING_ROUNDS,
                )  # fmt: skip
            rng = fresh_generator()
        except BaseException:
            self.ledger.settlement.refund(charge_id, reason="failed before any noise was drawn")
            raise
        drawn = dp_instant_embedding(
            p.graph, p.seed, p.hashes, p.epsilon, p.sigma, p.req.mode, EMBEDDING_BETA,
            EMBEDDING_ROUNDS, rng=rng, embedded=embedded,
        )  # fmt: skip
        return StoredRelease(
            p.key, charge_id, stored_embedding(drawn.values), p.mechanism, p.req.request_id
        )

    def fresh_answer(
        self, p: EmbeddingPending, receipt: ChargeReceipt, stored: StoredRelease
    ) -> EmbeddingAnswer:
        return EmbeddingAnswer(
            node=p.req.node,
            graph_version=p.graph.version,
            embedding=stored_values(stored.results),
            mechanism=stored.mechanism,
            budget=receipt.budget,
            replayed=False,
            request_id=p.req.request_id,
            charged_account_id=p.account_id,
            epsilon_charged=p.plan.epsilon,
        )

    def _replay(
        self, stored: StoredRelease, asked: _Authorized | EmbeddingPending
    ) -> EmbeddingAnswer:
        query = asked.req
        if query.principal.type == "service":  # counted before the replay is sent
            self.replaying.reads.record(query, stored.key.graph_version, stored.charge_id, None)
        return EmbeddingAnswer(
            node=query.node,
            graph_version=asked.graph.version,
            embedding=stored_values(stored.results),
            mechanism=stored.mechanism,
            budget=self.ledger.budgets.budget(
                asked.account_id
            ),  # read now: the same on every worker
            replayed=True,
            request_id=query.request_id,
            charged_account_id=asked.account_id,
            epsilon_charged=0.0,
            extra={"original_request_id": stored.request_id},
        )

    def replay_admitted(self, stored: StoredRelease, p: EmbeddingPending) -> EmbeddingAnswer:
        """An answer from the release admission joined: cached again, so the next identical
        request is replayed before admission (prepare looks in a shared cache only)."""
        self.replaying.cache_joined(stored)
        return self._replay(stored, p)

    # -- a group (GroupAnswers.answer_many): DP-IE's steps ------------------------------------

    def group_reads(self, reqs: Sequence[EmbeddingRequest]) -> AbstractContextManager[None]:
        return self._preparing.seed_accounts([(r.principal, r.node, r.mode) for r in reqs])

    def bind(
        self, items: list[_KeyedReplay]
    ) -> list[Ready[EmbeddingAnswer] | ToAdmit[EmbeddingPending] | BaseException]:
        return self.replaying.bind(
            items,
            keyed=lambda b: (b.asked.req, b.stored),
            replay=lambda b: Ready(self._replay(b.stored, b.asked)),
            plan=lambda b: ToAdmit(self._plan(b.asked)),
        )

    def draw_group(
        self, admitted: list[Admitted[EmbeddingPending]], run: Run
    ) -> list[StoredRelease | BaseException]:
        """Every release drawn concurrently on ``run``. The noise-free vectors are computed
        first, a block of seeds per pass over the graph (a failure there leaves each to its
        own draw, which refunds it). A service account's reads were counted by the group's
        admission, each in its item's turn, before anything was charged or drawn."""
        fresh: dict[tuple[Graph, int, str, float], list[EmbeddingPending]] = {}
        for _, p, _ in admitted:
            key = (p.graph, p.hashes.k, p.req.mode.value, p.sigma)
            fresh.setdefault(key, []).append(p)
        embedded: dict[int, np.ndarray] = {}
        for group in fresh.values():
            if len(group) < 2:
                continue
            first = group[0]
            try:
                vectors = self.noise_free.vectors(
                    first.graph, [p.seed for p in group], first.hashes, first.sigma,
                    first.req.mode, EMBEDDING_BETA, EMBEDDING_ROUNDS,
                )  # fmt: skip
            except Exception:  # each item then computes (and refunds) on its own
                continue
            embedded.update((id(p), w) for p, w in zip(group, vectors, strict=True))
        return run([
            functools.partial(self._draw, p, r, embedded.get(id(p))) for _, p, r in admitted
        ])  # fmt: skip


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
