"""QueryCoalescer: single queries of one event loop answered in groups.

The unit under test is the coalescer; ``answer_many`` is a fake (a plain function run on the
group's thread) that records each group it is given and can be held running with
``threading.Event`` so that later queries queue behind it. Queries and answers are plain
strings standing in for ``QueryRequest`` / ``Answer`` (the coalescer never looks inside them).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

import pytest

from service.serving.coalescer import GATHERING_BACKOFF, RETURN_HORIZON, QueryCoalescer
from service.serving.schemas import Answer, QueryRequest

# it mostly waits (4.1 s, 0.1 CPU-s in a run of the suite): scheduled apart, conftest.py
pytestmark = pytest.mark.waits

WAIT = 5.0  # upper bound on any wait for another thread (never reached when things work)

OnReady = Callable[[int, Answer | BaseException], None]


def req(name: str) -> QueryRequest:
    return cast(QueryRequest, name)


def ans(text: str) -> Answer:
    return cast(Answer, text)


class FakeGroups:
    """A fake ``answer_many``: query ``"x"`` answers ``"answer x"``; ``"err x"`` is a
    per-item ``ValueError``; a group holding ``"boom"`` raises as a whole. Groups whose
    number (0-based) is in ``hold`` wait for ``gate(n)`` before returning; ``early`` names
    queries resolved through ``on_ready`` as soon as their group starts."""

    def __init__(
        self, hold: set[int] | None = None, early: set[str] | None = None, delay: float = 0.0
    ) -> None:
        self.hold = hold or set()
        self.delay = delay  # seconds every group takes
        self.early = early or set()
        self.groups: list[list[str]] = []
        self._lock = threading.Lock()
        self._entered: dict[int, threading.Event] = {}
        self._gates: dict[int, threading.Event] = {}
        self._done: dict[int, threading.Event] = {}
        self.running = 0
        self.most_running = 0

    def _event(self, table: dict[int, threading.Event], n: int) -> threading.Event:
        with self._lock:
            return table.setdefault(n, threading.Event())

    def entered(self, n: int) -> threading.Event:
        return self._event(self._entered, n)

    def gate(self, n: int) -> threading.Event:
        return self._event(self._gates, n)

    def done(self, n: int) -> threading.Event:
        return self._event(self._done, n)

    def __call__(self, reqs: list[QueryRequest], on_ready: OnReady) -> list[Answer | BaseException]:
        names = [cast(str, r) for r in reqs]
        with self._lock:
            n = len(self.groups)
            self.groups.append(names)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            for i, name in enumerate(names):
                if name in self.early:
                    on_ready(i, ans(f"early {name}"))
            self.entered(n).set()
            if n in self.hold:
                assert self.gate(n).wait(WAIT), f"group {n} was never released"
            time.sleep(self.delay)
            if "boom" in names:
                raise RuntimeError("the whole group failed")
            return [
                ValueError(name) if name.startswith("err") else ans(f"answer {name}")
                for name in names
            ]
        finally:
            with self._lock:
                self.running -= 1
            self.done(n).set()


async def wait_event(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, WAIT)


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(int(WAIT / 0.002)):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("condition never became true")


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


def test_an_idle_coalescer_starts_a_group_at_once() -> None:
    fake = FakeGroups()

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        task = asyncio.create_task(coalescer.answer(req("a")))
        await asyncio.sleep(0)  # answer() ran up to its await: the group is already formed
        assert coalescer.waiting == 0
        assert await task == ans("answer a")
        assert fake.groups == [["a"]]
        assert (coalescer.groups, coalescer.queries) == (1, 1)

    run(main)


def test_queries_queued_behind_a_running_group_form_the_next_group() -> None:
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        first = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        rest = [asyncio.create_task(coalescer.answer(req(x))) for x in "bcd"]
        await asyncio.sleep(0)
        assert coalescer.waiting == 3
        assert fake.groups == [["a"]]
        fake.gate(0).set()
        assert await first == ans("answer a")
        assert list(await asyncio.gather(*rest)) == [
            ans("answer b"),
            ans("answer c"),
            ans("answer d"),
        ]
        assert fake.groups == [["a"], ["b", "c", "d"]]
        assert (coalescer.groups, coalescer.queries, coalescer.waiting) == (2, 4, 0)

    run(main)


def test_waiting_queries_are_split_into_groups_of_at_most_max_group() -> None:
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=2, groups_in_flight=1, gather_seconds=0.0)
        first = asyncio.create_task(coalescer.answer(req("q0")))
        await wait_event(fake.entered(0))
        names = [f"q{i}" for i in range(1, 6)]
        rest = [asyncio.create_task(coalescer.answer(req(x))) for x in names]
        await asyncio.sleep(0)
        assert coalescer.waiting == 5
        fake.gate(0).set()
        assert list(await asyncio.gather(first, *rest)) == [ans(f"answer q{i}") for i in range(6)]
        assert [len(g) for g in fake.groups] == [1, 2, 2, 1]
        assert [x for g in fake.groups for x in g] == [f"q{i}" for i in range(6)]  # in order

    run(main)


def test_two_groups_in_flight_run_at_once_and_the_third_waits() -> None:
    fake = FakeGroups(hold={0, 1})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=2, gather_seconds=0.0)
        a = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        b = asyncio.create_task(coalescer.answer(req("b")))  # one group runs: starts another
        await wait_event(fake.entered(1))
        assert fake.running == 2  # both held inside answer_many at the same time
        c = asyncio.create_task(coalescer.answer(req("c")))
        d = asyncio.create_task(coalescer.answer(req("d")))
        await asyncio.sleep(0)
        assert coalescer.waiting == 2  # two groups run: these wait
        fake.gate(1).set()  # the second finishes first: the waiting pair goes next
        assert await b == ans("answer b")
        assert list(await asyncio.gather(c, d)) == [ans("answer c"), ans("answer d")]
        assert not a.done()
        fake.gate(0).set()
        assert await a == ans("answer a")
        assert fake.groups == [["a"], ["b"], ["c", "d"]]
        assert fake.most_running == 2

    run(main)


def test_an_outcome_given_to_on_ready_is_answered_before_the_group_ends() -> None:
    fake = FakeGroups(hold={0}, early={"a"})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        a = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        assert await a == ans("early a")  # the group is still held running
        assert not fake.done(0).is_set() and coalescer.groups == 0
        fake.gate(0).set()
        await wait_event(fake.done(0))
        await until(lambda: coalescer.groups == 1)
        assert await a == ans("early a")  # the group's own outcome for it did not replace it

    run(main)


def test_an_early_outcome_in_a_larger_group_answers_only_that_query() -> None:
    fake = FakeGroups(hold={0, 1}, early={"c"})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        a = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        b, c = (asyncio.create_task(coalescer.answer(req(x))) for x in "bc")
        await asyncio.sleep(0)
        assert coalescer.waiting == 2
        fake.gate(0).set()
        await wait_event(fake.entered(1))
        assert await c == ans("early c")
        assert not b.done()
        fake.gate(1).set()
        assert list(await asyncio.gather(a, b)) == [ans("answer a"), ans("answer b")]
        assert fake.groups == [["a"], ["b", "c"]]

    run(main)


def test_a_per_item_error_is_raised_only_to_its_query() -> None:
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        first = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        tasks = [asyncio.create_task(coalescer.answer(req(x))) for x in ("b", "err c", "d")]
        await asyncio.sleep(0)
        fake.gate(0).set()
        outcomes = list(await asyncio.gather(first, *tasks, return_exceptions=True))
        assert outcomes[:2] == [ans("answer a"), ans("answer b")] and outcomes[3] == ans("answer d")
        assert isinstance(outcomes[2], ValueError) and str(outcomes[2]) == "err c"
        assert fake.groups == [["a"], ["b", "err c", "d"]]

    run(main)


def test_an_error_of_the_whole_group_goes_to_every_query_of_that_group_only() -> None:
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=2, groups_in_flight=1, gather_seconds=0.0)
        first = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        tasks = [asyncio.create_task(coalescer.answer(req(x))) for x in ("b", "boom", "e")]
        await asyncio.sleep(0)
        fake.gate(0).set()
        outcomes = list(await asyncio.gather(first, *tasks, return_exceptions=True))
        assert fake.groups == [["a"], ["b", "boom"], ["e"]]
        assert outcomes[0] == ans("answer a") and outcomes[3] == ans("answer e")
        assert isinstance(outcomes[1], RuntimeError) and outcomes[1] is outcomes[2]
        assert coalescer.groups == 3  # the failed group counts, and the next one still ran

    run(main)


def test_a_group_returning_the_wrong_number_of_outcomes_fails_each_query() -> None:
    def short(reqs: list[QueryRequest], on_ready: OnReady) -> list[Answer | BaseException]:
        return [ans("one"), ans("two")]  # two outcomes for one query

    async def main() -> None:
        coalescer = QueryCoalescer(short, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        with pytest.raises(RuntimeError, match="wrong number of outcomes"):
            await coalescer.answer(req("a"))

    run(main)


def test_a_cancelled_caller_does_not_cancel_its_running_group() -> None:
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        task = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        fake.gate(0).set()
        await wait_event(fake.done(0))  # the fake saw the query and completed the group
        await until(lambda: coalescer.groups == 1)
        assert fake.groups == [["a"]] and coalescer.queries == 1
        # the coalescer is not stuck: the next query is answered
        assert await coalescer.answer(req("b")) == ans("answer b")

    run(main)


def test_a_query_cancelled_while_waiting_is_still_given_to_the_next_group() -> None:
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=0.0)
        first = asyncio.create_task(coalescer.answer(req("a")))
        await wait_event(fake.entered(0))
        gone = asyncio.create_task(coalescer.answer(req("b")))
        kept = asyncio.create_task(coalescer.answer(req("c")))
        await asyncio.sleep(0)
        assert coalescer.waiting == 2
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        fake.gate(0).set()
        assert list(await asyncio.gather(first, kept)) == [ans("answer a"), ans("answer c")]
        assert fake.groups == [["a"], ["b", "c"]]  # b is still charged, drawn and stored

    run(main)


@pytest.mark.parametrize(("max_group", "groups_in_flight"), [(0, 1), (1, 0), (0, 0), (-1, 1)])
def test_the_constructor_rejects_sizes_below_one(max_group: int, groups_in_flight: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        QueryCoalescer(
            FakeGroups(), max_group=max_group, groups_in_flight=groups_in_flight, gather_seconds=0
        )


def test_the_constructor_rejects_a_negative_gathering_window() -> None:
    with pytest.raises(ValueError, match="gather_seconds"):
        QueryCoalescer(FakeGroups(), max_group=8, groups_in_flight=1, gather_seconds=-0.001)


#: A gathering window no test waits out: a group that waited for it would fail ``WAIT``.
LONG_WINDOW = 60.0

#: A window, and groups that take longer than it (a shorter group is followed at once).
WINDOW, SLOW = 0.1, 0.12

#: Long enough for the event loop to start a group that is not held, well within ``WINDOW``.
SETTLE = 0.02


async def _one_running_three_waiting(coalescer: QueryCoalescer) -> list[asyncio.Task[Answer]]:
    """Group 0 runs "x" while "abc" queue behind it; x is answered (its group is slow)."""
    alone = asyncio.create_task(coalescer.answer(req("x")))
    await asyncio.sleep(0)
    three = [asyncio.create_task(coalescer.answer(req(q))) for q in "abc"]
    assert await alone == ans("answer x")
    return three


def test_after_a_group_the_next_waits_for_as_many_queries_as_were_in_flight() -> None:
    """Cohorts of 1 and 3 callers merge: the group of one ends with three queries waiting,
    and the next starts when its caller's next query has come too."""
    fake = FakeGroups(delay=SLOW)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        three = await _one_running_three_waiting(coalescer)
        await asyncio.sleep(SETTLE)
        assert fake.groups == [["x"]] and coalescer.waiting == 3  # gathering
        back = asyncio.create_task(coalescer.answer(req("y")))  # x's caller is back
        assert len(await asyncio.gather(*three, back)) == 4
        assert fake.groups == [["x"], ["a", "b", "c", "y"]]

    run(main)


def test_a_gathering_group_starts_with_what_waits_when_the_window_ends() -> None:
    fake = FakeGroups(delay=SLOW)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        three = await _one_running_three_waiting(coalescer)
        assert len(await asyncio.gather(*three)) == 3  # nobody else came: they went alone
        assert fake.groups == [["x"], ["a", "b", "c"]]

    run(main)


def test_a_gathering_group_never_waits_for_more_than_max_group() -> None:
    fake = FakeGroups(delay=SLOW)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=3, groups_in_flight=1, gather_seconds=WINDOW)
        three = await _one_running_three_waiting(coalescer)
        await asyncio.sleep(SETTLE)
        assert fake.groups == [["x"], ["a", "b", "c"]]  # started at once
        await asyncio.gather(*three)

    run(main)


async def _four_in_a_group(coalescer: QueryCoalescer) -> None:
    """Group 0 runs "x" while "abc" queue; x's caller comes back with "y" and group 1 is
    "abcy": it ends with four queries in flight and none waiting."""
    three = await _one_running_three_waiting(coalescer)
    back = asyncio.create_task(coalescer.answer(req("y")))
    assert len(await asyncio.wait_for(asyncio.gather(*three, back), WAIT)) == 4


def test_the_window_counts_from_the_first_caller_back_not_from_the_groups_end() -> None:
    """A busy worker's event loop writes a group's answers before its callers can send again:
    here the first comes back 1.5 windows after the end (within RETURN_HORIZON), and the next
    group still waits a window from then for the rest of the cohort."""
    fake = FakeGroups(delay=SLOW)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        await _four_in_a_group(coalescer)
        await asyncio.sleep(1.5 * WINDOW)
        first = asyncio.create_task(coalescer.answer(req("p")))
        await asyncio.sleep(SETTLE)
        assert coalescer.waiting == 1, "held for its cohort"
        rest = [asyncio.create_task(coalescer.answer(req(q))) for q in "qrs"]
        assert len(await asyncio.wait_for(asyncio.gather(first, *rest), WAIT)) == 4
        assert fake.groups[2:] == [["p", "q", "r", "s"]]

    run(main)


def test_a_query_long_after_the_last_group_starts_at_once() -> None:
    """RETURN_HORIZON windows after a group's end a query is not one of its callers coming
    back: it starts at once, as on an idle worker."""
    assert RETURN_HORIZON * WINDOW + SETTLE < 0.3
    fake = FakeGroups(delay=SLOW)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        await _four_in_a_group(coalescer)
        await asyncio.sleep(0.3)
        late = asyncio.create_task(coalescer.answer(req("p")))
        await asyncio.sleep(SETTLE)
        assert fake.groups[2:] == [["p"]] and coalescer.waiting == 0
        assert await late == ans("answer p")

    run(main)


def test_a_group_shorter_than_the_window_gathers_its_callers_for_as_long_as_it_took() -> None:
    """A charged group of half a window, with three queries waiting at its end: its caller
    comes back at once and goes with them (groups of 16 took 19-31 ms on a busy worker, and
    one that ended under the 20 ms window used to let the next start with what waited)."""
    fake = FakeGroups(delay=WINDOW / 2)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        await _four_in_a_group(coalescer)
        assert fake.groups == [["x"], ["a", "b", "c", "y"]]

    run(main)


def test_a_group_shorter_than_the_window_is_followed_at_once() -> None:
    """Replays and refusals make short groups: the next one is held for their callers at
    most as long as the group took (here next to nothing)."""
    fake = FakeGroups(hold={0})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1,
                                   gather_seconds=LONG_WINDOW)  # fmt: skip
        alone = asyncio.create_task(coalescer.answer(req("x")))
        await wait_event(fake.entered(0))
        three = [asyncio.create_task(coalescer.answer(req(q))) for q in "abc"]
        await asyncio.sleep(0)
        fake.gate(0).set()  # group 0 ran for far less than the window
        assert len(await asyncio.wait_for(asyncio.gather(alone, *three), WAIT)) == 4
        assert fake.groups == [["x"], ["a", "b", "c"]]

    run(main)


def test_a_group_answered_before_admission_is_followed_at_once_however_long() -> None:
    """A group whose every query was answered early (replays on a busy worker) ran no
    charged query: however long it took, the next group starts with what waits."""
    fake = FakeGroups(delay=SLOW, early={"x"})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        alone = asyncio.create_task(coalescer.answer(req("x")))
        await asyncio.sleep(0)
        three = [asyncio.create_task(coalescer.answer(req(q))) for q in "abc"]
        assert await alone == ans("early x")
        await wait_event(fake.done(0))  # group 0 outlasted the window
        await asyncio.sleep(SETTLE)
        assert fake.groups == [["x"], ["a", "b", "c"]]  # started at once, not gathering
        assert len(await asyncio.wait_for(asyncio.gather(*three), WAIT)) == 3

    run(main)


def test_a_group_with_one_charged_query_among_early_answers_still_gathers() -> None:
    fake = FakeGroups(delay=SLOW, early={"w", "x"})

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        alone = asyncio.create_task(coalescer.answer(req("w")))
        await asyncio.sleep(0)
        mixed = [asyncio.create_task(coalescer.answer(req(q))) for q in "xz"]
        assert await alone == ans("early w")
        await wait_event(fake.entered(1))  # after an all-early group: at once
        three = [asyncio.create_task(coalescer.answer(req(q))) for q in "abc"]
        assert await asyncio.gather(*mixed) == [ans("early x"), ans("answer z")]
        await asyncio.sleep(SETTLE)
        assert fake.groups == [["w"], ["x", "z"]] and coalescer.waiting == 3  # gathering
        assert len(await asyncio.wait_for(asyncio.gather(*three), WAIT)) == 3
        assert fake.groups[-1] == ["a", "b", "c"]

    run(main)


def test_after_a_gathering_ends_short_the_next_groups_do_not_gather() -> None:
    """Callers that do not come back: after a gathering that ended short, the next
    ``GATHERING_BACKOFF`` group starts that would gather start with what waits instead (each
    would otherwise wait out the window); then gathering is tried again."""
    fake = FakeGroups(delay=SLOW)

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1, gather_seconds=WINDOW)
        await asyncio.gather(*await _one_running_three_waiting(coalescer))
        assert fake.groups == [["x"], ["a", "b", "c"]]  # that gathering ended short
        for i in range(2 * GATHERING_BACKOFF):  # two queries at once, each group of one
            p, q = (asyncio.create_task(coalescer.answer(req(f"{x}{i}"))) for x in "pq")
            await p
            await asyncio.sleep(SETTLE)
            if coalescer.waiting:  # q waits for p's caller: gathering again
                break
            await q
        else:
            raise AssertionError("gathering never came back")
        await q
        # round 0's two starts would have gathered (3, then 2 in flight), later rounds' q
        # only (p's group of one is filled by one query): that is GATHERING_BACKOFF starts
        assert i == GATHERING_BACKOFF - 1

    run(main)


def test_one_caller_after_another_is_never_kept_gathering() -> None:
    """A caller sending one query after another: each group held one query, and one waiting
    query fills the next, so none waits for the window."""
    fake = FakeGroups()

    async def main() -> None:
        coalescer = QueryCoalescer(fake, max_group=8, groups_in_flight=1,
                                   gather_seconds=LONG_WINDOW)  # fmt: skip
        for x in "abcde":
            assert await asyncio.wait_for(coalescer.answer(req(x)), WAIT) == ans(f"answer {x}")
        assert fake.groups == [[x] for x in "abcde"]

    run(main)
