"""Group commit: concurrent callers of one ledger operation share one transaction.

The first caller to arrive while no group is running runs its own item at once (no added
latency on an idle service). Callers that arrive while a group's transaction is in flight
queue; when it finishes, the first of them leads the next group, made of everything queued
(up to ``max_group``), and every caller gets its own item's outcome. The transaction itself
(``run_group``) keeps each item all-or-nothing and returns, per item, a result or the error
that item alone failed with; an error of the whole group goes to each of its callers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "error", "event", "item", "lead", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.event = threading.Event()
        self.lead = False
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommitter(Generic[T, R]):
    def __init__(
        self,
        run_group: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_group: int,
        is_error: Callable[[object], bool] = lambda value: isinstance(value, BaseException),
    ) -> None:
        if max_group < 1:
            raise ValueError("max_group must be >= 1")
        self._run_group = run_group
        self._max_group = max_group
        self._is_error = is_error
        self._lock = threading.Lock()
        self._queue: list[_Slot[T, R]] = []
        self._busy = False
        self.groups = 0  # transactions run (for benchmarks and tests)
        self.items = 0

    def submit(self, item: T) -> R:
        """``item``'s outcome, run in a group with the callers queued at the same time."""
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._queue.append(slot)
            lead = not self._busy
            self._busy = True
        if not lead:
            slot.event.wait()
            lead = slot.lead and not slot.done
        if lead:
            self._lead()
        assert slot.done
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _lead(self) -> None:
        with self._lock:
            group = self._queue[: self._max_group]
            del self._queue[: self._max_group]
        try:
            outcomes: Sequence[R | BaseException] = self._run_group([s.item for s in group])
            if len(outcomes) != len(group):
                raise RuntimeError("a group transaction returned the wrong number of outcomes")
        except BaseException as exc:  # the whole group failed: each caller gets the error
            outcomes = [exc] * len(group)
        for s, outcome in zip(group, outcomes, strict=True):
            if self._is_error(outcome):
                s.error = outcome  # type: ignore[assignment]
            else:
                s.result = outcome  # type: ignore[assignment]
            s.done = True
        with self._lock:
            self.groups += 1
            self.items += len(group)
            if self._queue:
                successor = self._queue[0]
                successor.lead = True  # it runs the next group; busy stays set
                successor.event.set()
            else:
                self._busy = False
        for s in group:
            s.event.set()
