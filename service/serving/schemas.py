"""Plain data passed between the API, the query service and the ledger (no framework types)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.ledger.records import BudgetView
from service.mechanisms.postprocess import RankedNode
from service.privacy.modes import Mode


@dataclass(frozen=True)
class Principal:
    """The authenticated caller."""

    account_id: int
    type: str  # "user" | "service" | "admin"
    node_id: str | None = None
    may_create_seed_accounts: bool = False
    modes: tuple[str, ...] = ("edge",)
    quota_epsilon: float | None = None  # None: the configured default for service accounts


@dataclass(frozen=True)
class QueryRequest:
    principal: Principal
    node: str
    k: int
    epsilon: float | None
    mode: Mode
    fresh: bool = False
    exclude_neighbors: bool = False
    idempotency_key: str | None = None
    request_id: str = ""
    mechanism: str | None = None  # None: the configured default for the mode
    #: A stored release at least this old is not replayed: new noise is drawn (and charged).
    max_age_seconds: int | None = None


@dataclass(frozen=True, kw_only=True)
class ChargedAnswer:
    """What every answer charged to an account states, whatever it releases (a ranking, an
    embedding): the seed, the graph version, the mechanism block, the account charged and its
    budget after the charge, and whether it replays a stored release (charged nothing now)."""

    node: str
    graph_version: str
    mechanism: dict[str, Any]
    budget: BudgetView
    replayed: bool
    request_id: str
    charged_account_id: int
    epsilon_charged: float = 0.0
    #: A replay's ``original_request_id``: the request its stored release was drawn for.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Answer(ChargedAnswer):
    """A ranking."""

    results: list[RankedNode]
