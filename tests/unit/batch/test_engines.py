"""Unit tests of :mod:`service.batch.engines` (the local process pool, without processes)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, cast

from service.batch.engines import Block, BlockAttempts, LocalEngine
from service.batch.spec import BatchSpec, BlockResult


class PoolBrokenAtSubmit:
    """A pool whose worker died before the driver submitted its next block: the first
    ``accepted`` submissions are taken (and later fail with the pool), the next one raises."""

    def __init__(self, accepted: int) -> None:
        self.accepted = accepted
        self.submitted: list[Block] = []
        self.shut_down = False

    def submit(self, fn: Any, spec: Any, index: int, nodes: list[str]) -> Future[BlockResult]:
        if len(self.submitted) >= self.accepted:
            raise BrokenProcessPool("A child process terminated abruptly")
        self.submitted.append((index, nodes))
        future: Future[BlockResult] = Future()
        future.set_exception(BrokenProcessPool("A child process terminated abruptly"))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.shut_down = True


def test_a_pool_broken_while_blocks_are_submitted_requeues_them_all() -> None:
    engine = LocalEngine(workers=2, retries=3)
    queue: deque[Block] = deque((index, [str(index)]) for index in range(6))
    attempts = BlockAttempts(retries=3)
    pool = PoolBrokenAtSubmit(accepted=1)
    spec = cast(BatchSpec, object())  # never read: nothing runs

    outcomes = list(engine._run_pool(pool, spec, queue, attempts))  # type: ignore[arg-type]

    assert outcomes == []  # nothing lost: every block goes back to the queue
    assert sorted(queue) == [(index, [str(index)]) for index in range(6)]
    assert attempts.counts == {0: 1}  # only the block that was in the dead pool used an attempt
    assert pool.shut_down
