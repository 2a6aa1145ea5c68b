"""The prepare stage (:class:`Preparer`): what one request becomes before admission, and that
it charges nothing (``popular`` included: its degree release is the admit stage's to charge).

The graph is real (a path of five nodes); the ledger, the replayer, the read figure, the
degree releases and the graph-wide cap are fakes that record what they are asked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest

from service.config import MechanismSettings
from service.graph.build import build_graph
from service.ledger.records import ReleaseKey, StoredRelease
from service.mechanisms.charges import degree_release
from service.mechanisms.postprocess import RankedNode
from service.privacy.modes import Mode
from service.serving.graph_holder import GraphHolder
from service.serving.pipeline.errors import IdempotencyKeyReused
from service.serving.pipeline.items import (
    KeyedReplay,
    Pending,
    PopularPending,
    Ready,
    ToAdmit,
    ToBind,
)
from service.serving.pipeline.prepare import Preparer
from service.serving.planner import DiffusionPlanner
from service.serving.rankings import ReleasedDegrees, degree_release_name
from service.serving.schemas import Principal, QueryRequest

GRAPH = build_graph(np.array([0, 1, 2, 3]), np.array([1, 2, 3, 4]))
USER = Principal(account_id=4, type="user", node_id="2", modes=("personalized", "edge"))
SERVICE = Principal(account_id=9, type="service", modes=("edge",))
DEGREES = ReleasedDegrees(GRAPH.version, np.zeros(GRAPH.n), degree_release(0.5))


class FakeLedger:
    """Nothing of the ledger is read but what these tests name; any other use fails."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"prepare used the ledger's {name}")


class FakeReplayer:
    def __init__(self, stored: StoredRelease | None = None, keyed: StoredRelease | None = None):
        self.stored = stored
        self.keyed = keyed

    def release_for_idempotency_key(self, req: QueryRequest) -> StoredRelease | None:
        return self.keyed

    def find_release(self, key: ReleaseKey) -> StoredRelease | None:
        return self.stored

    def is_due(self, stored: StoredRelease, max_age_seconds: int | None) -> bool:
        return False

    def replay(self, stored: StoredRelease, req: QueryRequest, *args: Any) -> str:
        return f"replay of {stored.charge_id}"


class FakeReads:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, int | None, str | None]] = []

    def record(self, req: QueryRequest, version: str, charge: int | None, degree: str | None):
        self.recorded.append((version, charge, degree))


class FakeRefusals:
    def record(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing here is refused")


class FakeDegreeReleases:
    def __init__(self) -> None:
        self.caps: list[Any] = []

    def get(self, graph: Any, cap: Any) -> ReleasedDegrees:
        self.caps.append(cap)
        return DEGREES


class FakeCaps:
    def for_graph(self, graph: Any) -> str:
        return "the graph-wide cap"


def preparer(
    replayer: FakeReplayer | None = None,
    reads: FakeReads | None = None,
    degrees: FakeDegreeReleases | None = None,
) -> Preparer:
    holder = GraphHolder(None, loader=lambda _path: GRAPH)
    holder.load()
    return Preparer(
        graphs=holder, ledger=cast(Any, FakeLedger()), mechanism=MechanismSettings(),
        planner=DiffusionPlanner(), degree_releases=cast(Any, degrees or FakeDegreeReleases()),
        caps=cast(Any, FakeCaps()), create_seed_accounts=False,
        replayer=cast(Any, replayer or FakeReplayer()), reads=cast(Any, reads or FakeReads()),
        refusals=cast(Any, FakeRefusals()),
    )  # fmt: skip


def request(principal: Principal, mechanism: str, **kwargs: Any) -> QueryRequest:
    """A user asks about its own node in personalized mode, a service account in edge mode."""
    mode = Mode.PERSONALIZED if principal.type == "user" else Mode.EDGE
    return QueryRequest(principal, "2", 3, 0.5, mode, mechanism=mechanism, **kwargs)


def stored(charge_id: int, mechanism: str = "common_neighbours") -> StoredRelease:
    """A release of the user's query, k = 3 results long."""
    key = ReleaseKey(4, "2", GRAPH.version, "personalized", 0.5, mechanism)
    results = [RankedNode(node, 1.0) for node in ("0", "1", "3")]
    return StoredRelease(key, charge_id, results, {}, "earlier")


def test_popular_is_prepared_for_the_admit_stage_without_charging() -> None:
    reads, degrees = FakeReads(), FakeDegreeReleases()
    step = preparer(reads=reads, degrees=degrees).prepare(request(SERVICE, "popular"))
    assert isinstance(step, PopularPending)  # charged by the admit stage, not here
    assert (step.req.node, step.seed, step.account_id, step.degrees) == ("2", 2, 9, DEGREES)
    assert degrees.caps == ["the graph-wide cap"]  # the release is made within the cap
    # counted in the service account's read figure before the release is sent
    assert reads.recorded == [(GRAPH.version, None, degree_release_name(DEGREES.plan.scale))]


def test_popular_under_a_key_bound_to_a_charged_query_is_refused() -> None:
    keyed = preparer(replayer=FakeReplayer(keyed=stored(5)))
    with pytest.raises(IdempotencyKeyReused):
        keyed.prepare(request(USER, "popular", idempotency_key="k"))


def test_a_query_no_stored_release_answers_is_planned_for_admission() -> None:
    step = preparer().prepare(request(USER, "common_neighbours"))
    assert isinstance(step, ToAdmit) and isinstance(step.query, Pending)
    p = step.query
    assert (p.account_id, p.join_twins, p.mechanism["name"]) == (4, True, "common_neighbours")
    assert p.key == stored(0).key
    # a stored release too short for k is drawn anew, joining no twin
    short = replace(stored(5), results=stored(5).results[:2])
    again = preparer(replayer=FakeReplayer(stored=short)).prepare(
        request(USER, "common_neighbours")
    )
    assert isinstance(again, ToAdmit) and again.query.join_twins is False


def test_a_stored_release_answers_as_a_replay_and_a_keyed_one_is_bound_first() -> None:
    release = stored(5)
    step = preparer(replayer=FakeReplayer(stored=release)).prepare(
        request(USER, "common_neighbours")
    )
    assert step == Ready("replay of 5")
    keyed = preparer(replayer=FakeReplayer(stored=release)).prepare(
        request(USER, "common_neighbours", idempotency_key="k")
    )
    assert isinstance(keyed, ToBind) and isinstance(keyed.query, KeyedReplay)
    assert keyed.query.stored is release
