"""The prepare stage: everything before admission, for one request.

Validate the request, find the account it charges, answer it from a stored release when one
can (:class:`Ready`; a keyed query's release only once its Idempotency-Key is bound to it:
:class:`ToBind`, bound by :meth:`Preparer.bind`), else plan the query: its calibration and the
mechanism description its answer carries (:class:`ToAdmit` of a :class:`Pending`). ``popular``
is prepared as a :class:`PopularPending`: the admit stage charges its degree release.

Nothing here charges: admission is the next stage's. The ledger writes made here are the
preparation's own, and none of them is a charge: a seed account created on first use, a
refusal row (a mode not granted, a read cap reached), a replay's (or ``popular``'s) read
figure counted before the stored release it reads is sent, a keyed replay's key bound to its
release (kept here with the replay it answers, rather than split across stages), and the
graph version's degree release, made once per version (``popular``, ``blended``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from service.config import MechanismSettings
from service.errors import Forbidden, InvalidParameter
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import ModeNotAllowed, ReleaseKey
from service.mechanisms.postprocess import score_grid
from service.mechanisms.registry import RankingMechanism, resolve_mechanism
from service.privacy.calibration import DiffusionPlan
from service.privacy.modes import Mode
from service.serving.graph_holder import GraphHolder
from service.serving.pipeline.errors import IdempotencyKeyReused
from service.serving.pipeline.graph_caps import GraphCaps
from service.serving.pipeline.items import (
    KeyedReplay,
    Pending,
    PopularPending,
    Ready,
    Step,
    ToAdmit,
    ToBind,
)
from service.serving.pipeline.reads import ReadFigure
from service.serving.pipeline.refusals import RefusalLog
from service.serving.pipeline.replay import Replayer, covers
from service.serving.planner import DiffusionPlanner
from service.serving.rankings import (
    DegreeReleases,
    RankingPlan,
    degree_release_name,
    plan_ranking,
)
from service.serving.schemas import Answer, Principal, QueryRequest

#: How long an account's delta (calibration only) is reused.
_DELTA_TTL_SECONDS = 5.0


class Preparer:
    """Takes a request as far as it goes without the ledger's admission."""

    def __init__(
        self,
        *,
        graphs: GraphHolder,
        ledger: Ledger,
        mechanism: MechanismSettings,
        planner: DiffusionPlanner,
        degree_releases: DegreeReleases,
        caps: GraphCaps,
        create_seed_accounts: bool,
        replayer: Replayer,
        reads: ReadFigure,
        refusals: RefusalLog,
    ) -> None:
        self.graphs = graphs
        self.refusals = refusals
        self._group = threading.local()  # a group's seed accounts, read together
        self.ledger = ledger
        self.mechanism = mechanism
        self.planner = planner
        self.degree_releases = degree_releases
        self.caps = caps
        self.create_seed_accounts = create_seed_accounts
        self.replayer = replayer
        self.reads = reads
        self._deltas: dict[int, tuple[float, float]] = {}  # account -> (delta, read at)

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

    @contextmanager
    def seed_accounts(self, asked: Sequence[tuple[Principal, str, Mode]]) -> Iterator[None]:
        """While a group is prepared: the seed users' accounts that a service account's
        personalized queries charge, read in one query for the whole group instead of one
        each (principal, node, mode per query; the others need none). Only nodes of the
        graph are looked up: any other is refused before its account is asked for."""
        graph = self.graphs.current
        nodes = [
            node
            for principal, node, mode in asked
            if principal.type == "service" and mode is Mode.PERSONALIZED
            and mode.value in principal.modes and graph.has_node(node)
        ]  # fmt: skip
        if len(nodes) < 2:
            yield
            return
        found = self.ledger.accounts.user_accounts_for_nodes(nodes)
        now = time.monotonic()
        for account_id, delta in found.values():  # the calibration's delta, read with them
            self._deltas[account_id] = (delta, now)
        self._group.accounts = found
        try:
            yield
        finally:
            self._group.accounts = None

    def charged_account(self, principal: Principal, node: str, mode: Mode, graph: Graph) -> int:
        """The account a query by ``principal`` is charged to (or its refusal), for answers
        of other kinds (embeddings) authorized as rankings are."""
        return self._charged_account(principal, node, mode, graph)

    def _charged_account(self, principal: Principal, node: str, mode: Mode, graph: Graph) -> int:
        if principal.type == "user" and principal.node_id != node:
            raise Forbidden("a user account may query only its own node")
        m = self.mechanism
        known: dict[str, tuple[int, float]] | None = getattr(self._group, "accounts", None)
        return charged_account(
            self.ledger, principal, node, mode, create_seed_accounts=self.create_seed_accounts,
            cap_epsilon=m.default_cap_epsilon, delta=m.account_delta,
            record_refusal=self.refusals.record, known_accounts=known,
        )  # fmt: skip

    # -- before admission -----------------------------------------------------------------

    def prepare(self, req: QueryRequest) -> Step[Answer, KeyedReplay, Pending]:
        """Everything before admission: validation, the charged account, replays from stored
        releases, the plan. :class:`Ready` when a stored release answers; a keyed query a
        stored release can answer is that release once its key is bound to it
        (:meth:`bind`), so every retry under the key gets the same one."""
        graph = self.graphs.current  # one version for the whole request
        epsilon = self._validate(req)
        name = self._mechanism_for(req)
        seed = graph.index_of(req.node)
        account_id = self._charged_account(req.principal, req.node, req.mode, graph)
        if name is RankingMechanism.POPULAR:
            return self._popular(req, graph, seed, account_id)
        key = ReleaseKey(account_id, req.node, graph.version, req.mode.value, epsilon, name.value)

        if req.idempotency_key is not None:
            stored = self.replayer.release_for_idempotency_key(req)
            if stored is not None:
                if stored.key != key:
                    raise IdempotencyKeyReused()
                return Ready(self.replayer.replay(stored, req, graph, seed, account_id))
        join_twins = not req.fresh
        if not req.fresh:
            stored = self.replayer.find_release(key)
            if stored is not None and self.replayer.is_due(stored, req.max_age_seconds):
                # too old to replay: drawn anew, once for identical queries arriving together
                # (admission joins them to one charge, and to no release older than the age)
                stored = None
            if stored is not None:
                if covers(stored, req, graph, seed):
                    if req.idempotency_key is not None:
                        return ToBind(
                            KeyedReplay(req, graph, seed, account_id, key, name, epsilon, stored)
                        )
                    return Ready(self.replayer.replay(stored, req, graph, seed, account_id))
                join_twins = False  # the stored release is too short for this query: draw anew
        return ToAdmit(self._plan(req, graph, seed, account_id, key, name, epsilon, join_twins))

    def _popular(
        self, req: QueryRequest, graph: Graph, seed: int, account_id: int
    ) -> PopularPending:
        """``popular``: the graph version's one degree release (made, once per version, if it
        is not yet), counted in a service account's read figure before it is sent; the admit
        stage charges it to the account, once per version. An Idempotency-Key bound to a
        charged query is refused here (422); one bound to ``popular`` is checked at
        admission, in the transaction that binds it."""
        if req.idempotency_key is not None:
            stored = self.replayer.release_for_idempotency_key(req)
            if stored is not None:  # the key belongs to a charged query
                raise IdempotencyKeyReused()
        degrees = self.degree_releases.get(graph, self.caps.for_graph(graph))
        if req.principal.type == "service":
            self.reads.record(req, graph.version, None, degree_release_name(degrees.plan.scale))
        return PopularPending(req, graph, seed, account_id, degrees)

    # -- the plan -------------------------------------------------------------------------

    def bind(
        self, items: list[KeyedReplay]
    ) -> list[Ready[Answer] | ToAdmit[Pending] | BaseException]:
        """Bind the keyed queries' keys to their stored releases in one transaction
        (:meth:`Replayer.bind`): each one's replay, or, its key bound to another charge, the
        query planned to be admitted as that charge's twin."""
        return self.replayer.bind(
            items,
            keyed=lambda b: (b.req, b.stored),
            replay=lambda b: Ready(
                self.replayer.replay(b.stored, b.req, b.graph, b.seed, b.account_id)
            ),
            plan=self._plan_bound,
        )

    def _plan_bound(self, b: KeyedReplay) -> ToAdmit[Pending]:
        """A keyed query whose key was bound already: planned, to be admitted as a twin."""
        return ToAdmit(
            self._plan(b.req, b.graph, b.seed, b.account_id, b.key, b.name, b.epsilon, True)
        )

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
    ) -> Pending:
        """The query prepared for admission: its plan and mechanism description."""
        plan: DiffusionPlan | RankingPlan
        if name is RankingMechanism.NOISY_DIFFUSION:
            delta = self._account_delta(account_id)
            m = self.mechanism
            plan = self.planner.plan(epsilon, delta, m.steps, m.beta, m.eta, req.mode)
            mechanism = mechanism_dict(plan)
        else:
            # blended's degree release is made (or read) before admission: it is the graph
            # version's, counted once in the graph-wide exposure; this account pays for it
            # (once per version) in the query's own admission
            degrees = None
            if name is RankingMechanism.BLENDED:
                degrees = self.degree_releases.get(graph, self.caps.for_graph(graph))
            plan = plan_ranking(name, epsilon, req.mode, degrees)
            mechanism = plan.describe()
        return Pending(req, graph, seed, account_id, key, join_twins, plan, mechanism)

    def _account_delta(self, account_id: int) -> float:
        """The account's delta, re-read at most every ``_DELTA_TTL_SECONDS``. It only picks the
        calibration: admission checks the composed curve at the delta read under its lock."""
        now = time.monotonic()
        hit = self._deltas.get(account_id)
        if hit is None or now - hit[1] > _DELTA_TTL_SECONDS:
            hit = (self.ledger.budgets.account_delta(account_id), now)
            if len(self._deltas) > 100_000:
                self._deltas.clear()
            self._deltas[account_id] = hit
        return hit[0]


def charged_account(
    ledger: Ledger,
    principal: Principal,
    node: str,
    mode: Mode,
    *,
    create_seed_accounts: bool,
    cap_epsilon: float,
    delta: float,
    record_refusal: Callable[..., None] | None = None,
    known_accounts: dict[str, tuple[int, float]] | None = None,
) -> int:
    """The account an answer about ``node`` to ``principal`` in ``mode`` is charged to, or its
    refusal: a user pays for itself; a service account for itself in ``edge`` mode and, when
    granted ``personalized``, charges the seed user's account (created on first charge only if
    both the account and ``create_seed_accounts`` allow it, with ``cap_epsilon`` and
    ``delta``); an admin cannot query. (Which nodes a user may ask about is the caller's rule.)
    ``record_refusal`` writes a refusal (default: at once, in the ledger); ``known_accounts``
    holds seed accounts a group read together (node -> (account, delta))."""
    if principal.type == "admin":
        raise Forbidden("admin accounts manage budgets and cannot query")
    if principal.type == "user":
        return principal.account_id
    if principal.type == "service":
        if mode.value not in principal.modes:
            (record_refusal or ledger.reports.record_refusal)(
                ModeNotAllowed.code, principal_account_id=principal.account_id, mode=mode.value
            )
            raise ModeNotAllowed(
                f"this service account may query in {', '.join(principal.modes)} mode only; "
                f"an admin must grant {mode.value!r} (accounts set-scopes --modes)",
                details={"mode": mode.value, "modes": list(principal.modes)},
            )
        if mode is Mode.EDGE:
            return principal.account_id  # shared answers: every edge protected, paid by caller
        if known_accounts is not None and node in known_accounts:
            return known_accounts[node][0]
        return ledger.accounts.user_account_for_node(
            node,
            create=create_seed_accounts and principal.may_create_seed_accounts,
            cap_epsilon=cap_epsilon,
            delta=delta,
        )
    raise Forbidden(f"account type {principal.type!r} cannot query")


def mechanism_dict(plan: DiffusionPlan) -> dict[str, Any]:
    """The mechanism description a noisy-diffusion answer carries."""
    c = plan.config
    return {
        "name": RankingMechanism.NOISY_DIFFUSION.value,
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
