"""Answering one private PPR query: authorize, admit and charge, release, post-process, store.

Data flows one way: request -> authorization -> admission (ledger, one transaction) ->
mechanism (fresh OS-entropy noise) -> post-processing -> stored release -> answer.
Nothing noisy is drawn before the charge is committed. A failure before the first noise draw
is refunded with a compensating ledger row; after it, the charge stays.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from service.cache.caches import PrefixCache, ReplayCache
from service.config import MechanismSettings
from service.errors import Conflict, Forbidden, InvalidParameter, ServiceError
from service.graph.model import Graph
from service.ledger.ledger import Ledger, LedgerUnavailable
from service.ledger.records import (
    Admission,
    BudgetView,
    ChargeReceipt,
    ChargeSettled,
    DegreeCharge,
    GraphCap,
    ModeNotAllowed,
    ReadCapExhausted,
    ReleaseKey,
    StoredRelease,
)
from service.ledger.release_format import StoredResults
from service.mechanisms.diffusion import noise_free_prefix
from service.mechanisms.engine import DiffusionEngine, EngineFailure, EngineResult
from service.mechanisms.postprocess import RankedNode, ranked_indices, ranked_results, score_grid
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.registry import RankingMechanism, resolve_mechanism
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import DiffusionPlan
from service.privacy.laplace import count_release_curve
from service.privacy.modes import Mode
from service.privacy.sampler import count_release_delta
from service.serving.graph_holder import GraphHolder
from service.serving.group_commit import GroupCommitter
from service.serving.planner import DiffusionPlanner
from service.serving.prefix_tables import SharedPrefixTables
from service.serving.rankings import (
    DegreeReleases,
    RankingPlan,
    degree_block,
    degree_release_name,
    draw_ranking,
    plan_ranking,
)
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

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class AdmissionPolicy:
    """What admission enforces beyond each account's own cap (from the settings)."""

    service_quota_epsilon: float | None = None  # default quota of service accounts
    service_read_cap_epsilon: float | None = None  # default cap on a service account's reads
    graph_cap_epsilon: float | None = None
    exposure_delta: float | None = None  # None: the smallest account delta
    stale_after_seconds: float = 60.0  # an in-flight twin older than this is reconciled
    twin_wait_seconds: float = 10.0  # how long to wait for an in-flight twin's release

    @classmethod
    def from_settings(cls, settings: Any) -> AdmissionPolicy:
        return cls(
            service_quota_epsilon=settings.service_quota_epsilon,
            service_read_cap_epsilon=settings.service_read_cap_epsilon,
            graph_cap_epsilon=settings.graph_cap_epsilon,
            exposure_delta=settings.exposure_delta,
            stale_after_seconds=settings.reconcile_after_seconds,
            twin_wait_seconds=settings.twin_wait_seconds,
        )


#: How long an account's delta (calibration only) and a replay's budget view are reused.
_DELTA_TTL_SECONDS = 5.0
_REPLAY_BUDGET_TTL_SECONDS = 1.0

#: How often an admission is retried after the charge it waited on was refunded.
_MAX_ADMISSIONS = 3


@dataclass(frozen=True)
class _Pending:
    """A query prepared for admission: everything :meth:`PprQueryService.answer` decided
    before the ledger."""

    req: QueryRequest
    graph: Graph
    seed: int
    account_id: int
    key: ReleaseKey
    join_twins: bool
    plan: DiffusionPlan | RankingPlan
    mechanism: dict[str, Any]


@dataclass(frozen=True)
class _ToBind:
    """A keyed query a stored release can answer before admission: it is answered with that
    release only once its Idempotency-Key is bound to it in the ledger."""

    req: QueryRequest
    graph: Graph
    seed: int
    account_id: int
    key: ReleaseKey
    name: RankingMechanism
    epsilon: float
    stored: StoredRelease


@dataclass(frozen=True)
class _Started:
    """An admitted query handed to the engine: its result to wait for, and how to rank it."""

    future: Future[EngineResult]
    where: tuple[Graph, int, Mode, float, float, int]  # the prefix's (graph, seed, mode, ...)
    cold: bool  # no stored prefix: the engine computed it, and it is remembered
    charge_id: int
    noise_scale: float


class PrefixProvider:
    """Noise-free prefixes: from the machine-wide table of every seed's prefix when it holds
    these parameters (:mod:`service.serving.prefix_tables`), else memoized per process by
    (graph version, seed, mode, beta, eta, m)."""

    def __init__(
        self, cache: PrefixCache | None = None, tables: SharedPrefixTables | None = None
    ) -> None:
        self._cache = cache
        self.tables = tables

    def lookup(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int
    ) -> np.ndarray | None:
        """The prefix (a read-only array), or None (the engine then computes it with the
        query)."""
        if self.tables is not None:
            row = self.tables.lookup(graph, seed, mode, beta, eta, m)
            if row is not None:
                return row
        if self._cache is None:
            return None
        hit = self._cache.get(graph.version, seed, mode.value, beta, eta, m)
        return hit if hit is not None and hit.shape == (graph.n,) else None

    def remember(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int,
        prefix: np.ndarray,
    ) -> None:  # fmt: skip
        if self._cache is not None:
            self._cache.put(graph.version, seed, mode.value, beta, eta, m, prefix)

    def get(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int
    ) -> np.ndarray:
        prefix = self.lookup(graph, seed, mode, beta, eta, m)
        if prefix is None:
            prefix = noise_free_prefix(graph, seed, mode, beta, eta, m)
            self.remember(graph, seed, mode, beta, eta, m, prefix)
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
        create_seed_accounts: bool = False,
        policy: AdmissionPolicy | None = None,
        degree_releases: DegreeReleases | None = None,
        engine: DiffusionEngine | None = None,
        ledger_group_max: int = 1,
    ) -> None:
        self.engine = engine if engine is not None else DiffusionEngine()
        # Group commit (ledger_group_max > 1): concurrent admissions share one transaction,
        # and so do concurrent release stores; 1: one transaction per query.
        self._admitting: GroupCommitter[tuple[Admission, GraphCap | None], ChargeReceipt] | None
        self._storing: GroupCommitter[tuple[StoredRelease, str | None, int], None] | None
        self._admitting = self._storing = None
        if ledger_group_max > 1:
            self._admitting = GroupCommitter(self._admit_together, max_group=ledger_group_max)
            self._storing = GroupCommitter(self._store_together, max_group=ledger_group_max)
        self.graphs = graphs
        self.ledger = ledger
        self.replays = replays
        self.mechanism = mechanism
        self.prefixes = prefixes
        self.planner = planner or DiffusionPlanner()
        self.replay_store_top = replay_store_top
        self.create_seed_accounts = create_seed_accounts
        self.policy = policy or AdmissionPolicy()
        self.degree_releases = degree_releases or DegreeReleases(ledger, mechanism.popular_epsilon)
        self._max_charge: dict[str, RdpCurve] = {}
        self._exposure_delta: tuple[float, float] | None = None  # (value, read at monotonic)
        self._deltas: dict[int, tuple[float, float]] = {}  # account -> (delta, read at)
        self._budgets: dict[int, tuple[BudgetView, float]] = {}  # account -> (budget, read at)
        #: Reads a service account already has in its read figure (the database only ever adds
        #: them, and a counted release is never refused), so a replay of one needs no write.
        self._known_reads: set[tuple[int, str, int | None, str | None]] = set()

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
        if req.exclude_neighbors and req.principal.type == "service":
            # With and without it, two answers name the seed's neighbour list outright: a
            # user's own edges are for that user, so only the user may ask for it.
            raise InvalidParameter(
                "exclude_neighbors",
                "is offered to the seed user only, not to service accounts; drop the seed's "
                "neighbours on your side if you hold them",
            )
        return float(epsilon)

    def validate(self, req: QueryRequest) -> float:
        """Check k, epsilon, the mechanism and the mode's options without answering; the
        epsilon to use."""
        epsilon = self._validate(req)
        self._mechanism_for(req)
        return epsilon

    def _mechanism_for(self, req: QueryRequest) -> RankingMechanism:
        return resolve_mechanism(req.mechanism, req.mode, self.mechanism.default_mechanism)

    def _charged_account(self, principal: Principal, node: str, mode: Mode, graph: Graph) -> int:
        if principal.type == "admin":
            raise Forbidden("admin accounts manage budgets and cannot query")
        if principal.type == "user":
            if principal.node_id != node:
                raise Forbidden("a user account may query only its own node")
            return principal.account_id
        if principal.type == "service":
            if mode.value not in principal.modes:
                self.ledger.record_refusal(
                    ModeNotAllowed.code, principal_account_id=principal.account_id, mode=mode.value
                )
                raise ModeNotAllowed(
                    f"this service account may query in {', '.join(principal.modes)} mode only; "
                    f"an admin must grant {mode.value!r} (accounts set-scopes --modes)",
                    details={"mode": mode.value, "modes": list(principal.modes)},
                )
            if mode is Mode.EDGE:
                return principal.account_id  # shared answers: every edge protected, paid by caller
            allow_create = self.create_seed_accounts and principal.may_create_seed_accounts
            return self.ledger.user_account_for_node(
                node,
                create=allow_create,
                cap_epsilon=self.mechanism.default_cap_epsilon,
                delta=self.mechanism.account_delta,
            )
        raise Forbidden(f"account type {principal.type!r} cannot query")

    # -- the query ------------------------------------------------------------------------

    def answer(self, req: QueryRequest) -> Answer:
        prepared = self._prepare(req)
        if isinstance(prepared, _ToBind):
            bound = self._bind([prepared])[0]
            if isinstance(bound, BaseException):
                raise bound
            prepared = bound
        if isinstance(prepared, Answer):
            return prepared
        receipt = self._admit(prepared)
        return self._after_admission(prepared, receipt)

    def _prepare(self, req: QueryRequest) -> Answer | _Pending | _ToBind:
        """Everything before admission: validation, the charged account, replays from stored
        releases, the plan. An Answer when a stored release (or ``popular``) answers; a
        keyed query a stored release can answer is that release once its key is bound to it
        (:meth:`_bind`), so every retry under the key gets the same one."""
        graph = self.graphs.current  # one version for the whole request
        epsilon = self._validate(req)
        name = self._mechanism_for(req)
        seed = graph.index_of(req.node)
        account_id = self._charged_account(req.principal, req.node, req.mode, graph)
        if name is RankingMechanism.POPULAR:
            return self._answer_popular(req, graph, seed, account_id)
        key = ReleaseKey(account_id, req.node, graph.version, req.mode.value, epsilon, name.value)

        if req.idempotency_key is not None:
            stored = self._release_for_idempotency_key(req)
            if stored is not None:
                if stored.key != key:
                    raise IdempotencyKeyReused()
                return self._replay(stored, req, graph, seed, account_id)
        join_twins = not req.fresh
        if not req.fresh:
            stored = self._find_release(key)
            if stored is not None:
                if self._covers(stored, req, graph, seed):
                    if req.idempotency_key is not None:
                        return _ToBind(req, graph, seed, account_id, key, name, epsilon, stored)
                    return self._replay(stored, req, graph, seed, account_id)
                join_twins = False  # the stored release is too short for this query: draw anew
        return self._plan(req, graph, seed, account_id, key, name, epsilon, join_twins)

    def _plan(
        self,
        req: QueryRequest,
        graph: Graph,
        seed: int,
        account_id: int,
        key: ReleaseKey,
        name: RankingMechanism,
        epsilon: float,
        join_twins: bool,
    ) -> _Pending:
        """The query prepared for admission: its plan and mechanism description."""
        plan: DiffusionPlan | RankingPlan
        if name is RankingMechanism.NOISY_DIFFUSION:
            delta = self._account_delta(account_id)
            m = self.mechanism
            plan = self.planner.plan(epsilon, delta, m.steps, m.beta, m.eta, req.mode)
            mechanism = self._mechanism_dict(plan)
        else:
            # blended's degree release is made (or read) before admission: it is the graph
            # version's, counted once in the graph-wide exposure; this account pays for it
            # (once per version) in the query's own admission
            degrees = None
            if name is RankingMechanism.BLENDED:
                degrees = self.degree_releases.get(graph, self._graph_cap(graph))
            plan = plan_ranking(name, epsilon, req.mode, degrees)
            mechanism = plan.describe()
        return _Pending(req, graph, seed, account_id, key, join_twins, plan, mechanism)

    def _bind(self, items: list[_ToBind]) -> list[Answer | _Pending | BaseException]:
        """Bind each keyed query's Idempotency-Key to the stored release found for it, in one
        ledger transaction, and answer with that release. A key bound already (by an earlier
        or a concurrent request) keeps its charge: that query goes on to admission, which
        finds the binding and answers with its release (or 422 for a different query)."""
        try:
            bound = self.ledger.bind_idempotency_keys(
                [
                    (b.req.principal.account_id, b.req.idempotency_key or "", b.stored.charge_id)
                    for b in items
                ]
            )
        except Exception as exc:
            return [exc] * len(items)
        out: list[Answer | _Pending | BaseException] = []
        cache: list[tuple[StoredRelease, int, str | None]] = []
        for b, charge_id in zip(items, bound, strict=True):
            if charge_id == b.stored.charge_id:
                cache.append((b.stored, b.req.principal.account_id, b.req.idempotency_key))
                out.append(self._replay(b.stored, b.req, b.graph, b.seed, b.account_id))
                continue
            try:
                out.append(
                    self._plan(b.req, b.graph, b.seed, b.account_id, b.key, b.name, b.epsilon, True)
                )
            except Exception as exc:
                out.append(exc)
        self._cache_bound(cache)
        return out

    def _cache_bound(self, entries: list[tuple[StoredRelease, int, str | None]]) -> None:
        """Cache releases whose keys are bound to them (a bound key never changes charge)."""
        keyed = [(principal, idem, stored) for stored, principal, idem in entries if idem]
        if self.replays is None or not keyed:
            return
        try:
            self.replays.put_many_for_idempotency(keyed)
        except Exception:  # the ledger is the truth: a miss reads the binding there
            log.warning("caching bound releases failed", exc_info=True)

    def _after_admission(self, p: _Pending, receipt: ChargeReceipt) -> Answer:
        """A twin's release (waiting for it), or this query's own release once stored."""
        for _ in range(_MAX_ADMISSIONS):
            if not (receipt.reused or receipt.joined):
                break
            # An identical query (or a retry with the same Idempotency-Key) was admitted
            # first: its release is the answer, once stored. If it is refunded instead (its
            # worker died and it was reconciled), admission runs again and may charge.
            stored = self._wait_for_release(receipt.charge_id)
            if stored is not None:
                if stored.key != p.key:
                    raise IdempotencyKeyReused()
                self._cache_bound([(stored, p.req.principal.account_id, p.req.idempotency_key)])
                return self._replay(stored, p.req, p.graph, p.seed, p.account_id)
            receipt = self._admit(p)
        else:
            raise RequestInProgress(
                "an identical request is still being answered; retry shortly", retry_after=1
            )
        stored = self._draw(p, receipt)
        self._store(stored, p.req)  # before the answer leaves the process, or no answer
        return self._fresh_answer(p, receipt, stored)

    def _draw(self, p: _Pending, receipt: ChargeReceipt) -> StoredRelease:
        """The admitted query's noisy release (not yet stored: it must be, before answering)."""
        return self._finish_draw(p, self._start_draw(p, receipt))

    def _start_draw(self, p: _Pending, receipt: ChargeReceipt) -> _Started | StoredRelease:
        """Begin the admitted query's release: a diffusion is handed to the engine and returns
        at once (:meth:`_finish_draw` waits for it); another ranking is drawn here."""
        self._budgets[p.account_id] = (receipt.budget, time.monotonic())  # for replays here
        if p.req.principal.type == "service":
            try:  # before any noise is drawn: a refused read refunds the fresh charge
                degree = _degree_release_of(p.plan)
                self._record_reads(p.req, p.graph.version, receipt.charge_id, degree)
            except ReadCapExhausted:
                reason = "refused by the service account's read cap before any noise was drawn"
                self.ledger.refund(receipt.charge_id, reason=reason)
                raise
        if isinstance(p.plan, DiffusionPlan):
            return self._start_release(p.graph, p.seed, p.plan, receipt.charge_id)
        results, mechanism = self._release_ranking(
            p.graph, p.seed, p.plan, receipt.charge_id, p.req, p.mechanism
        )
        return StoredRelease(p.key, receipt.charge_id, results, mechanism, p.req.request_id)

    def _finish_draw(self, p: _Pending, started: _Started | StoredRelease) -> StoredRelease:
        if isinstance(started, StoredRelease):
            return started
        results = self._finish_release(started)
        return StoredRelease(p.key, started.charge_id, results, p.mechanism, p.req.request_id)

    def _fresh_answer(self, p: _Pending, receipt: ChargeReceipt, stored: StoredRelease) -> Answer:
        return Answer(
            node=p.req.node,
            graph_version=p.graph.version,
            results=self._post_process(stored.results, p.req, p.graph, p.seed),
            mechanism=stored.mechanism,
            budget=receipt.budget,
            replayed=False,
            request_id=p.req.request_id,
            charged_account_id=p.account_id,
            epsilon_charged=p.plan.epsilon + receipt.degree_epsilon,
        )

    # -- many queries at once: one admission transaction, one storing transaction ---------

    def answer_many(
        self,
        reqs: list[QueryRequest],
        run: Callable[[list[Callable[[], Any]]], list[Any]],
        on_ready: Callable[[int, Answer | BaseException], None] | None = None,
    ) -> list[Answer | BaseException]:
        """Answers to ``reqs`` (or each one's error), admitted in one ledger transaction and
        stored in one: per query the same checks and the same order as :meth:`answer` (admit,
        draw, store, answer), and no answer is returned before every release of the group is
        stored.

        The diffusions are handed to the engine together, so it computes them in one block.
        ``run`` runs the other draws (thunks: other rankings, and queries that wait for an
        identical query's release) concurrently and returns their results or exceptions in
        order. ``on_ready(i, outcome)``, if given, hears an outcome as soon as it is final
        (a replay, or an error before admission) rather than with the whole group."""
        out: list[Answer | BaseException | None] = [None] * len(reqs)

        def settle(i: int, outcome: Answer | BaseException) -> None:
            out[i] = outcome
            if on_ready is not None:
                on_ready(i, outcome)

        pending: list[tuple[int, _Pending]] = []
        to_bind: list[tuple[int, _ToBind]] = []
        for i, req in enumerate(reqs):
            try:
                prepared = self._prepare(req)
            except Exception as exc:
                settle(i, exc)
                continue
            if isinstance(prepared, Answer):
                settle(i, prepared)
            elif isinstance(prepared, _ToBind):
                to_bind.append((i, prepared))
            else:
                pending.append((i, prepared))
        if to_bind:  # the group's keyed replays bind their keys in one transaction
            bound = self._bind([b for _, b in to_bind])
            for (i, _), resolved in zip(to_bind, bound, strict=True):
                if isinstance(resolved, _Pending):
                    pending.append((i, resolved))
                else:
                    settle(i, resolved)
            pending.sort(key=lambda item: item[0])
        graph_caps = {id(p.graph): self._graph_cap(p.graph) for _, p in pending}
        by_cap: dict[int, list[tuple[int, _Pending]]] = {}
        for i, p in pending:
            by_cap.setdefault(id(p.graph), []).append((i, p))
        admitted: list[tuple[int, _Pending, ChargeReceipt]] = []
        for graph_id, group in by_cap.items():
            try:
                receipts = self.ledger.admit_and_charge_many(
                    [self._admission(p) for _, p in group],
                    graph_cap=graph_caps[graph_id],
                    stale_after_seconds=self.policy.stale_after_seconds,
                )
            except Exception as exc:
                for i, _ in group:
                    settle(i, exc)
                continue
            for (i, p), receipt in zip(group, receipts, strict=True):
                if isinstance(receipt, BaseException):
                    settle(i, receipt)
                else:
                    admitted.append((i, p, receipt))
        own = {r.charge_id for _, _, r in admitted if not (r.reused or r.joined)}
        # A query that joined a twin admitted in this same group is answered from that twin's
        # release once it is stored (waiting for it in the pool would wait for ourselves).
        later: list[tuple[int, _Pending, ChargeReceipt]] = []
        now: list[tuple[int, _Pending, ChargeReceipt]] = []
        for item in admitted:
            r = item[2]
            (later if (r.reused or r.joined) and r.charge_id in own else now).append(item)
        drawn = self._draw_group(now, run)
        to_store: list[tuple[int, _Pending, ChargeReceipt, StoredRelease]] = []
        for (i, p, receipt), outcome in zip(now, drawn, strict=True):
            if isinstance(outcome, (BaseException, Answer)):
                settle(i, outcome)
            else:
                to_store.append((i, p, receipt, outcome))
        stored_by_charge: dict[int, StoredRelease | BaseException] = {}
        for (i, p, receipt, stored), error in zip(
            to_store, self._store_many([(p.req, stored) for _, p, _, stored in to_store]),
            strict=True,
        ):  # fmt: skip
            out[i] = error if error is not None else self._fresh_answer(p, receipt, stored)
            stored_by_charge[stored.charge_id] = error if error is not None else stored
        for i, p, receipt in later:
            twin = stored_by_charge.get(receipt.charge_id)
            if twin is None or isinstance(twin, BaseException):
                out[i] = twin or RequestInProgress(
                    "an identical request failed before its answer was stored; retry",
                    retry_after=1,
                )
            elif twin.key != p.key:
                out[i] = IdempotencyKeyReused()
            else:
                try:  # a service account's replay may be refused by its read cap
                    out[i] = self._replay(twin, p.req, p.graph, p.seed, p.account_id)
                except Exception as exc:
                    out[i] = exc
        assert all(item is not None for item in out)
        return [item for item in out if item is not None]

    def _draw_group(
        self,
        admitted: list[tuple[int, _Pending, ChargeReceipt]],
        run: Callable[[list[Callable[[], Any]]], list[Any]],
    ) -> list[Answer | StoredRelease | BaseException]:
        """Each admitted query's release (or a twin's answer, or its error), in order. Every
        diffusion goes to the engine before the first is waited for, so they share a block
        without a thread each; the rest run on ``run``."""
        started: dict[int, _Started | StoredRelease | BaseException] = {}
        thunks: list[Callable[[], Any]] = []
        with self.engine.together():  # an idle engine starts them as one block
            for j, (_, p, r) in enumerate(admitted):
                if isinstance(p.plan, DiffusionPlan) and not (r.reused or r.joined):
                    try:
                        started[j] = self._start_draw(p, r)
                    except Exception as exc:
                        started[j] = exc
                else:
                    thunks.append(functools.partial(self._draw_or_join, p, r))
        ran = iter(run(thunks) if thunks else [])
        drawn: list[Answer | StoredRelease | BaseException] = []
        for j, (_, p, _) in enumerate(admitted):
            if j not in started:
                drawn.append(next(ran))
                continue
            begun = started[j]
            try:
                drawn.append(
                    begun if isinstance(begun, BaseException) else self._finish_draw(p, begun)
                )
            except Exception as exc:
                drawn.append(exc)
        return drawn

    def _draw_or_join(self, p: _Pending, receipt: ChargeReceipt) -> Answer | StoredRelease:
        if receipt.reused or receipt.joined:
            return self._after_admission(p, receipt)  # an earlier twin's release
        return self._draw(p, receipt)

    def _quota_for(self, principal: Principal, account_id: int) -> float | None:
        """The 24-hour quota to check when a service account charges another account."""
        if principal.type == "service" and account_id != principal.account_id:
            if principal.quota_epsilon is not None:
                return principal.quota_epsilon
            return self.policy.service_quota_epsilon
        return None

    def _admission(self, p: _Pending) -> Admission:
        principal = p.req.principal
        quota = self._quota_for(principal, p.account_id)
        return Admission(
            charged_account_id=p.account_id,
            principal_account_id=principal.account_id,
            seed=p.req.node,
            mechanism=str(p.mechanism["name"]),
            mode=p.req.mode.value,
            params=p.mechanism,
            query_curve=p.plan.curve,
            query_epsilon=p.plan.epsilon,
            graph_version=p.graph.version,
            request_id=p.req.request_id,
            idempotency_key=p.req.idempotency_key,
            release_key=p.key if p.join_twins else None,
            quota_epsilon=quota,
            degree=_degree_charge(p.plan),
        )

    def _store_many(
        self, items: list[tuple[QueryRequest, StoredRelease]]
    ) -> list[BaseException | None]:
        """Store the releases in one transaction and cache them (:meth:`_store_together`,
        before any is answered); per item None or the error that discards its answer (as
        :meth:`_store`)."""
        if not items:
            return []
        try:
            settled = self._store_together(
                [(stored, req.idempotency_key, req.principal.account_id) for req, stored in items]
            )
        except LedgerUnavailable as exc:
            log.warning("storing a group of releases failed; their answers were discarded")
            return [exc] * len(items)
        return [
            None if outcome is None else _settled_before_stored(stored, req)
            for (req, stored), outcome in zip(items, settled, strict=True)
        ]

    # -- admission ------------------------------------------------------------------------

    def _store_together(
        self, items: list[tuple[StoredRelease, str | None, int]]
    ) -> list[ChargeSettled | None]:
        """One group of concurrent release stores, in one transaction (a lone one: the
        single-release transaction), then the stored ones into the replay cache in one
        round trip."""
        outcomes: list[ChargeSettled | None]
        if len(items) == 1:
            stored, idempotency_key, principal = items[0]
            try:
                self.ledger.store_release(
                    stored, idempotency_key=idempotency_key, principal_account_id=principal
                )
                outcomes = [None]
            except ChargeSettled as exc:
                outcomes = [exc]
        else:
            outcomes = self.ledger.store_releases(items)
        if self.replays is not None:
            try:
                self.replays.put_many(
                    [
                        (stored, principal, idempotency_key)
                        for (stored, idempotency_key, principal), outcome in zip(
                            items, outcomes, strict=True
                        )
                        if outcome is None
                    ]
                )
            except Exception:  # stored: the ledger is the truth, replays read it on a miss
                log.warning("caching a group of stored releases failed", exc_info=True)
        return outcomes

    def _admit_together(
        self, items: list[tuple[Admission, GraphCap | None]]
    ) -> list[ChargeReceipt | BaseException]:
        """One group of concurrent admissions: one transaction per graph-wide cap in force
        (normally one); a lone admission: the single-query transaction."""
        if len(items) == 1:
            admission, cap = items[0]
            try:
                return [self._admit_alone(admission, cap)]
            except ServiceError as exc:
                return [exc]
        out: list[ChargeReceipt | BaseException | None] = [None] * len(items)
        parts: dict[Any, list[int]] = {}
        for i, (_, cap) in enumerate(items):
            part = None if cap is None else (cap.cap_epsilon, cap.delta, id(cap.max_charge))
            parts.setdefault(part, []).append(i)
        for indices in parts.values():
            outcomes: list[ChargeReceipt | ServiceError] | list[Exception]
            try:
                outcomes = self.ledger.admit_and_charge_many(
                    [items[i][0] for i in indices],
                    graph_cap=items[indices[0]][1],
                    stale_after_seconds=self.policy.stale_after_seconds,
                )
            except Exception as exc:
                outcomes = [exc] * len(indices)
            for i, outcome in zip(indices, outcomes, strict=True):
                out[i] = outcome
        return [outcome for outcome in out if outcome is not None]

    def _admit(self, p: _Pending) -> ChargeReceipt:
        a = self._admission(p)
        if self._admitting is not None:
            return self._admitting.submit((a, self._graph_cap(p.graph)))
        return self._admit_alone(a, self._graph_cap(p.graph))

    def _admit_alone(self, a: Admission, graph_cap: GraphCap | None) -> ChargeReceipt:
        return self.ledger.admit(
            a, graph_cap=graph_cap, stale_after_seconds=self.policy.stale_after_seconds
        )

    def _graph_cap(self, graph: Graph) -> GraphCap | None:
        cap = self.policy.graph_cap_epsilon
        if cap is None:
            return None
        return GraphCap(cap, self._current_exposure_delta(), self._max_charge_curve(graph))

    def _current_exposure_delta(self) -> float:
        if self.policy.exposure_delta is not None:
            return self.policy.exposure_delta
        cached = self._exposure_delta
        if cached is None or time.monotonic() - cached[1] > 10.0:
            cached = (self.ledger.smallest_delta(), time.monotonic())
            self._exposure_delta = cached
        return cached[0]

    def _max_charge_curve(self, graph: Graph) -> RdpCurve:
        """Order by order, the largest curve a query at the largest epsilon can have (at the
        graph's default delta). A charge above it is still admitted exactly, only slower."""
        hit = self._max_charge.get(graph.version)
        if hit is None:
            m = self.mechanism
            delta = m.account_delta
            curves = [
                self.planner.plan(m.epsilon_max, delta, m.steps, m.beta, m.eta, mode).curve
                for mode in Mode
            ] + [count_release_curve(m.epsilon_max)]
            hit = RdpCurve(
                np.max([c.rdp for c in curves], axis=0),
                max(c.pure for c in curves),
                max(c.sampler_tv for c in curves),
            )
            self._max_charge = {graph.version: hit}
        return hit

    def _wait_for_release(self, charge_id: int) -> StoredRelease | None:
        """The release of ``charge_id`` once stored; None once it is refunded. A charge still
        in flight after ``twin_wait_seconds`` answers 409 with Retry-After."""
        deadline = time.monotonic() + self.policy.twin_wait_seconds
        pause = 0.005
        while True:
            state = self.ledger.charge_state(charge_id)
            if state == "released":
                return self.ledger.release_for_charge(charge_id)
            if state == "refunded":
                return None
            if time.monotonic() >= deadline:
                raise RequestInProgress(
                    "an identical request is still being answered; retry shortly",
                    retry_after=max(1, math.ceil(self.policy.twin_wait_seconds)),
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

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
        """Store the release and mark its charge released; only then may the answer leave.

        If storing fails the answer is discarded and the client gets 503 ``ledger_unavailable``:
        nothing was released, the charge stays admitted and is refunded by reconciliation.
        """
        try:
            if self._storing is not None:
                self._storing.submit((stored, req.idempotency_key, req.principal.account_id))
            else:
                self.ledger.store_release(
                    stored,
                    idempotency_key=req.idempotency_key,
                    principal_account_id=req.principal.account_id,
                )
        except LedgerUnavailable:
            log.warning(
                "storing a release failed; the answer was discarded",
                extra={"request_id": req.request_id, "charge_id": stored.charge_id},
            )
            raise
        except ChargeSettled as exc:
            raise _settled_before_stored(stored, req) from exc
        if self.replays is not None and self._storing is None:  # a group caches its own
            self._cache_release(stored, req)

    def _cache_release(self, stored: StoredRelease, req: QueryRequest) -> None:
        assert self.replays is not None
        self.replays.put(stored)
        if req.idempotency_key is not None:
            self.replays.put_for_idempotency(req.principal.account_id, req.idempotency_key, stored)

    def _start_release(
        self, graph: Graph, seed: int, plan: DiffusionPlan, charge_id: int
    ) -> _Started:
        """Hand the admitted query to the engine (it returns at once): batched with
        concurrent queries; a cold seed's prefix is computed in the same block."""
        config = plan.config
        where = (graph, seed, config.mode, config.beta, config.eta, config.noise_free_steps)
        try:
            prefix = self.prefixes.lookup(*where)
            rng = fresh_generator()
            future = self.engine.submit(graph, seed, config, rng=rng, prefix=prefix)
        except BaseException:
            # No noise has been drawn: nothing was released, so the charge is compensated.
            self.ledger.refund(charge_id, reason="failed before any noise was drawn")
            raise
        return _Started(future, where, prefix is None, charge_id, config.noise_scale)

    def _finish_release(self, started: _Started) -> Sequence[RankedNode]:
        """Wait for the engine's result, then rank it (the stored form of the release)."""
        try:
            result = started.future.result()
        except EngineFailure as exc:
            if not exc.noise_drawn:  # it failed in the noise-free prefix: nothing released
                self.ledger.refund(started.charge_id, reason="failed before any noise was drawn")
            raise exc.error from None
        graph, seed, mode, _, _, _ = started.where
        if started.cold and result.prefix is not None:
            self.prefixes.remember(*started.where, result.prefix)
        keep = self.replay_store_top
        if mode is Mode.PERSONALIZED:
            keep += int(graph.degrees[seed])  # room to drop the seed's neighbours on replay
        grid = score_grid(started.noise_scale)
        return _stored_results(graph, *ranked_indices(graph, seed, result.scores, keep, grid=grid))

    def _release_ranking(
        self,
        graph: Graph,
        seed: int,
        plan: RankingPlan,
        charge_id: int,
        req: QueryRequest,
        mechanism: dict[str, Any],
    ) -> tuple[Sequence[RankedNode], dict[str, Any]]:
        """``common_neighbours`` / ``friends_of_friends`` / ``blended``: this query's Laplace
        draw, post-processed."""
        try:
            rng = fresh_generator()
        except BaseException:
            self.ledger.refund(charge_id, reason="failed before any noise was drawn")
            raise
        drawn = draw_ranking(graph, seed, plan, rng)
        keep = self.replay_store_top + int(graph.degrees[seed])
        ranked = ranked_indices(graph, seed, drawn.scores, keep, grid=drawn.grid)
        results = _stored_results(graph, *ranked)
        return results, {**mechanism, **drawn.extra}

    def _answer_popular(
        self, req: QueryRequest, graph: Graph, seed: int, account_id: int
    ) -> Answer:
        """``popular``: the version's one degree release, ranked. Post-processing of a stored
        graph-wide release, which the charged account pays for once per graph version (the
        first time it receives an answer built on it; refused past its cap like any charge);
        nothing new is stored."""
        if req.idempotency_key is not None:
            stored = self._release_for_idempotency_key(req)
            if stored is not None:  # the key belongs to a charged query
                raise IdempotencyKeyReused()
        degrees = self.degree_releases.get(graph, self._graph_cap(graph))
        if req.principal.type == "service":
            self._record_reads(req, graph.version, None, degree_release_name(degrees.plan.scale))
        receipt = self.ledger.admit_degree_release(
            charged_account_id=account_id,
            principal_account_id=req.principal.account_id,
            seed=req.node,
            mode=req.mode.value,
            degree=DegreeCharge(graph.version, degrees.plan.epsilon, degrees.plan.curve),
            request_id=req.request_id,
            quota_epsilon=self._quota_for(req.principal, account_id),
        )
        extra = int(graph.degrees[seed]) if req.exclude_neighbors else 0
        results = ranked_results(
            graph, seed, degrees.values, req.k + extra, grid=degrees.grid,
            exclude_neighbors=req.exclude_neighbors,
        )  # fmt: skip
        mechanism = {
            "name": RankingMechanism.POPULAR.value,
            "mode": req.mode.value,
            "epsilon": degrees.plan.epsilon,
            "delta": count_release_delta(degrees.plan.epsilon),
            "sensitivity": degrees.plan.sensitivity,
            "noise_scale": degrees.plan.scale,
            "score_grid": degrees.grid,
            **degree_block(degrees),
        }
        return Answer(
            node=req.node,
            graph_version=graph.version,
            results=results[: req.k],
            mechanism=mechanism,
            budget=receipt.budget,
            replayed=False,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=degrees.plan.epsilon if receipt.charged else 0.0,
        )

    def _record_reads(
        self, req: QueryRequest, version: str, charge_id: int | None, degree_release: str | None
    ) -> None:
        """Count what a service account is about to receive in its read figure (refused past
        its read cap with ``read_cap_exhausted``): the query's release, and the version's
        degree release when the answer is built on it."""
        known = (req.principal.account_id, version, charge_id, degree_release)
        if known in self._known_reads:
            return
        try:
            self.ledger.record_reads(
                req.principal.account_id,
                charge_ids=() if charge_id is None else (charge_id,),
                graph_release=None if degree_release is None else (version, degree_release),
                default_cap_epsilon=self.policy.service_read_cap_epsilon,
            )
        except ReadCapExhausted as refusal:
            self.ledger.record_refusal(
                refusal.code, principal_account_id=req.principal.account_id, mode=req.mode.value
            )
            raise
        if len(self._known_reads) > 100_000:
            self._known_reads.clear()
        self._known_reads.add(known)

    # -- replays --------------------------------------------------------------------------

    def _post_process(
        self, results: Sequence[RankedNode], req: QueryRequest, graph: Graph, seed: int
    ) -> list[RankedNode]:
        if req.exclude_neighbors:
            neighbours = set(graph.external_ids(graph.neighbors(seed)))
            results = [r for r in results if r.node not in neighbours]
        return list(results[: req.k])

    def _covers(self, stored: StoredRelease, req: QueryRequest, graph: Graph, seed: int) -> bool:
        """A stored release can answer k results (after dropping neighbours if asked)."""
        if req.exclude_neighbors:
            available = len(self._post_process(stored.results, _with_k(req, 10**9), graph, seed))
        else:
            available = len(stored.results)
        return available >= min(
            req.k, graph.n - 1 - (int(graph.degrees[seed]) if req.exclude_neighbors else 0)
        )

    def _replay(
        self, stored: StoredRelease, req: QueryRequest, graph: Graph, seed: int, account_id: int
    ) -> Answer:
        if req.principal.type == "service":  # before the replay is sent
            scale = stored.mechanism.get("degree_noise_scale")
            degree = None if scale is None else degree_release_name(float(scale))
            self._record_reads(req, stored.key.graph_version, stored.charge_id, degree)
        return Answer(
            node=req.node,
            graph_version=graph.version,
            results=self._post_process(stored.results, req, graph, seed),
            mechanism=stored.mechanism,
            budget=self._replay_budget(account_id),
            replayed=True,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=0.0,
            extra={"original_request_id": stored.request_id},
        )

    # -- reads that need not cost a database round trip on every request --------------------

    def _account_delta(self, account_id: int) -> float:
        """The account's delta, re-read at most every ``_DELTA_TTL_SECONDS``. It only picks the
        calibration: admission checks the composed curve at the delta read under its lock."""
        now = time.monotonic()
        hit = self._deltas.get(account_id)
        if hit is None or now - hit[1] > _DELTA_TTL_SECONDS:
            hit = (self.ledger.account_delta(account_id), now)
            if len(self._deltas) > 100_000:
                self._deltas.clear()
            self._deltas[account_id] = hit
        return hit[0]

    def _replay_budget(self, account_id: int) -> BudgetView:
        """The budget shown with a replay (nothing is charged), at most
        ``_REPLAY_BUDGET_TTL_SECONDS`` old; fresh answers show their own receipt's."""
        now = time.monotonic()
        hit = self._budgets.get(account_id)
        if hit is None or now - hit[1] > _REPLAY_BUDGET_TTL_SECONDS:
            hit = (self.ledger.budget(account_id), now)
            if len(self._budgets) > 100_000:
                self._budgets.clear()
            self._budgets[account_id] = hit
        return hit[0]

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
            "score_grid": score_grid(c.noise_scale),
        }


def _degree_charge(plan: DiffusionPlan | RankingPlan) -> DegreeCharge | None:
    """The degree release an answer of ``plan`` is built on (``blended``), as charged."""
    degrees = plan.degrees if isinstance(plan, RankingPlan) else None
    if degrees is None:
        return None
    return DegreeCharge(degrees.graph_version, degrees.plan.epsilon, degrees.plan.curve)


def _degree_release_of(plan: DiffusionPlan | RankingPlan) -> str | None:
    """The graph release name of the degree vector an answer of ``plan`` is built on."""
    degrees = plan.degrees if isinstance(plan, RankingPlan) else None
    return None if degrees is None else degree_release_name(degrees.plan.scale)


def _stored_results(graph: Graph, best: np.ndarray, scores: np.ndarray) -> StoredResults:
    """The stored form of a ranking, the ids taken from the graph's table as UTF-8 bytes."""
    data, lengths = graph.external_ids_utf8(best)
    return StoredResults(data, lengths, scores)


def _with_k(req: QueryRequest, k: int) -> QueryRequest:
    return replace(req, k=k)


def _settled_before_stored(stored: StoredRelease, req: QueryRequest) -> LedgerUnavailable:
    """The error for a release whose charge was settled (reconciled) before it was stored:
    its answer is discarded, nothing was released."""
    log.warning(
        "the charge was settled before its release was stored; answer discarded",
        extra={"request_id": req.request_id, "charge_id": stored.charge_id},
    )
    return LedgerUnavailable(
        "this request took too long and its charge was reconciled; no answer was "
        "released and nothing was charged. Retry",
        details={"charge_id": stored.charge_id},
    )
