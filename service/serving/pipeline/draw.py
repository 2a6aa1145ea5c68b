"""The draw stage: each admitted query's noisy release, never before its charge is committed.

A diffusion is handed to the engine, which runs it in a block with concurrent queries (a
group's diffusions all go to the engine before the first is waited for, so they share one
block); the other rankings draw their Laplace noise here. A failure before the first noise
draw refunds the charge with a compensating ledger row; after it, the charge stays. The
release is ranked into its stored form (the top ``replay_store_top``, plus room to drop the
seed's neighbours on replay); it is not yet stored, and must be before it is answered.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import BudgetView, ChargeReceipt, StoredRelease
from service.ledger.release_format import StoredResults
from service.mechanisms.engine import DiffusionEngine, EngineFailure
from service.mechanisms.postprocess import RankedNode, ranked_indices, score_grid
from service.mechanisms.randomness import fresh_generator
from service.privacy.calibration import DiffusionPlan
from service.privacy.modes import Mode
from service.serving.pipeline.admit import degree_release_of
from service.serving.pipeline.items import Admitted, Pending, Run, Started, run_in_turn
from service.serving.pipeline.prefixes import PrefixProvider
from service.serving.pipeline.reads import ReadFigure
from service.serving.rankings import RankingPlan, draw_ranked
from service.serving.schemas import QueryRequest


class Drawer:
    """Draws admitted queries' releases: alone, or a group's together."""

    def __init__(
        self,
        *,
        engine: DiffusionEngine,
        prefixes: PrefixProvider,
        ledger: Ledger,
        reads: ReadFigure,
        note_budget: Callable[[int, BudgetView], None],
        replay_store_top: int,
        ranking_draws_at_once: int,
    ) -> None:
        self.engine = engine
        self.prefixes = prefixes
        self.ledger = ledger
        self.reads = reads
        self.note_budget = note_budget
        self.replay_store_top = replay_store_top
        # the count rankings' draws hold the interpreter lock nearly throughout: 16 at once
        # took 3.2x the CPU of one at a time (docs/notes/performance-blended-draws-2026-11-30.md)
        self.ranking_draws_at_once = ranking_draws_at_once
        self._ranking_turns = threading.BoundedSemaphore(ranking_draws_at_once)

    def draw(self, p: Pending, receipt: ChargeReceipt) -> StoredRelease:
        """The admitted query's noisy release (not yet stored: it must be, before answering)."""
        return self.finish(p, self.start(p, receipt))

    def start(self, p: Pending, receipt: ChargeReceipt) -> Started | StoredRelease:
        """Begin the admitted query's release: a diffusion is handed to the engine and returns
        at once (:meth:`finish` waits for it); another ranking is drawn here."""
        self.note_budget(p.account_id, receipt.budget)  # for replays here
        if p.req.principal.type == "service":  # counted by its admission: replays need no write
            degree = degree_release_of(p.plan)
            self.reads.counted(p.req, p.graph.version, receipt.charge_id, degree)
        if isinstance(p.plan, DiffusionPlan):
            return self._start_diffusion(p.graph, p.seed, p.plan, receipt.charge_id)
        results, mechanism = self._draw_ranking(
            p.graph, p.seed, p.plan, receipt.charge_id, p.req, p.mechanism
        )
        return StoredRelease(
            p.key, receipt.charge_id, results, mechanism, p.req.request_id, datetime.now(UTC)
        )

    def finish(self, p: Pending, started: Started | StoredRelease) -> StoredRelease:
        if isinstance(started, StoredRelease):
            return started
        results = self._finish_diffusion(started)
        return StoredRelease(
            p.key, started.charge_id, results, p.mechanism, p.req.request_id, datetime.now(UTC)
        )

    def _start_diffusion(
        self, graph: Graph, seed: int, plan: DiffusionPlan, charge_id: int
    ) -> Started:
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
            self.ledger.settlement.refund(charge_id, reason="failed before any noise was drawn")
            raise
        return Started(future, where, prefix is None, charge_id, config.noise_scale)

    def _finish_diffusion(self, started: Started) -> Sequence[RankedNode]:
        """Wait for the engine's result, then rank it (the stored form of the release)."""
        try:
            result = started.future.result()
        except EngineFailure as exc:
            if not exc.noise_drawn:  # it failed in the noise-free prefix: nothing released
                self.ledger.settlement.refund(
                    started.charge_id, reason="failed before any noise was drawn"
                )
            raise exc.error from None
        graph, seed, mode, _, _, _ = started.where
        if started.cold and result.prefix is not None:
            self.prefixes.remember(*started.where, result.prefix)
        keep = self.replay_store_top
        if mode is Mode.PERSONALIZED:
            keep += int(graph.degrees[seed])  # room to drop the seed's neighbours on replay
        grid = score_grid(started.noise_scale)
        return stored_results(graph, *ranked_indices(graph, seed, result.scores, keep, grid=grid))

    def _draw_ranking(
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
            self.ledger.settlement.refund(charge_id, reason="failed before any noise was drawn")
            raise
        keep = self.replay_store_top + int(graph.degrees[seed])
        best, scores, _, extra = draw_ranked(graph, seed, plan, rng, keep)
        return stored_results(graph, best, scores), {**mechanism, **extra}

    # -- a group --------------------------------------------------------------------------

    def draw_group(
        self,
        admitted: list[Admitted[Pending]],
        run: Run,
    ) -> list[StoredRelease | BaseException]:
        """Each admitted query's release (charged to it: no twin's), or its error, in order.
        Every diffusion goes to the engine before the first is waited for, so they share a
        block without a thread each; the rest are drawn in turns (:meth:`_in_turns`)."""
        started: dict[int, Started | StoredRelease | BaseException] = {}
        thunks: list[Callable[[], Any]] = []
        with self.engine.together():  # an idle engine starts them as one block
            for j, (_, p, r) in enumerate(admitted):
                if isinstance(p.plan, DiffusionPlan):
                    try:
                        started[j] = self.start(p, r)
                    except Exception as exc:
                        started[j] = exc
                else:
                    thunks.append(functools.partial(self.draw, p, r))
        ran = iter(self._in_turns(thunks, run))
        drawn: list[StoredRelease | BaseException] = []
        for j, (_, p, _) in enumerate(admitted):
            if j not in started:
                drawn.append(next(ran))
                continue
            begun = started[j]
            try:
                drawn.append(begun if isinstance(begun, BaseException) else self.finish(p, begun))
            except Exception as exc:
                drawn.append(exc)
        return drawn

    def _in_turns(self, thunks: list[Callable[[], Any]], run: Run) -> list[Any]:
        """The count rankings' draws, each one's release or exception, in order: shared among
        at most ``ranking_draws_at_once`` turns, each drawing its share one after the other,
        each draw holding one of the worker's ``ranking_draws_at_once`` slots (shared by every
        group and batch, so a batch's draws do not keep a lone query waiting for all of them).
        One turn runs on this thread: no thread is woken per draw (16 threads taking one slot
        in turn spent a tenth of a worker's time handing it over); more run on ``run``."""
        turns = min(self.ranking_draws_at_once, len(thunks))
        if turns == 0:
            return []
        shares = [thunks[t::turns] for t in range(turns)]
        if turns == 1:
            drawn = [self._turn(shares[0])]
        else:
            drawn = run([functools.partial(self._turn, share) for share in shares])
        out: list[Any] = [None] * len(thunks)
        for t, share in enumerate(drawn):
            if isinstance(share, BaseException):  # pragma: no cover - a turn catches its own
                share = [share] * len(shares[t])
            out[t::turns] = share
        return out

    def _turn(self, share: list[Callable[[], Any]]) -> list[Any]:
        """One turn: its draws one after the other, each holding a slot while it draws."""
        return run_in_turn([functools.partial(self._in_slot, thunk) for thunk in share])

    def _in_slot(self, thunk: Callable[[], Any]) -> Any:
        with self._ranking_turns:
            return thunk()


def stored_results(graph: Graph, best: np.ndarray, scores: np.ndarray) -> StoredResults:
    """The stored form of a ranking, the ids taken from the graph's table as UTF-8 bytes."""
    data, lengths = graph.external_ids_utf8(best)
    return StoredResults(data, lengths, scores)
