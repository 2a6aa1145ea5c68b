"""What passes between the pipeline's stages."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from service.graph.model import Graph
from service.ledger.records import ChargeReceipt, ReleaseKey, StoredRelease
from service.mechanisms.engine import EngineResult
from service.mechanisms.registry import RankingMechanism
from service.privacy.calibration import DiffusionPlan
from service.privacy.modes import Mode
from service.serving.rankings import RankingPlan
from service.serving.schemas import QueryRequest


class Prepared(Protocol):
    """What the stages shared by every kind of charged query (admission, twins, storing) read
    of a query prepared for admission: the request (as storing and the read figure read it),
    the graph it is answered on and its release key."""

    @property
    def req(self) -> QueryRequest: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def key(self) -> ReleaseKey: ...


@dataclass(frozen=True)
class Pending:
    """A query prepared for admission: everything decided before the ledger."""

    req: QueryRequest
    graph: Graph
    seed: int
    account_id: int
    key: ReleaseKey
    join_twins: bool
    plan: DiffusionPlan | RankingPlan
    mechanism: dict[str, Any]


@dataclass(frozen=True)
class ToBind:
    """A keyed query a stored release can answer before admission: it is answered with that
    release only once its Idempotency-Key is bound to it in the ledger."""

    req: QueryRequest
    graph: Graph
    seed: int
    account_id: int
    key: ReleaseKey
    name: RankingMechanism
    epsilon: float
    stored: StoredRelease


@dataclass(frozen=True)
class Started:
    """An admitted query handed to the engine: its result to wait for, and how to rank it."""

    future: Future[EngineResult]
    where: tuple[Graph, int, Mode, float, float, int]  # the prefix's (graph, seed, mode, ...)
    cold: bool  # no stored prefix: the engine computed it, and it is remembered
    charge_id: int
    noise_scale: float


#: An admitted query of a group: its position in the group, the query and its receipt.
Admitted = tuple[int, Pending, ChargeReceipt]

#: A group's answers: a ranking's :class:`Answer`, or another kind's (an embedding).
A = TypeVar("A")


class Outcomes(Generic[A]):
    """A group's outcomes by position. ``settle`` also tells ``on_ready`` at once (a replay,
    an error before storing); ``put`` is heard with the whole group."""

    def __init__(self, n: int, on_ready: Callable[[int, A | BaseException], None] | None):
        self._out: list[A | BaseException | None] = [None] * n
        self._on_ready = on_ready

    def settle(self, i: int, outcome: A | BaseException) -> None:
        self._out[i] = outcome
        if self._on_ready is not None:
            self._on_ready(i, outcome)

    def put(self, i: int, outcome: A | BaseException) -> None:
        self._out[i] = outcome

    def all(self) -> list[A | BaseException]:
        assert all(item is not None for item in self._out)
        return [item for item in self._out if item is not None]
