"""A group of charged queries answered together, whatever kind of release they get.

Each query is prepared alone (a replay or a refusal is its outcome at once; the group's keyed
replays bind their Idempotency-Keys in one transaction), the group is admitted in one ledger
transaction (:meth:`Admitter.admit_many`), its releases are drawn together, stored in one
transaction (:meth:`Storer.store_many`), and no answer is returned before every release of
the group is stored. Queries that joined an identical query of the
same group are answered from its release once stored; those that joined one admitted earlier
wait for its release (or are admitted again if it is refunded).

What a kind of query does differently (rankings in :class:`PprQueryService`, DP-IE embeddings
in :class:`DpEmbeddings`) is how it is prepared, what it is charged, how its release is drawn
and how an answer is made of a stored release; the order of the stages is this module's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, TypeVar

from service.ledger.records import Admission, ChargeReceipt, StoredRelease
from service.serving.live_charges import LiveCharges
from service.serving.pipeline.admit import Admitter
from service.serving.pipeline.items import A, Outcomes, Prepared
from service.serving.pipeline.refusals import RefusalLog
from service.serving.pipeline.replay import split_twins
from service.serving.pipeline.store import Storer

#: A kind's request, the same query prepared for admission, and a keyed query that a stored
#: release answers once its Idempotency-Key is bound to it.
R = TypeVar("R")
P = TypeVar("P", bound=Prepared)
B = TypeVar("B")

#: Runs thunks concurrently and returns each one's result or exception, in order.
Run = Callable[[list[Callable[[], Any]]], list[Any]]


class GroupAnswers(ABC, Generic[R, P, B, A]):
    """Answers groups of one kind of query; the kind supplies the steps that differ."""

    admitting: Admitter
    storing: Storer
    #: The admitted charges still being answered, beating so that no reconciler refunds them.
    live: LiveCharges
    #: Where refusals met while preparing are kept (a group's in one transaction).
    refusals: RefusalLog
    #: The kind's classes of an answer, a query prepared for admission, a keyed replay to bind.
    answer_type: type[A]
    pending_type: type[P]
    to_bind_type: type[B]

    def prepare_one(self, req: R) -> A | P:
        """:meth:`prepare`, a keyed replay's key bound to its release (or the query prepared
        for admission, when the key is bound to another charge already)."""
        prepared = self.prepare(req)
        resolved = self.bind([prepared])[0] if isinstance(prepared, self.to_bind_type) else prepared
        if isinstance(resolved, BaseException):
            raise resolved
        if isinstance(resolved, (self.answer_type, self.pending_type)):
            return resolved
        raise TypeError(f"not an answer or a prepared query: {resolved!r}")  # pragma: no cover

    def prepare_many(
        self, reqs: Sequence[R], settle: Callable[[int, A | BaseException], None]
    ) -> list[tuple[int, P]]:
        """Each request prepared, in order: replays and errors are settled at once, the
        group's keyed replays bind their keys in one transaction; the rest go to admission."""
        pending: list[tuple[int, P]] = []
        to_bind: list[tuple[int, B]] = []
        # the group's refusals: one write at the end; its seed accounts: one read up front
        with self.refusals.gathered(), self.group_reads(reqs):
            for i, req in enumerate(reqs):
                try:
                    prepared = self.prepare(req)
                except Exception as exc:
                    settle(i, exc)
                    continue
                if isinstance(prepared, self.to_bind_type):
                    to_bind.append((i, prepared))
                else:
                    self._sort_out(i, prepared, pending, settle)
            if to_bind:
                bound = self.bind([b for _, b in to_bind])
                for (i, _), resolved in zip(to_bind, bound, strict=True):
                    self._sort_out(i, resolved, pending, settle)
                pending.sort(key=lambda item: item[0])
        return pending

    def _sort_out(
        self,
        i: int,
        prepared: A | P | B | BaseException,
        pending: list[tuple[int, P]],
        settle: Callable[[int, A | BaseException], None],
    ) -> None:
        """A query prepared for admission joins ``pending``; an answer or an error is final."""
        if isinstance(prepared, self.pending_type):
            pending.append((i, prepared))
        elif isinstance(prepared, (self.answer_type, BaseException)):
            settle(i, prepared)
        else:  # pragma: no cover - a keyed replay is bound before it gets here
            raise TypeError(f"not an answer, error or prepared query: {prepared!r}")

    def answer_many(
        self,
        reqs: Sequence[R],
        run: Run,
        on_ready: Callable[[int, A | BaseException], None] | None = None,
    ) -> list[A | BaseException]:
        """Answers to ``reqs`` (or each one's error), admitted in one ledger transaction and
        stored in one: per query the same checks and the same order as a single query
        (admit, draw, store, answer), and no answer is returned before every release of the
        group is stored.

        ``run`` runs draws that are not handed to the engine together (thunks) concurrently
        and returns their results or exceptions in order. ``on_ready(i, outcome)``, if given,
        hears an outcome as soon as it is final (a replay, or an error before admission)
        rather than with the whole group."""
        out: Outcomes[A] = Outcomes(len(reqs), on_ready)
        pending = self.prepare_many(reqs, out.settle)
        now, later = split_twins(self.admitting.admit_many(pending, out.settle, self.admission))
        with self.live.holding(own_charges(receipt for _, _, receipt in now)):
            drawn = self.draw_group(now, run)
            to_store = []
            for (i, p, receipt), outcome in zip(now, drawn, strict=True):
                if isinstance(outcome, StoredRelease):
                    to_store.append((i, p, receipt, outcome))
                else:
                    out.settle(i, outcome)
            errors = self.storing.store_many([(p.req, stored) for _, p, _, stored in to_store])
        twins: dict[int, StoredRelease | BaseException] = {}
        for (i, p, receipt, stored), error in zip(to_store, errors, strict=True):
            out.put(i, error if error is not None else self.fresh_answer(p, receipt, stored))
            twins[stored.charge_id] = error if error is not None else stored
        for i, p, receipt in later:
            out.put(i, self.from_twin_in_group(p, twins.get(receipt.charge_id)))
        return out.all()

    def group_reads(self, reqs: Sequence[R]) -> AbstractContextManager[None]:
        """What the kind reads once for a whole group while it is prepared (none here)."""
        return nullcontext()

    @abstractmethod
    def prepare(self, req: R) -> A | P | B:
        """Everything before admission: validation, the charged account, a replay of a
        stored release (a keyed query's to be bound first), else the query planned."""

    @abstractmethod
    def bind(self, items: list[B]) -> list[A | P | BaseException]:
        """Bind the keyed queries' Idempotency-Keys to their releases in one ledger
        transaction: each one's replay, or (its key bound to another charge) the query
        prepared for admission, or its error."""

    @abstractmethod
    def admission(self, p: P) -> Admission:
        """What admitting ``p`` charges, and to whom."""

    @abstractmethod
    def draw_group(
        self, admitted: list[tuple[int, P, ChargeReceipt]], run: Run
    ) -> list[A | StoredRelease | BaseException]:
        """Each admitted query's release, not yet stored (or, for one that joined a twin
        admitted earlier, that twin's answer; or its error), in order."""

    @abstractmethod
    def fresh_answer(self, p: P, receipt: ChargeReceipt, stored: StoredRelease) -> A:
        """The answer of ``p``'s own release, once stored."""

    @abstractmethod
    def from_twin_in_group(
        self, p: P, twin: StoredRelease | BaseException | None
    ) -> A | BaseException:
        """The answer of a query that joined a twin of its own group, from the twin's
        release as stored (or the error that discarded it)."""


def own_charges(receipts: Iterable[ChargeReceipt]) -> list[int]:
    """The charges these admissions made (not a twin's or a key's earlier charge, which its
    own process keeps alive): the ones this process must keep beating until stored."""
    return [r.charge_id for r in receipts if not (r.reused or r.joined)]
