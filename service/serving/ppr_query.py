"""Answering one private PPR query: authorize, admit and charge, release, post-process, store.

Data flows one way: request -> authorization -> admission (ledger, one transaction) ->
mechanism (fresh OS-entropy noise) -> post-processing -> stored release -> answer.
Nothing noisy is drawn before the charge is committed. A failure before the first noise draw
is refunded with a compensating ledger row; after it, the charge stays.

:class:`PprQueryService` is the coordinator; each stage is a module of
:mod:`service.serving.pipeline` (prepare, admit, draw, store, answer, replay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.cache.caches import ReplayCache
from service.config import MechanismSettings
from service.ledger.ledger import Ledger
from service.ledger.records import ChargeReceipt, StoredRelease
from service.mechanisms.engine import DiffusionEngine
from service.serving.graph_holder import GraphHolder
from service.serving.pipeline.admit import Admitter
from service.serving.pipeline.answer import PopularAnswers, fresh_answer
from service.serving.pipeline.draw import Drawer
from service.serving.pipeline.errors import IdempotencyKeyReused as IdempotencyKeyReused
from service.serving.pipeline.errors import RequestInProgress as RequestInProgress
from service.serving.pipeline.items import Outcomes, Pending
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.pipeline.prefixes import PrefixProvider
from service.serving.pipeline.prepare import MECHANISM_NAME as MECHANISM_NAME
from service.serving.pipeline.prepare import Preparer
from service.serving.pipeline.reads import ReadFigure
from service.serving.pipeline.replay import Replayer, split_twins
from service.serving.pipeline.store import Storer
from service.serving.planner import DiffusionPlanner
from service.serving.rankings import DegreeReleases
from service.serving.schemas import Answer, QueryRequest

__all__ = ["AdmissionPolicy", "PprQueryService", "PrefixProvider"]


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
        reads = ReadFigure(ledger, self.policy)
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
        )  # fmt: skip
        self.drawing = Drawer(
            engine=self.engine, prefixes=prefixes, ledger=ledger, reads=reads,
            note_budget=self.replaying.note_budget, replay_store_top=replay_store_top,
        )  # fmt: skip
        self.storing = Storer(ledger, replays, ledger_group_max)

    def validate(self, req: QueryRequest) -> float:
        """Check k, epsilon, the mechanism and the mode's options without answering; the
        epsilon to use."""
        return self.preparing.validate(req)

    def answer(self, req: QueryRequest) -> Answer:
        prepared = self.preparing.prepare_one(req)
        if isinstance(prepared, Answer):
            return prepared
        return self._after_admission(prepared, self.admitting.admit(prepared))

    def _after_admission(self, p: Pending, receipt: ChargeReceipt) -> Answer:
        """A twin's release (waiting for it), or this query's own release once stored."""
        joined = self.replaying.join_twin(p, receipt, self.admitting.admit)
        if isinstance(joined, Answer):
            return joined
        stored = self.drawing.draw(p, joined)
        self.storing.store(stored, p.req)  # before the answer leaves the process, or no answer
        return fresh_answer(p, joined, stored)

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
        out = Outcomes(len(reqs), on_ready)
        pending = self.preparing.prepare_many(reqs, out.settle)
        now, later = split_twins(self.admitting.admit_many(pending, out.settle))
        drawn = self.drawing.draw_group(now, run, join=self._after_admission)
        to_store = []
        for (i, p, receipt), outcome in zip(now, drawn, strict=True):
            if isinstance(outcome, (BaseException, Answer)):
                out.settle(i, outcome)
            else:
                to_store.append((i, p, receipt, outcome))
        errors = self.storing.store_many([(p.req, stored) for _, p, _, stored in to_store])
        twins: dict[int, StoredRelease | BaseException] = {}
        for (i, p, receipt, stored), error in zip(to_store, errors, strict=True):
            out.put(i, error if error is not None else fresh_answer(p, receipt, stored))
            twins[stored.charge_id] = error if error is not None else stored
        for i, p, receipt in later:
            out.put(i, self.replaying.from_twin_in_group(p, twins.get(receipt.charge_id)))
        return out.all()
