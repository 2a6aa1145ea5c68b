"""Replaying: answers from stored releases, at no charge.

A stored release answers a query that is identical to the one it was drawn for (the same
account, seed, graph version, mode, epsilon and mechanism) when it holds k results; a retry
under the same Idempotency-Key gets the release its key is bound to in the ledger (binding a
key to a release found before admission takes one transaction for a whole group). A query
whose identical twin was admitted first waits for the twin's release (and is admitted again if
the twin is refunded instead). The database is the truth; the replay cache sits in front.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from service.cache.caches import ReplayCache
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import BudgetView, ChargeReceipt, ReleaseKey, StoredRelease
from service.serving.pipeline.errors import IdempotencyKeyReused, RequestInProgress
from service.serving.pipeline.items import A, P
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.pipeline.reads import ReadFigure
from service.serving.pipeline.results import post_process
from service.serving.rankings import degree_release_name
from service.serving.refresh import replayable_after
from service.serving.schemas import Answer, QueryRequest

log = logging.getLogger(__name__)

#: A keyed query a stored release answers once its key is bound to it, and what binding its
#: key makes of it: its replay, or (the key bound to another charge) the query to admit.
K = TypeVar("K")
R = TypeVar("R")
Q = TypeVar("Q")

#: How long a replay's budget view is reused.
_REPLAY_BUDGET_TTL_SECONDS = 1.0

#: How often an admission is retried after the charge it waited on was refunded.
_MAX_ADMISSIONS = 3


class Replayer:
    """Finds stored releases and answers with them."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        replays: ReplayCache | None,
        reads: ReadFigure,
        policy: AdmissionPolicy,
    ) -> None:
        self.ledger = ledger
        self.replays = replays
        self.reads = reads
        self.policy = policy
        self._budgets: dict[int, tuple[BudgetView, float]] = {}  # account -> (budget, read at)

    # -- finding stored releases ----------------------------------------------------------

    def find_release(self, key: ReleaseKey) -> StoredRelease | None:
        if self.replays is not None:
            hit = self.replays.get(key)
            if hit is not None:
                return hit
        stored = self.ledger.stored_releases.find_release(key)
        if stored is not None and self.replays is not None:
            self.replays.put(stored)
        return stored

    def cached_release(self, key: ReleaseKey) -> StoredRelease | None:
        """The stored release a query may be replayed from before admission, where looking is
        cheap. With a replay cache every worker shares (Redis, reachable), its entry only: a
        miss (a first ask, or an entry evicted or expired) goes on to admission, which reads the
        ledger under the account's lock and joins the release it finds, charging nothing (the
        ledger stays the arbiter; the kind then caches that release again). Without one, the
        ledger's, as :meth:`find_release`."""
        if self.replays is not None and self.replays.shared:
            hit = self.replays.get(key)
            if hit is not None or self.replays.shared:  # still reachable: the miss is Redis's
                return hit
        return self.find_release(key)

    def cache_joined(self, stored: StoredRelease) -> None:
        """Cache a release that admission joined (found in the ledger, or a twin's), so the
        next identical query replays it before admission (:meth:`cached_release`)."""
        if self.replays is not None and self.replays.shared:
            self.replays.put(stored)

    def release_for_idempotency_key(self, req: QueryRequest) -> StoredRelease | None:
        principal, idem = req.principal.account_id, req.idempotency_key or ""
        if self.replays is not None:
            hit = self.replays.get_for_idempotency(principal, idem)
            if hit is not None:
                return hit
        stored = self.ledger.stored_releases.release_for_idempotency_key(principal, idem)
        if stored is not None and self.replays is not None:
            self.replays.put_for_idempotency(principal, idem, stored)
        return stored

    # -- answering with one ---------------------------------------------------------------

    def replay(
        self, stored: StoredRelease, req: QueryRequest, graph: Graph, seed: int, account_id: int
    ) -> Answer:
        if req.principal.type == "service":  # before the replay is sent
            scale = stored.mechanism.get("degree_noise_scale")
            degree = None if scale is None else degree_release_name(float(scale))
            self.reads.record(req, stored.key.graph_version, stored.charge_id, degree)
        return Answer(
            node=req.node,
            graph_version=graph.version,
            results=post_process(stored.results, req, graph, seed),
            mechanism=stored.mechanism,
            budget=self._replay_budget(account_id),
            replayed=True,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=0.0,
            extra={"original_request_id": stored.request_id, **release_age(stored)},
        )

    def is_due(self, stored: StoredRelease, max_age_seconds: int | None) -> bool:
        """True when ``stored`` is at least ``max_age_seconds`` old (None: never due)."""
        cutoff = replayable_after(max_age_seconds)
        if cutoff is None:
            return False
        released_at = stored.released_at
        if released_at is None:  # an entry cached without its time: the ledger row has it
            row = self.ledger.stored_releases.release_for_charge(stored.charge_id)
            released_at = None if row is None else row.released_at
        if released_at is None:
            return True  # its release is gone: draw anew
        return released_at <= cutoff

    def note_budget(self, account_id: int, budget: BudgetView) -> None:
        """A fresh receipt's budget, shown with this account's replays for a while."""
        self._budgets[account_id] = (budget, time.monotonic())

    def _replay_budget(self, account_id: int) -> BudgetView:
        """The budget shown with a replay (nothing is charged), at most
        ``_REPLAY_BUDGET_TTL_SECONDS`` old; fresh answers show their own receipt's."""
        now = time.monotonic()
        hit = self._budgets.get(account_id)
        if hit is None or now - hit[1] > _REPLAY_BUDGET_TTL_SECONDS:
            hit = (self.ledger.budgets.budget(account_id), now)
            if len(self._budgets) > 100_000:
                self._budgets.clear()
            self._budgets[account_id] = hit
        return hit[0]

    # -- Idempotency-Key binding ----------------------------------------------------------

    def bind(
        self,
        items: Sequence[K],
        keyed: Callable[[K], tuple[QueryRequest, StoredRelease]],
        replay: Callable[[K], R],
        plan: Callable[[K], Q],
    ) -> list[R | Q | BaseException]:
        """Bind each keyed query's Idempotency-Key to the stored release found for it
        (``keyed``: the query and that release), all in one ledger transaction, and answer
        with that release (``replay``). A key bound already (by an earlier or a concurrent
        request) keeps its charge: that query is planned (``plan``) and goes on to admission,
        which finds the binding and answers with its release (or 422 for a different query)."""
        pairs = [keyed(item) for item in items]
        try:
            charges = self.ledger.stored_releases.bind_idempotency_keys(
                [(q.principal.account_id, q.idempotency_key or "", s.charge_id) for q, s in pairs]
            )
        except Exception as exc:
            return [exc] * len(items)
        bound = [charge == s.charge_id for (_, s), charge in zip(pairs, charges, strict=True)]
        self._cache_bound(
            [
                (stored, query.principal.account_id, query.idempotency_key)
                for (query, stored), is_bound in zip(pairs, bound, strict=True)
                if is_bound
            ]
        )
        out: list[R | Q | BaseException] = []
        for item, is_bound in zip(items, bound, strict=True):
            try:  # a service account's replay may be refused by its read cap
                out.append(replay(item) if is_bound else plan(item))
            except Exception as exc:
                out.append(exc)
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

    # -- twins: an identical query admitted first -----------------------------------------

    def join_twin(
        self,
        p: P,
        receipt: ChargeReceipt,
        admit: Callable[[P], ChargeReceipt],
        replay: Callable[[StoredRelease, P], A],
        own: Callable[[P, ChargeReceipt], A],
    ) -> A:
        """A twin's release (waiting for it), answered by ``replay``; or, the twin refunded,
        this query admitted again (``admit``) and, charged, answered by ``own``."""
        for _ in range(_MAX_ADMISSIONS):
            if not (receipt.reused or receipt.joined):
                return own(p, receipt)
            # An identical query (or a retry with the same Idempotency-Key) was admitted
            # first: its release is the answer, once stored. If it is refunded instead (its
            # worker died and it was reconciled), admission runs again and may charge.
            stored = self._wait_for_release(receipt.charge_id)
            if stored is not None:
                if stored.key != p.key:
                    raise IdempotencyKeyReused()
                self._cache_bound([(stored, p.req.principal.account_id, p.req.idempotency_key)])
                return replay(stored, p)
            receipt = admit(p)
        raise RequestInProgress(
            "an identical request is still being answered; retry shortly", retry_after=1
        )

    def _wait_for_release(self, charge_id: int) -> StoredRelease | None:
        """The release of ``charge_id`` once stored; None once it is refunded. A charge still
        in flight after ``twin_wait_seconds`` answers 409 with Retry-After."""
        deadline = time.monotonic() + self.policy.twin_wait_seconds
        pause = 0.005
        while True:
            state = self.ledger.settlement.charge_state(charge_id)
            if state == "released":
                return self.ledger.stored_releases.release_for_charge(charge_id)
            if state == "refunded":
                return None
            if time.monotonic() >= deadline:
                raise RequestInProgress(
                    "an identical request is still being answered; retry shortly",
                    retry_after=max(1, math.ceil(self.policy.twin_wait_seconds)),
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def from_twin_in_group(
        self,
        p: P,
        twin: StoredRelease | BaseException | None,
        replay: Callable[[StoredRelease, P], A],
    ) -> A | BaseException:
        """A group's query that joined a twin of the same group: the twin's release as
        stored, answered by ``replay`` (or the error that discarded it)."""
        if twin is None or isinstance(twin, BaseException):
            return twin or RequestInProgress(
                "an identical request failed before its answer was stored; retry",
                retry_after=1,
            )
        if twin.key != p.key:
            return IdempotencyKeyReused()
        try:  # a service account's replay may be refused by its read cap
            return replay(twin, p)
        except Exception as exc:
            return exc


def covers(stored: StoredRelease, req: QueryRequest, graph: Graph, seed: int) -> bool:
    """A stored release can answer k results (after dropping neighbours if asked)."""
    if req.exclude_neighbors:
        available = len(post_process(stored.results, replace(req, k=10**9), graph, seed))
    else:
        available = len(stored.results)
    return available >= min(
        req.k, graph.n - 1 - (int(graph.degrees[seed]) if req.exclude_neighbors else 0)
    )


def release_age(stored: StoredRelease) -> dict[str, Any]:
    """A replay's ``released_at`` (ISO 8601, UTC) and ``age_seconds``, when known."""
    if stored.released_at is None:
        return {}
    age = max(0.0, (datetime.now(UTC) - stored.released_at).total_seconds())
    return {"released_at": stored.released_at.isoformat(), "age_seconds": round(age, 3)}
