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
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from anyio import to_thread

from service.serving.schemas import Answer, QueryRequest

#: ``answer_many(reqs, on_ready)``: every request's answer or error, in order, telling
#: ``on_ready(i, outcome)`` of the outcomes known early (called from the group's thread).
AnswerMany = Callable[
    [list[QueryRequest], Callable[[int, Answer | BaseException], None]],
    list[Answer | BaseException],
]


class QueryCoalescer:
    """Groups the single queries of one event loop (one per worker process)."""

    def __init__(self, answer_many: AnswerMany, *, max_group: int, groups_in_flight: int) -> None:
        if max_group < 1 or groups_in_flight < 1:
            raise ValueError("max_group and groups_in_flight must be >= 1")
        self._answer_many = answer_many
        self.max_group = max_group
        self.groups_in_flight = groups_in_flight
        self._waiting: deque[tuple[QueryRequest, asyncio.Future[Answer]]] = deque()
        self._running: set[asyncio.Task[None]] = set()
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

    def _start_groups(self) -> None:
        while self._waiting and len(self._running) < self.groups_in_flight:
            group = [
                self._waiting.popleft() for _ in range(min(self.max_group, len(self._waiting)))
            ]
            task = asyncio.get_running_loop().create_task(self._run(group))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start_groups()

    async def _run(self, group: list[tuple[QueryRequest, asyncio.Future[Answer]]]) -> None:
        loop = asyncio.get_running_loop()
        futures = [future for _, future in group]

        def on_ready(i: int, outcome: Answer | BaseException) -> None:
            loop.call_soon_threadsafe(_resolve, futures[i], outcome)

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
        for future, outcome in zip(futures, outcomes, strict=True):
            _resolve(future, outcome)


def _resolve(future: asyncio.Future[Answer], outcome: Answer | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
