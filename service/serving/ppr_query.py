"""Answering private rankings: the query service, and its one wiring.

Data flows one way: request -> authorization -> admission (ledger, one transaction) ->
mechanism (fresh OS-entropy noise) -> post-processing -> stored release -> answer.
Nothing noisy is drawn before the charge is committed. A failure before the first noise draw
is refunded with a compensating ledger row; after it, the charge stays.

:class:`PprQueryService` is the ranking kind of :class:`GroupAnswers` (``pipeline/group.py``,
the coordinator that runs the stages in order); each stage is a module of
:mod:`service.serving.pipeline`. DP-IE embeddings share its stages. The API runtime, the batch
worker and the batch run's parameter check all build it with
:func:`build_ppr_query_service`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from service.cache.caches import Caches, ReplayCache
from service.config import MechanismSettings, Settings
from service.ledger.ledger import Ledger
from service.ledger.records import Admission, ChargeReceipt, DegreeReceipt, StoredRelease
from service.mechanisms.engine import DiffusionEngine
from service.serving.graph_holder import GraphHolder
from service.serving.live_charges import LiveCharges
from service.serving.pipeline.admit import Admitter, ranking_admission
from service.serving.pipeline.answer import fresh_answer, popular_answer
from service.serving.pipeline.draw import Drawer
from service.serving.pipeline.graph_caps import GraphCaps
from service.serving.pipeline.group import GroupAnswers
from service.serving.pipeline.items import (
    Admitted,
    KeyedReplay,
    Pending,
    PopularPending,
    Ready,
    Run,
    Step,
    ToAdmit,
)
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.pipeline.prefixes import PrefixProvider
from service.serving.pipeline.prepare import Preparer
from service.serving.pipeline.reads import ReadFigure
from service.serving.pipeline.refusals import RefusalLog
from service.serving.pipeline.replay import Replayer
from service.serving.pipeline.store import Storer
from service.serving.planner import DiffusionPlanner
from service.serving.prefix_tables import SharedPrefixTables
from service.serving.rankings import DegreeReleases
from service.serving.schemas import Answer, QueryRequest

__all__ = ["PprQueryService", "build_ppr_query_service"]


def build_ppr_query_service(
    settings: Settings,
    *,
    graphs: GraphHolder,
    ledger: Ledger,
    caches: Caches | None,
    create_seed_accounts: bool,
    group_commit: bool,
    prefix_tables: SharedPrefixTables | None = None,
    engine: DiffusionEngine | None = None,
) -> PprQueryService:
    """The query service as every entry point builds it, from ``settings``.

    What differs between them is named here: ``caches`` (None: none, for a service that only
    checks parameters), ``create_seed_accounts`` (the API: as configured; a batch run creates
    its accounts itself), ``group_commit`` (concurrent lone queries share admission and
    storing transactions, up to ``ledger_group_max``), ``prefix_tables`` (the machine-wide
    noise-free prefixes, the API's) and ``engine`` (None: a default one)."""
    return PprQueryService(
        graphs=graphs,
        ledger=ledger,
        replays=None if caches is None else caches.replay,
        mechanism=settings,
        prefixes=PrefixProvider(None if caches is None else caches.prefixes, prefix_tables),
        planner=DiffusionPlanner(None if caches is None else caches.calibration),
        replay_store_top=settings.replay_store_top,
        create_seed_accounts=create_seed_accounts,
        policy=AdmissionPolicy.from_settings(settings),
        degree_releases=DegreeReleases(
            ledger, settings.popular_epsilon, None if caches is None else caches.released_degrees
        ),
        engine=engine,
        ledger_group_max=settings.ledger_group_max if group_commit else 1,
        ranking_draws_at_once=settings.ranking_draws_at_once,
    )


class PprQueryService(GroupAnswers[QueryRequest, Pending, KeyedReplay, Answer]):
    """Private rankings: one query (:meth:`answer`, a group of one) or a group
    (:meth:`answer_many`, one admission and one storing transaction for the group)."""

    def __init__(
        self,
        *,
        graphs: GraphHolder,
        ledger: Ledger,
        replays: ReplayCache | None,
        mechanism: MechanismSettings,
        prefixes: PrefixProvider,
        planner: DiffusionPlanner,
        replay_store_top: int,
        create_seed_accounts: bool,
        policy: AdmissionPolicy,
        degree_releases: DegreeReleases,
        engine: DiffusionEngine | None,
        ledger_group_max: int,
        ranking_draws_at_once: int,
    ) -> None:
        self.engine = engine if engine is not None else DiffusionEngine()
        self.graphs = graphs
        self.ledger = ledger
        self.mechanism = mechanism
        self.prefixes = prefixes
        self.planner = planner
        self.replay_store_top = replay_store_top
        self.policy = policy
        self.degree_releases = degree_releases
        # the stages, in their order, after what they share; ledger_group_max > 1: concurrent
        # lone admissions share one transaction, and so do concurrent lone release stores
        self.refusals = RefusalLog(ledger)
        reads = ReadFigure(ledger, self.policy, self.refusals)
        caps = GraphCaps(ledger, self.policy, mechanism, self.planner)
        self.replaying = Replayer(ledger=ledger, replays=replays, reads=reads, policy=self.policy)
        self.preparing = Preparer(
            graphs=graphs, ledger=ledger, mechanism=mechanism, planner=self.planner,
            degree_releases=self.degree_releases, caps=caps,
            create_seed_accounts=create_seed_accounts, replayer=self.replaying, reads=reads,
            refusals=self.refusals,
        )  # fmt: skip
        self.admitting = Admitter(ledger, self.policy, caps, ledger_group_max)
        self.drawing = Drawer(
            engine=self.engine, prefixes=prefixes, ledger=ledger, reads=reads,
            note_budget=self.replaying.note_budget, replay_store_top=replay_store_top,
            ranking_draws_at_once=ranking_draws_at_once,
        )  # fmt: skip
        self.storing = Storer(ledger, replays, ledger_group_max)
        self.live = LiveCharges(
            ledger.settlement.beat_charges, heartbeat_seconds=self.policy.heartbeat_seconds
        )

    def validate(self, req: QueryRequest) -> float:
        """Check k, epsilon, the mechanism and the mode's options without answering; the
        epsilon to use."""
        return self.preparing.validate(req)

    # -- the ranking's steps (GroupAnswers runs them in order) -------------------------------

    def prepare(self, req: QueryRequest) -> Step[Answer, KeyedReplay, Pending]:
        return self.preparing.prepare(req)

    def group_reads(self, reqs: Sequence[QueryRequest]) -> AbstractContextManager[None]:
        return self.preparing.seed_accounts([(r.principal, r.node, r.mode) for r in reqs])

    def bind(
        self, items: list[KeyedReplay]
    ) -> list[Ready[Answer] | ToAdmit[Pending] | BaseException]:
        return self.preparing.bind(items)

    def admission(self, p: Pending) -> Admission:
        return ranking_admission(p, self.policy)

    def draw_group(
        self, admitted: list[Admitted[Pending]], run: Run
    ) -> list[StoredRelease | BaseException]:
        # the diffusions go to the engine together, so it computes them in one block
        return self.drawing.draw_group(admitted, run)

    def fresh_answer(self, p: Pending, receipt: ChargeReceipt, stored: StoredRelease) -> Answer:
        return fresh_answer(p, receipt, stored)

    def replay_admitted(self, stored: StoredRelease, p: Pending) -> Answer:
        return self.replaying.replay(stored, p.req, p.graph, p.seed, p.account_id)

    def popular_answer(self, p: PopularPending, receipt: DegreeReceipt) -> Answer:
        return popular_answer(p, receipt)
