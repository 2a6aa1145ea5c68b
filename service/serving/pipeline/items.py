"""What passes between the pipeline's stages, in their order.

- prepare -> one request: :class:`Ready` (answered already: a replay), :class:`ToBind` (a
  keyed replay whose key is bound first), :class:`ToAdmit` (a query to charge; a ranking's is
  a :class:`Pending`) or a :class:`PopularPending`; a group: :class:`PreparedGroup`;
- admit -> :class:`AdmittedGroup` (each query's receipt, sorted by what comes next);
- draw -> each own charge's release, not yet stored (:class:`StoredRelease`);
- store -> those releases stored (or the error that discarded each);
- answer -> the answers (:class:`Outcomes`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from service.graph.model import Graph
from service.ledger.records import ChargeReceipt, DegreeReceipt, ReleaseKey, StoredRelease
from service.mechanisms.engine import EngineResult
from service.mechanisms.registry import RankingMechanism
from service.privacy.calibration import DiffusionPlan
from service.privacy.modes import Mode
from service.serving.rankings import RankingPlan, ReleasedDegrees
from service.serving.schemas import QueryRequest

#: Runs thunks concurrently and returns each one's result or exception, in order.
Run = Callable[[list[Callable[[], Any]]], list[Any]]


def run_in_turn(thunks: list[Callable[[], Any]]) -> list[Any]:
    """:data:`Run` on this thread, one thunk after the other (a lone query's draws)."""
    out: list[Any] = []
    for thunk in thunks:
        try:
            out.append(thunk())
        except Exception as exc:
            out.append(exc)
    return out


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
class PopularPending:
    """A ``popular`` query prepared for admission: it is charged the graph version's degree
    release (once per account and version), and nothing is drawn: its answer is that release,
    stored already, ranked."""

    req: QueryRequest
    graph: Graph
    seed: int
    account_id: int
    degrees: ReleasedDegrees


@dataclass(frozen=True)
class KeyedReplay:
    """A keyed ranking a stored release can answer before admission: it is answered with that
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


#: A group's answers (a ranking's :class:`Answer`, or another kind's: an embedding), a kind's
#: query prepared for admission, and a kind's keyed query to bind before it is replayed.
A = TypeVar("A")
P = TypeVar("P", bound=Prepared)
B = TypeVar("B")


# -- prepare: what one request became --------------------------------------------------------


@dataclass(frozen=True)
class Ready(Generic[A]):
    """Answered before admission: a replay of a stored release, at no charge."""

    answer: A


@dataclass(frozen=True)
class ToBind(Generic[B]):
    """A keyed replay: answered once its Idempotency-Key is bound to the release (all of a
    group's in one transaction)."""

    query: B


@dataclass(frozen=True)
class ToAdmit(Generic[P]):
    """A query to admit and charge, then draw, store and answer."""

    query: P


#: What the prepare stage made of one request.
Step = Ready[A] | ToBind[B] | ToAdmit[P] | PopularPending


@dataclass
class PreparedGroup(Generic[P]):
    """The prepare stage's output for a group, by position (replays and errors are settled
    already): the queries to charge, and the ``popular`` ones (charged their degree release)."""

    to_admit: list[tuple[int, P]] = field(default_factory=list)
    popular: list[tuple[int, PopularPending]] = field(default_factory=list)


# -- admit: what each query's admission came to ----------------------------------------------

#: An admitted query of a group: its position in the group, the query and its receipt.
Admitted = tuple[int, P, ChargeReceipt]


@dataclass
class AdmittedGroup(Generic[P]):
    """The admit stage's output, by what each query does next."""

    #: Charged now: drawn, stored, answered.
    own: list[Admitted[P]] = field(default_factory=list)
    #: Joined a twin (or a key's charge) admitted before this group: answered from its
    #: release once stored (admitted again if that charge is refunded instead).
    joined_earlier: list[Admitted[P]] = field(default_factory=list)
    #: Joined a twin admitted in this group: answered from its release once stored.
    joined_here: list[Admitted[P]] = field(default_factory=list)
    #: ``popular``, its degree release paid for (or paid before): ranked and answered.
    popular: list[tuple[int, PopularPending, DegreeReceipt]] = field(default_factory=list)
    #: Refused (nothing written), or failed: the error is the query's outcome.
    refused: list[tuple[int, BaseException]] = field(default_factory=list)


# -- draw and store ---------------------------------------------------------------------------

#: An admitted query with its release (drawn; after the store stage, stored).
Drawn = tuple[int, P, ChargeReceipt, StoredRelease]


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
