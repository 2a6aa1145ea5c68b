"""Answering one private PPR query: authorize, admit and charge, release, post-process, store.

Data flows one way: request -> authorization -> admission (ledger, one transaction) ->
mechanism (fresh OS-entropy noise) -> post-processing -> stored release -> answer.
Nothing noisy is drawn before the charge is committed. A failure before the first noise draw
is refunded with a compensating ledger row; after it, the charge stays.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np

from service.cache.caches import PrefixCache, ReplayCache
from service.config import MechanismSettings
from service.errors import Conflict, Forbidden, InvalidParameter
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import ReleaseKey, StoredRelease
from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
from service.mechanisms.postprocess import RankedNode, ranked_results
from service.mechanisms.randomness import fresh_generator
from service.privacy.calibration import DiffusionPlan
from service.privacy.modes import Mode
from service.serving.graph_holder import GraphHolder
from service.serving.planner import DiffusionPlanner
from service.serving.schemas import Answer, Principal, QueryRequest

log = logging.getLogger(__name__)

MECHANISM_NAME = "noisy_diffusion"


class IdempotencyKeyReused(InvalidParameter):
    """The same Idempotency-Key was sent with a different query."""

    def __init__(self) -> None:
        super().__init__(
            "Idempotency-Key", "was already used for a different query; send a new key"
        )


class RequestInProgress(Conflict):
    code = "request_in_progress"


class PrefixProvider:
    """Noise-free prefixes, memoized by (graph version, seed, mode, beta, eta, m)."""

    def __init__(self, cache: PrefixCache | None = None) -> None:
        self._cache = cache

    def get(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int
    ) -> np.ndarray:
        key = (graph.version, seed, mode.value, beta, eta, m)
        if self._cache is not None:
            hit = self._cache.get(*key)
            if hit is not None and hit.shape == (graph.n,):
                return hit
        prefix = noise_free_prefix(graph, seed, mode, beta, eta, m)
        if self._cache is not None:
            self._cache.put(*key, prefix)
        return prefix


class PprQueryService:
    def __init__(
        self,
        *,
        graphs: GraphHolder,
        ledger: Ledger,
        replays: ReplayCache | None = None,
        mechanism: MechanismSettings,
        prefixes: PrefixProvider,
        planner: DiffusionPlanner | None = None,
        replay_store_top: int = 1000,
        create_seed_accounts: bool = True,
    ) -> None:
        self.graphs = graphs
        self.ledger = ledger
        self.replays = replays
        self.mechanism = mechanism
        self.prefixes = prefixes
        self.planner = planner or DiffusionPlanner()
        self.replay_store_top = replay_store_top
        self.create_seed_accounts = create_seed_accounts

    # -- validation and authorization -----------------------------------------------------

    def _validate(self, req: QueryRequest) -> float:
        if req.principal.type == "user" and req.principal.node_id != req.node:
            # Before the graph lookup: the same 403 for another user's node and for a node
            # that does not exist, so a key holder cannot list the graph's nodes.
            raise Forbidden("a user account may query only its own node")
        m = self.mechanism
        if not 1 <= req.k <= m.max_k:
            raise InvalidParameter("k", f"must be an integer in [1, {m.max_k}], got {req.k}")
        epsilon = m.default_epsilon if req.epsilon is None else req.epsilon
        if not math.isfinite(epsilon) or not m.epsilon_min <= epsilon <= m.epsilon_max:
            raise InvalidParameter(
                "epsilon", f"must be in [{m.epsilon_min}, {m.epsilon_max}], got {epsilon}"
            )
        if req.exclude_neighbors and req.mode is not Mode.PERSONALIZED:
            raise InvalidParameter(
                "exclude_neighbors",
                "uses the seed's own edges, which edge mode protects; use mode=personalized",
            )
        return float(epsilon)

    def _charged_account(self, principal: Principal, node: str, mode: Mode, graph: Graph) -> int:
        if principal.type == "admin":
            raise Forbidden("admin accounts manage budgets and cannot query")
        if principal.type == "user":
            if principal.node_id != node:
                raise Forbidden("a user account may query only its own node")
            return principal.account_id
        if principal.type == "service":
            if mode is Mode.EDGE:
                return principal.account_id  # shared answers: every edge protected, paid by caller
            allow_create = self.create_seed_accounts and principal.allow_create_seed_accounts
            return self.ledger.user_account_for_node(
                node,
                create=allow_create,
                cap_epsilon=self.mechanism.default_cap_epsilon,
                delta=self.mechanism.delta_for(graph.m),
            )
        raise Forbidden(f"account type {principal.type!r} cannot query")

    # -- the query ------------------------------------------------------------------------

    def answer(self, req: QueryRequest) -> Answer:
        graph = self.graphs.current  # one version for the whole request
        epsilon = self._validate(req)
        seed = graph.index_of(req.node)
        account_id = self._charged_account(req.principal, req.node, req.mode, graph)
        key = ReleaseKey(account_id, req.node, graph.version, req.mode.value, epsilon)

        if req.idempotency_key is not None:
            stored = self._release_for_idempotency_key(req)
            if stored is not None:
                if stored.key != key:
                    raise IdempotencyKeyReused()
                return self._replay(stored, req, graph, seed, account_id)
        if not req.fresh:
            stored = self._find_release(key)
            if stored is not None and self._covers(stored, req, graph, seed):
                return self._replay(stored, req, graph, seed, account_id)

        delta = self.ledger.account_delta(account_id)
        m = self.mechanism
        plan = self.planner.plan(epsilon, delta, m.steps, m.beta, m.eta, req.mode)
        mechanism = self._mechanism_dict(plan)
        receipt = self.ledger.admit_and_charge(
            charged_account_id=account_id,
            principal_account_id=req.principal.account_id,
            seed=req.node,
            mechanism=MECHANISM_NAME,
            mode=req.mode.value,
            params=mechanism,
            query_curve=plan.curve,
            query_epsilon=plan.epsilon,
            graph_version=graph.version,
            request_id=req.request_id,
            idempotency_key=req.idempotency_key,
        )
        if receipt.reused:
            # A twin with the same Idempotency-Key was admitted first: answer with its release.
            stored = self._release_for_idempotency_key(req)
            if stored is None:
                raise RequestInProgress(
                    "a request with this Idempotency-Key is still being answered; retry shortly"
                )
            if stored.key != key:
                raise IdempotencyKeyReused()
            return self._replay(stored, req, graph, seed, account_id)

        results = self._release(graph, seed, plan, receipt.charge_id, req)
        stored = StoredRelease(key, receipt.charge_id, results, mechanism, req.request_id)
        self._store(stored, req)
        return Answer(
            node=req.node,
            graph_version=graph.version,
            results=self._post_process(results, req, graph, seed),
            mechanism=mechanism,
            budget=receipt.budget,
            replayed=False,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=plan.epsilon,
        )

    # -- stored releases: the database is the truth, the replay cache sits in front ---------

    def _find_release(self, key: ReleaseKey) -> StoredRelease | None:
        if self.replays is not None:
            hit = self.replays.get(key)
            if hit is not None:
                return hit
        stored = self.ledger.find_release(key)
        if stored is not None and self.replays is not None:
            self.replays.put(stored)
        return stored

    def _release_for_idempotency_key(self, req: QueryRequest) -> StoredRelease | None:
        principal, idem = req.principal.account_id, req.idempotency_key or ""
        if self.replays is not None:
            hit = self.replays.get_for_idempotency(principal, idem)
            if hit is not None:
                return hit
        stored = self.ledger.release_for_idempotency_key(principal, idem)
        if stored is not None and self.replays is not None:
            self.replays.put_for_idempotency(principal, idem, stored)
        return stored

    def _store(self, stored: StoredRelease, req: QueryRequest) -> None:
        try:
            self.ledger.store_release(
                stored,
                idempotency_key=req.idempotency_key,
                principal_account_id=req.principal.account_id,
            )
        except Exception:  # the answer is charged and released; a lost replay costs a re-query
            log.exception("storing a release failed", extra={"request_id": req.request_id})
            return
        if self.replays is not None:
            self.replays.put(stored)
            if req.idempotency_key is not None:
                self.replays.put_for_idempotency(
                    req.principal.account_id, req.idempotency_key, stored
                )

    def _release(
        self, graph: Graph, seed: int, plan: DiffusionPlan, charge_id: int, req: QueryRequest
    ) -> list[RankedNode]:
        config = plan.config
        try:
            prefix = self.prefixes.get(
                graph, seed, config.mode, config.beta, config.eta, config.noise_free_steps
            )
            rng = fresh_generator()
        except BaseException:
            # No noise has been drawn: nothing was released, so the charge is compensated.
            self.ledger.refund(charge_id, reason="failed before any noise was drawn")
            raise
        scores = noisy_diffusion(graph, seed, config, rng=rng, prefix=prefix)
        keep = self.replay_store_top
        if req.mode is Mode.PERSONALIZED:
            keep += int(graph.degrees[seed])  # room to drop the seed's neighbours on replay
        return ranked_results(graph, seed, scores, keep)

    # -- replays --------------------------------------------------------------------------

    def _post_process(
        self, results: list[RankedNode], req: QueryRequest, graph: Graph, seed: int
    ) -> list[RankedNode]:
        if req.exclude_neighbors:
            neighbours = set(graph.external_ids(graph.neighbors(seed)))
            results = [r for r in results if r.node not in neighbours]
        return results[: req.k]

    def _covers(self, stored: StoredRelease, req: QueryRequest, graph: Graph, seed: int) -> bool:
        """A stored release can answer k results (after dropping neighbours if asked)."""
        available = len(self._post_process(stored.results, _with_k(req, 10**9), graph, seed))
        return available >= min(
            req.k, graph.n - 1 - (int(graph.degrees[seed]) if req.exclude_neighbors else 0)
        )

    def _replay(
        self, stored: StoredRelease, req: QueryRequest, graph: Graph, seed: int, account_id: int
    ) -> Answer:
        return Answer(
            node=req.node,
            graph_version=graph.version,
            results=self._post_process(stored.results, req, graph, seed),
            mechanism=stored.mechanism,
            budget=self.ledger.budget(account_id),
            replayed=True,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=0.0,
            extra={"original_request_id": stored.request_id},
        )

    def _mechanism_dict(self, plan: DiffusionPlan) -> dict[str, Any]:
        c = plan.config
        return {
            "name": MECHANISM_NAME,
            "mode": c.mode.value,
            "epsilon": plan.epsilon,
            "delta": plan.delta,
            "beta": c.beta,
            "steps": c.steps,
            "noisy_steps": c.noisy_steps,
            "eta": c.eta,
            "noise_scale": c.noise_scale,
        }


def _with_k(req: QueryRequest, k: int) -> QueryRequest:
    return replace(req, k=k)
