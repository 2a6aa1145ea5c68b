"""Single queries answered in groups: the requests a worker's event loop holds at one moment
share one admission transaction, one engine block and one storing transaction.

A query that arrives while fewer than ``groups_in_flight`` groups run starts a group at once
(no added latency on an idle service). Queries that arrive while that many groups run wait on
the event loop, not on a thread each; when a group finishes, the next one takes everything
waiting (up to ``max_group``). Each group runs :meth:`PprQueryService.answer_many` on one
thread: per query the same checks, the same ledger transaction shape and the same order
(admit, draw, store, answer) as a query answered alone, and no answer leaves before its
release is stored. A replay or an error known before admission is answered as soon as it is
known, not with the rest of its group.

Gathering. Under steady load the callers of a group that just finished send their next
queries a moment later. Started at once, the next group would hold only the few queries
that arrived during the last one, and those callers would come back while it runs: a
worker's callers split into two cohorts whose groups alternate, one of them often a single
query (measured: groups of 15 and of 1 in turn, 16 callers a worker) that pays a whole
group's transactions. So within ``gather_seconds`` of a group's end, the next group starts
only once as many queries wait as were in flight when it ended (that group's and those
waiting then: the cohorts merge), or ``max_group``; at the end of the window it starts with
what waits. An idle service, or a caller sending one query after another, starts at once:
the window is measured from the last group's end, and one waiting query fills a group of
one. (Waiting only for the ended group's own size kept two cohorts of 8 alternating.) A
group that took less than the window, or whose every query was answered early (replays,
refusals, errors: no release drawn or stored), is followed at once: holding the next would
cost more than the group it saves, and a busy worker's replay groups can outlast the window.
Callers
that do not come back (independent requests, each from its own user) would make every group
wait out the window: a gathering that ends short stops gathering for the next
:data:`GATHERING_BACKOFF` groups, so such traffic pays the window once in that many groups.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from anyio import to_thread

from service.serving.schemas import Answer, QueryRequest

#: After a gathering that ended with its group short (its callers did not come back: traffic
#: from independent callers), this many groups start with what waits, without gathering.
GATHERING_BACKOFF = 8

#: ``answer_many(reqs, on_ready)``: every request's answer or error, in order, telling
#: ``on_ready(i, outcome)`` of the outcomes known early (called from the group's thread).
AnswerMany = Callable[
    [list[QueryRequest], Callable[[int, Answer | BaseException], None]],
    list[Answer | BaseException],
]


class QueryCoalescer:
    """Groups the single queries of one event loop (one per worker process)."""

    def __init__(
        self,
        answer_many: AnswerMany,
        *,
        max_group: int,
        groups_in_flight: int,
        gather_seconds: float,
    ) -> None:
        if max_group < 1 or groups_in_flight < 1:
            raise ValueError("max_group and groups_in_flight must be >= 1")
        if gather_seconds < 0.0:
            raise ValueError("gather_seconds must be >= 0")
        self._answer_many = answer_many
        self.max_group = max_group
        self.groups_in_flight = groups_in_flight
        self.gather_seconds = gather_seconds
        self._waiting: deque[tuple[QueryRequest, asyncio.Future[Answer]]] = deque()
        self._running: set[asyncio.Task[None]] = set()
        self._last_size = 0  # the queries to wait for after the last group (0: none), and
        # when it ended
        self._last_end = -math.inf
        self._gathering: asyncio.TimerHandle | None = None
        self._skip_gathering = 0  # groups left that start without gathering
        self.groups = 0  # groups run (for metrics and tests)
        self.queries = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def answer(self, req: QueryRequest) -> Answer:
        """``req``'s answer, computed in a group with the queries around it (its error is
        raised here)."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append((req, future))
        self._start_groups()
        # A caller that goes away (its future cancelled) does not stop its group: the query
        # is still charged, drawn and stored, as when a client leaves a query answered alone.
        return await future

    def _wanted(self) -> int:
        return min(self._last_size, self.max_group)

    def _start_groups(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and len(self._running) < self.groups_in_flight:
            short = len(self._waiting) < self._wanted()
            if short and loop.time() < self._last_end + self.gather_seconds:
                if self._skip_gathering == 0:
                    if self._gathering is None:  # the last group's callers may be coming back
                        self._gathering = loop.call_at(
                            self._last_end + self.gather_seconds, self._gathered
                        )
                    return
                self._skip_gathering -= 1
            if self._gathering is not None:  # filled before the window's end
                self._gathering.cancel()
                self._gathering = None
                self._skip_gathering = 0
            group = [
                self._waiting.popleft() for _ in range(min(self.max_group, len(self._waiting)))
            ]
            task = asyncio.get_running_loop().create_task(self._run(group))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _gathered(self) -> None:
        """The window ended before the group filled: its callers did not come back (open-loop
        traffic), so the next groups start with what waits."""
        self._gathering = None
        if len(self._waiting) < self._wanted():
            self._skip_gathering = GATHERING_BACKOFF
        self._start_groups()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start_groups()

    async def _run(self, group: list[tuple[QueryRequest, asyncio.Future[Answer]]]) -> None:
        loop = asyncio.get_running_loop()
        futures = [future for _, future in group]

        early: set[int] = set()  # the queries answered before the group's end

        def on_ready(i: int, outcome: Answer | BaseException) -> None:
            early.add(i)
            loop.call_soon_threadsafe(_resolve, futures[i], outcome)

        started = loop.time()
        try:
            outcomes: list[Any] = await to_thread.run_sync(
                self._answer_many, [req for req, _ in group], on_ready
            )
            if len(outcomes) != len(group):
                raise RuntimeError("a query group returned the wrong number of outcomes")
        except Exception as exc:  # the whole group failed: each query gets the error
            outcomes = [exc] * len(group)
        except BaseException:  # cancelled (the loop is shutting down): no caller hangs
            for future in futures:
                future.cancel()
            raise
        self.groups += 1
        self.queries += len(group)
        self._last_end = loop.time()
        # the next group is held only after one that ran charged queries for the window
        charged = len(early) < len(group)
        long = charged and self._last_end - started >= self.gather_seconds
        self._last_size = len(group) + len(self._waiting) if long else 0
        for future, outcome in zip(futures, outcomes, strict=True):
            _resolve(future, outcome)


def _resolve(future: asyncio.Future[Answer], outcome: Answer | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
