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


@dataclass(frozen=True)
class Answer:
    node: str
    graph_version: str
    results: list[RankedNode]
    mechanism: dict[str, Any]
    budget: BudgetView
    replayed: bool
    request_id: str
    charged_account_id: int
    epsilon_charged: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
