"""The coordinator: a group of charged queries through the stages, in order.

prepare -> admit -> draw -> store -> answer (:meth:`GroupAnswers.answer_many`), each stage
taking the previous one's output (:mod:`.items`); a lone query is a group of one
(:meth:`GroupAnswers.answer`). Per query the checks and the order are the same whatever the
group's size:

- prepare: each request alone; a replay or an error is its outcome at once, the group's keyed
  replays bind their Idempotency-Keys in one transaction;
- admit: the group in one ledger transaction (:meth:`Admitter.admit`; ``popular`` pays its
  degree release there too); a refused query writes nothing and is answered with its refusal;
- draw: the group's own charges' releases, drawn together, nothing before its admission;
- store: those releases in one transaction (:meth:`Storer.store_many`);
- answer: no answer is returned before every release of the group is stored. A query that
  joined an identical query of the same group is answered from its release once stored; one
  that joined a query admitted earlier waits for that release (or is admitted again, and
  drawn, stored and answered alone, if it is refunded).

What a kind of query does differently (rankings in :class:`PprQueryService`, DP-IE embeddings
in :class:`DpEmbeddings`) is how it is prepared, what it is charged, how its release is drawn
and how an answer is made of a stored release; the order of the stages is this module's.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, TypeVar

from service.ledger.records import Admission, ChargeReceipt, DegreeReceipt, StoredRelease
from service.serving.live_charges import LiveCharges
from service.serving.pipeline.admit import Admitter
from service.serving.pipeline.items import (
    A,
    Admitted,
    AdmittedGroup,
    B,
    Drawn,
    Outcomes,
    P,
    PopularPending,
    PreparedGroup,
    Ready,
    Run,
    Step,
    ToAdmit,
    ToBind,
    run_in_turn,
)
from service.serving.pipeline.refusals import RefusalLog
from service.serving.pipeline.replay import Replayer
from service.serving.pipeline.store import Storer

#: A kind's request.
R = TypeVar("R")

#: A query's outcome, and a settled one told to ``on_ready`` at once.
Settle = Callable[[int, Any], None]


class GroupAnswers(ABC, Generic[R, P, B, A]):
    """Answers groups of one kind of query; the kind supplies the steps that differ."""

    admitting: Admitter
    replaying: Replayer
    storing: Storer
    #: The admitted charges still being answered, beating so that no reconciler refunds them.
    live: LiveCharges
    #: Where refusals met while preparing are kept (a group's in one transaction).
    refusals: RefusalLog

    def answer(self, req: R) -> A:
        """One query: a group of one, on this thread (its error is raised)."""
        outcome = self.answer_many([req], run_in_turn)[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def answer_many(
        self,
        reqs: Sequence[R],
        run: Run,
        on_ready: Callable[[int, A | BaseException], None] | None = None,
    ) -> list[A | BaseException]:
        """Answers to ``reqs`` (or each one's error), in order, through the stages.

        ``run`` runs the draws that are not handed to the engine together (thunks), and the
        waits for twins admitted earlier, concurrently; it returns their results or exceptions
        in order. ``on_ready(i, outcome)``, if given, hears an outcome as soon as it is final
        (a replay, a refusal, an error before storing) rather than with the whole group."""
        out: Outcomes[A] = Outcomes(len(reqs), on_ready)
        prepared = self.prepare_group(reqs, out.settle)
        admitted = self.admitting.admit(prepared, self.admission)
        for i, refusal in admitted.refused:
            out.settle(i, refusal)
        with self.live.holding([r.charge_id for _, _, r in admitted.own]):
            drawn = self._drawn(admitted.own, run, out.settle)
            errors = self.storing.store_many([(p.req, release) for _, p, _, release in drawn])
        self._answer(list(zip(drawn, errors, strict=True)), admitted, run, out)
        return out.all()

    # -- the stages -------------------------------------------------------------------------

    def prepare_group(self, reqs: Sequence[R], settle: Settle) -> PreparedGroup[P]:
        """prepare: each request in order; replays and errors are settled at once, the
        group's keyed replays bind their keys in one transaction; the rest go to admission."""
        group: PreparedGroup[P] = PreparedGroup()
        to_bind: list[tuple[int, B]] = []
        # the group's refusals: one write at the end; its seed accounts: one read up front
        with self.refusals.gathered(), self.group_reads(reqs):
            for i, req in enumerate(reqs):
                try:
                    step = self.prepare(req)
                except Exception as exc:
                    settle(i, exc)
                    continue
                if isinstance(step, ToBind):
                    to_bind.append((i, step.query))
                else:
                    _file(i, step, group, settle)
            if to_bind:
                bound = self.bind([b for _, b in to_bind])
                for (i, _), resolved in zip(to_bind, bound, strict=True):
                    _file(i, resolved, group, settle)
                group.to_admit.sort(key=lambda item: item[0])
        return group

    def _drawn(self, own: list[Admitted[P]], run: Run, settle: Settle) -> list[Drawn[P]]:
        """draw: the own charges' releases (not yet stored); a failed draw is settled."""
        drawn: list[Drawn[P]] = []
        for (i, p, receipt), release in zip(own, self.draw_group(own, run), strict=True):
            if isinstance(release, BaseException):
                settle(i, release)
            else:
                drawn.append((i, p, receipt, release))
        return drawn

    def _answer(
        self,
        stored: list[tuple[Drawn[P], BaseException | None]],
        admitted: AdmittedGroup[P],
        run: Run,
        out: Outcomes[A],
    ) -> None:
        """answer: every release of the group is stored (or discarded) by now."""
        twins: dict[int, StoredRelease | BaseException] = {}
        for (i, p, receipt, release), error in stored:
            out.put(i, error if error is not None else self.fresh_answer(p, receipt, release))
            twins[release.charge_id] = error if error is not None else release
        for i, p, receipt in admitted.joined_here:
            twin = twins.get(receipt.charge_id)
            out.put(i, self.replaying.from_twin_in_group(p, twin, self.replay_admitted))
        for i, popular, paid in admitted.popular:
            out.put(i, self.popular_answer(popular, paid))
        earlier = admitted.joined_earlier
        waits: list[Callable[[], Any]] = [
            functools.partial(self._from_earlier_twin, p, r) for _, p, r in earlier
        ]
        for (i, _, _), outcome in zip(earlier, run(waits) if waits else [], strict=True):
            out.put(i, outcome)

    def _from_earlier_twin(self, p: P, receipt: ChargeReceipt) -> A:
        """A query that joined a twin admitted before its group: the twin's release once
        stored; the twin refunded, this query admitted again (as a group of one) and, charged,
        drawn, stored and answered alone."""
        return self.replaying.join_twin(
            p, receipt, self._admit_again, self.replay_admitted, self._draw_store_answer
        )

    def _admit_again(self, p: P) -> ChargeReceipt:
        again = self.admitting.admit(PreparedGroup(to_admit=[(0, p)]), self.admission)
        for _, refusal in again.refused:
            raise refusal
        ((_, _, receipt),) = again.own + again.joined_earlier
        return receipt

    def _draw_store_answer(self, p: P, receipt: ChargeReceipt) -> A:
        with self.live.holding([receipt.charge_id]):
            (release,) = self.draw_group([(0, p, receipt)], run_in_turn)
            if isinstance(release, BaseException):
                raise release
            (error,) = self.storing.store_many([(p.req, release)])
        if error is not None:
            raise error
        return self.fresh_answer(p, receipt, release)

    # -- what a kind does ---------------------------------------------------------------------

    def group_reads(self, reqs: Sequence[R]) -> AbstractContextManager[None]:
        """What the kind reads once for a whole group while it is prepared (none here)."""
        return nullcontext()

    def popular_answer(self, p: PopularPending, receipt: DegreeReceipt) -> A:
        """``popular``'s answer, its degree release paid for: only a kind whose
        :meth:`prepare` makes a :class:`PopularPending` (rankings) answers one."""
        raise TypeError(f"{type(self).__name__} prepares no popular query")

    @abstractmethod
    def prepare(self, req: R) -> Step[A, B, P]:
        """Everything before admission: validation, the charged account, a replay of a
        stored release (a keyed query's to be bound first), else the query planned."""

    @abstractmethod
    def bind(self, items: list[B]) -> list[Ready[A] | ToAdmit[P] | BaseException]:
        """Bind the keyed queries' Idempotency-Keys to their releases in one ledger
        transaction: each one's replay, or (its key bound to another charge) the query
        prepared for admission, or its error."""

    @abstractmethod
    def admission(self, p: P) -> Admission:
        """What admitting ``p`` charges, and to whom."""

    @abstractmethod
    def draw_group(
        self, admitted: list[Admitted[P]], run: Run
    ) -> list[StoredRelease | BaseException]:
        """Each admitted query's release, not yet stored, or its error, in order."""

    @abstractmethod
    def fresh_answer(self, p: P, receipt: ChargeReceipt, stored: StoredRelease) -> A:
        """The answer of ``p``'s own release, once stored."""

    @abstractmethod
    def replay_admitted(self, stored: StoredRelease, p: P) -> A:
        """The answer of ``p``, which joined a twin, from the twin's stored release."""


def _file(
    i: int,
    step: Ready[A] | ToAdmit[P] | PopularPending | BaseException,
    group: PreparedGroup[P],
    settle: Settle,
) -> None:
    """One request's prepared outcome into the group: to admit, or final."""
    match step:
        case ToAdmit(query=query):
            group.to_admit.append((i, query))
        case PopularPending():
            group.popular.append((i, step))
        case Ready(answer=answer):
            settle(i, answer)
        case _:
            settle(i, step)
