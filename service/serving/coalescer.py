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
group's transactions. So after a group's end, the next group starts only once as many
queries wait as were in flight when it ended (that group's and those waiting then: the
cohorts merge), or ``max_group``; at the end of the window it starts with what waits.

The window is ``gather_seconds``, or the ended group's own duration if that was shorter
(holding the next group costs at most the group it saves), and it counts from the first
query to arrive since that end, not from the end itself: the worker's event loop writes the
group's answers before its callers can send again. Measured on a busy machine (2 workers, 32
connections, ego-Facebook, groups of 16 taking 19-31 ms): the first caller came back 7-18 ms
after the end, so a 20 ms window counted from the end often closed on a quarter of the
cohort, and a group under 20 ms (then followed at once) let the next start with one query;
either way the worker ran groups of 4 and 12, or 1 and 9, in turn. A query arriving
:data:`RETURN_HORIZON` ``gather_seconds`` or more after the end is not a returning caller:
it starts at once, as on an idle service, and a caller sending one query after another
fills a group of one. (Waiting only for the ended group's own size kept two cohorts of 8
alternating.) A group whose every query was answered early (replays, refusals, errors: no
release drawn or stored) is followed at once: a busy worker's replay groups can outlast the
window. Callers that do not come back (independent requests, each from its own user) would
make every group wait out the window: a gathering that ends short stops gathering for the
next :data:`GATHERING_BACKOFF` groups, so such traffic pays the window once in that many
groups.
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

#: A query arriving this many ``gather_seconds`` after a group's end does not start a window:
#: the group's callers would have come back by then, so it starts at once.
RETURN_HORIZON = 2.0

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
        self._first_return: float | None = None  # the first query to arrive since that end
        self._hold = 0.0  # the window after that end: gather_seconds, or that group's duration
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
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        self._waiting.append((req, future))
        if self._first_return is None:
            self._first_return = loop.time()
            if self._gathering is not None:  # the window now counts from this return
                self._gathering.cancel()
                self._gathering = None
        self._start_groups()
        # A caller that goes away (its future cancelled) does not stop its group: the query
        # is still charged, drawn and stored, as when a client leaves a query answered alone.
        return await future

    def _wanted(self) -> int:
        return min(self._last_size, self.max_group)

    def _window_end(self) -> float:
        """When the wait for the last group's callers ends: one window after the first query
        that arrived since that group's end (or after the end, while none has); never, for a
        first query that came :data:`RETURN_HORIZON` ``gather_seconds`` after the end."""
        first = self._first_return
        if first is None:
            return self._last_end + self._hold
        if first >= self._last_end + RETURN_HORIZON * self.gather_seconds:
            return -math.inf
        return first + self._hold

    def _start_groups(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and len(self._running) < self.groups_in_flight:
            short = len(self._waiting) < self._wanted()
            window_end = self._window_end()
            if short and loop.time() < window_end:
                if self._skip_gathering == 0:
                    if self._gathering is None:  # the last group's callers may be coming back
                        self._gathering = loop.call_at(window_end, self._gathered)
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
        self._first_return = None
        # the next group is held only after one that ran charged queries, for at most as
        # long as that one took
        charged = len(early) < len(group)
        self._hold = min(self.gather_seconds, self._last_end - started)
        self._last_size = len(group) + len(self._waiting) if charged else 0
        for future, outcome in zip(futures, outcomes, strict=True):
            _resolve(future, outcome)


def _resolve(future: asyncio.Future[Answer], outcome: Answer | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
