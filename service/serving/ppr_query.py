"""Answering one private PPR query: authorize, admit and charge, release, post-process, store.

Data flows one way: request -> authorization -> admission (ledger, one transaction) ->
mechanism (fresh OS-entropy noise) -> post-processing -> stored release -> answer.
Nothing noisy is drawn before the charge is committed. A failure before the first noise draw
is refunded with a compensating ledger row; after it, the charge stays.

The API runtime, the batch worker and the batch run's parameter check all build the service
with :func:`build_ppr_query_service`.

:class:`PprQueryService` is the coordinator; each stage is a module of
:mod:`service.serving.pipeline` (prepare, admit, draw, store, answer, replay). A group of
queries (a batch, or the single queries the coalescer gathers) is answered by
:meth:`GroupAnswers.answer_many` (``pipeline/group.py``), which DP-IE embeddings share.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from service.cache.caches import Caches, ReplayCache
from service.config import MechanismSettings, Settings
from service.ledger.ledger import Ledger
from service.ledger.records import Admission, ChargeReceipt, StoredRelease
from service.mechanisms.engine import DiffusionEngine
from service.serving.graph_holder import GraphHolder
from service.serving.live_charges import LiveCharges
from service.serving.pipeline.admit import Admitter
from service.serving.pipeline.answer import PopularAnswers, fresh_answer
from service.serving.pipeline.draw import Drawer
from service.serving.pipeline.group import GroupAnswers, Run, own_charges
from service.serving.pipeline.items import Admitted, Pending, ToBind
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
    )


class PprQueryService(GroupAnswers[QueryRequest, Pending, ToBind, Answer]):
    """Private rankings: one query (:meth:`answer`) or a group (:meth:`answer_many`, one
    admission and one storing transaction for the group)."""

    answer_type = Answer
    pending_type = Pending
    to_bind_type = ToBind

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
        # the stages, each after those it uses; ledger_group_max > 1: concurrent admissions
        # share one transaction, and so do concurrent release stores
        self.refusals = RefusalLog(ledger)
        reads = ReadFigure(ledger, self.policy, self.refusals)
        self.admitting = Admitter(ledger, self.policy, mechanism, self.planner, ledger_group_max)
        self.replaying = Replayer(ledger=ledger, replays=replays, reads=reads, policy=self.policy)
        popular = PopularAnswers(
            ledger=ledger, degree_releases=self.degree_releases, reads=reads,
            admitter=self.admitting, replayer=self.replaying,
        )  # fmt: skip
        self.preparing = Preparer(
            graphs=graphs, ledger=ledger, mechanism=mechanism, planner=self.planner,
            degree_releases=self.degree_releases, create_seed_accounts=create_seed_accounts,
            admitter=self.admitting, replayer=self.replaying, popular=popular,
            refusals=self.refusals,
        )  # fmt: skip
        self.drawing = Drawer(
            engine=self.engine, prefixes=prefixes, ledger=ledger, reads=reads,
            note_budget=self.replaying.note_budget, replay_store_top=replay_store_top,
        )  # fmt: skip
        self.storing = Storer(ledger, replays, ledger_group_max)
        self.live = LiveCharges(
            ledger.settlement.beat_charges, heartbeat_seconds=self.policy.heartbeat_seconds
        )

    def validate(self, req: QueryRequest) -> float:
        """Check k, epsilon, the mechanism and the mode's options without answering; the
        epsilon to use."""
        return self.preparing.validate(req)

    def answer(self, req: QueryRequest) -> Answer:
        prepared = self.prepare_one(req)
        if isinstance(prepared, Answer):
            return prepared
        return self._after_admission(prepared, self.admitting.admit(prepared))

    def _after_admission(self, p: Pending, receipt: ChargeReceipt) -> Answer:
        """A twin's release (waiting for it), or this query's own release once stored."""
        joined = self.replaying.join_twin(p, receipt, self.admitting.admit)
        if isinstance(joined, Answer):
            return joined
        with self.live.holding(own_charges([joined])):
            stored = self.drawing.draw(p, joined)
            self.storing.store(stored, p.req)  # before the answer leaves, or no answer
        return fresh_answer(p, joined, stored)

    # -- a group (GroupAnswers.answer_many): the ranking's steps ------------------------------

    def prepare(self, req: QueryRequest) -> Answer | Pending | ToBind:
        return self.preparing.prepare(req)

    def group_reads(self, reqs: Sequence[QueryRequest]) -> AbstractContextManager[None]:
        return self.preparing.seed_accounts([(r.principal, r.node, r.mode) for r in reqs])

    def bind(self, items: list[ToBind]) -> list[Answer | Pending | BaseException]:
        return self.preparing.bind(items)

    def admission(self, p: Pending) -> Admission:
        return self.admitting.admission(p)

    def draw_group(
        self, admitted: list[Admitted], run: Run
    ) -> list[Answer | StoredRelease | BaseException]:
        # the diffusions go to the engine together, so it computes them in one block
        return self.drawing.draw_group(admitted, run, join=self._after_admission)

    def fresh_answer(self, p: Pending, receipt: ChargeReceipt, stored: StoredRelease) -> Answer:
        return fresh_answer(p, receipt, stored)

    def from_twin_in_group(
        self, p: Pending, twin: StoredRelease | BaseException | None
    ) -> Answer | BaseException:
        return self.replaying.from_twin_in_group(p, twin)
