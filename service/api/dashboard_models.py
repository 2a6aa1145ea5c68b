"""Bodies of the admin dashboard's endpoints (pydantic; they are the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.api.figures import ComposedFigure
from service.api.models import Budget, GraphInfo

ChargeState = Literal["admitted", "released", "refunded"]


class AdminMe(BaseModel):
    account_id: int
    label: str | None
    type: Literal["admin"]


class AccountRow(BaseModel):
    account_id: int
    type: Literal["user", "service", "admin"]
    node_id: str | None
    label: str | None
    cap_epsilon: float
    delta: float
    spent_epsilon: ComposedFigure = Field(
        description="The account's live charges composed by the RDP accountant at its delta "
        "(null: infinite)."
    )
    remaining_epsilon: float = Field(description="max(0, cap - spent).")
    used_fraction: ComposedFigure = Field(
        description="spent / cap (above 1: over its cap; null: infinite)."
    )
    charges: int
    last_charge_at: str | None
    created_at: str


class AccountTable(BaseModel):
    total: int = Field(description="Accounts matching the filter (all pages).")
    limit: int
    offset: int
    sort: str
    order: Literal["asc", "desc"]
    items: list[AccountRow]


class HourUsage(BaseModel):
    at: str = Field(description="Start of the hour (UTC).")
    queries: int = Field(description="Queries charged (live charges) admitted in the hour.")
    epsilon: float = Field(
        description="Their per-query epsilons added up (a volume, not a composed spend)."
    )
    refunded: int
    refusals: int


class Usage(BaseModel):
    hours: int
    queries: int
    epsilon: float
    refusals: int
    series: list[HourUsage]


class Refusals(BaseModel):
    hours: int | None = Field(description="The window in hours; null: since the ledger began.")
    total: int
    by_reason: dict[str, int]


class Spenders(BaseModel):
    top: list[AccountRow] = Field(description="Largest composed spends first.")
    near_cap: list[AccountRow] = Field(description="Most of their cap used first.")
    near_cap_total: int = Field(description="Accounts at or above the fraction (all of them).")
    near_cap_fraction: float
    over_cap_total: int


class DegreeBucket(BaseModel):
    low: int = Field(description="Smallest degree in the bucket.")
    high: int = Field(description="Largest degree in the bucket.")
    nodes: int


class GraphDegrees(GraphInfo):
    degree_source: Literal["cache", "graph"] = Field(
        description="cache: read from the degree cache (Redis or in-process); graph: the cache "
        "had no entry, so the loaded graph's degrees were used (and cached)."
    )
    histogram: list[DegreeBucket] = Field(description="Powers-of-two buckets: 0, 1, 2-3, 4-7…")


class CacheRate(BaseModel):
    cache: str
    hits: int
    misses: int
    errors: int
    hit_rate: float | None = Field(description="hits / (hits + misses); null before any lookup.")


class DatabaseHealth(BaseModel):
    status: Literal["ok", "unreachable"]
    dialect: str
    latency_ms: float | None
    in_flight_charges: int | None = Field(
        description="Charges admitted whose answer is not yet stored (or refunded)."
    )
    oldest_in_flight_seconds: float | None


class WorkerHealth(BaseModel):
    configured: int = Field(description="PPR_WORKERS.")
    pid: int = Field(description="The worker process that answered.")
    live_pids: list[int] = Field(
        description="Worker processes seen through the shared metrics directory (this one "
        "only, with one worker)."
    )
    uptime_seconds: float
    reconciler_running: bool


class CacheHealth(BaseModel):
    backend: str
    status: str
    scope: Literal["all workers", "this process"]
    rates: list[CacheRate]
    detail: dict[str, Any]


class Health(BaseModel):
    database: DatabaseHealth
    workers: WorkerHealth
    cache: CacheHealth
    graph_version: str | None


class CurvePoint(BaseModel):
    at: str
    charge_id: int
    epsilon: float = Field(description="This charge's per-query epsilon.")
    composed_epsilon: ComposedFigure = Field(
        description="Spend after this charge, composed (RDP; null: infinite)."
    )
    naive_epsilon: float = Field(description="Per-query epsilons added up so far.")


class AccountCurve(BaseModel):
    account_id: int
    delta: float
    cap_epsilon: float
    charges: int
    composed_epsilon: ComposedFigure
    naive_epsilon: float
    points: list[CurvePoint] = Field(
        description="In admission order (at most 2000, evenly sampled; the last always)."
    )


class BudgetChange(Budget):
    cap_below_spent: bool = Field(
        description="The cap is below what is already spent: allowed, but every further "
        "query of the account is refused."
    )


class BudgetPreview(BaseModel):
    account_id: int
    cap_epsilon: float
    delta: float
    spent_epsilon: ComposedFigure = Field(
        description="The spend converted at this delta (null: infinite)."
    )
    remaining_epsilon: float
    cap_below_spent: bool


class ChargeDetail(BaseModel):
    charge_id: int
    created_at: str
    settled_at: str | None
    charged_account_id: int
    principal_account_id: int
    seed: str
    mechanism: str
    mode: str
    epsilon: float
    state: ChargeState
    graph_version: str
    request_id: str
    idempotency_key: str | None
    params: dict[str, Any]


class ChargePage(BaseModel):
    total: int
    limit: int
    offset: int
    items: list[ChargeDetail]


class ChargedAccount(BaseModel):
    account_id: int
    charges: int
    epsilon: float


class ServiceUsage(BaseModel):
    account_id: int
    modes: list[Literal["personalized", "edge"]]
    may_create_seed_accounts: bool
    quota_epsilon: float = Field(description="Eps per rolling 24 h chargeable to others.")
    quota_is_default: bool
    used_24h_epsilon: float
    charges_to_others: int
    epsilon_to_others: float = Field(description="Per-query epsilons added up.")
    accounts_charged: int
    top_charged: list[ChargedAccount]
    read_epsilon: ComposedFigure = Field(
        0.0,
        description="What its answers reveal: every distinct release it received (fresh or "
        "replayed; the degree release once per graph version), composed at its delta "
        "(null: infinite).",
    )
    read_releases: int = Field(0, description="Distinct releases in the read figure.")
    read_cap_epsilon: float | None = Field(None, description="Cap on the read figure; null: none.")


class AuditEntry(BaseModel):
    id: int
    created_at: str
    actor_account_id: int | None
    action: str
    target_account_id: int | None
    details: dict[str, Any]


class AuditPage(BaseModel):
    total: int
    limit: int
    offset: int
    items: list[AuditEntry]
    actions: list[str] = Field(description="Every action that occurs in the log.")
