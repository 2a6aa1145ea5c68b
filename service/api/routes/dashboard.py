"""The admin dashboard's endpoints: the accounts table, usage, refusals, spenders, graph
degrees, health, an account's curve, charges and service usage, budget previews, the audit log.

Everything the page at ``/admin`` shows comes from here or from :mod:`admin`; all of it is
admin-only (user and service keys get 403 ``forbidden``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Query
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

from service.api.dashboard_models import (
    AccountCurve,
    AccountRow,
    AccountTable,
    AdminMe,
    AuditPage,
    BudgetPreview,
    CacheHealth,
    CacheRate,
    ChargePage,
    DatabaseHealth,
    DegreeBucket,
    GraphDegrees,
    Health,
    Refusals,
    ServiceUsage,
    Spenders,
    Usage,
    WorkerHealth,
)
from service.api.deps import AdminDep, RuntimeDep
from service.api.models import ErrorResponse, SetBudget
from service.api.params import AccountIdPath, Limit, Offset
from service.api.runtime import Runtime
from service.api.strict import StrictRoute
from service.bounds import ID_MAX
from service.ledger.admin_views import AccountFilter, AdminViews

router = APIRouter(prefix="/v1/admin", tags=["admin dashboard"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse},
    403: {"model": ErrorResponse, "description": "`forbidden`: not an admin key"},
    422: {"model": ErrorResponse},
}
_ACCOUNT_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": ErrorResponse, "description": "`unknown_account`"},
}
_STARTED = time.time()

Hours = Annotated[int, Query(ge=1, le=24 * 90, description="The window, in hours up to now.")]
OptionalAccountId = Annotated[int | None, Query(ge=1, le=ID_MAX)]


def _views(runtime: Runtime) -> AdminViews:
    return AdminViews(runtime.ledger)


@router.get("/me", operation_id="getAdminMe", response_model=AdminMe, responses=_ERRORS)
def me(runtime: RuntimeDep, admin: AdminDep) -> AdminMe:
    """The admin account the key belongs to (the page's sign-in check)."""
    record = runtime.ledger.accounts.get_account(admin.account_id)
    return AdminMe(account_id=record.account_id, label=record.label, type="admin")


@router.get(
    "/account-table", operation_id="getAccountTable", response_model=AccountTable, responses=_ERRORS
)
def account_table(
    runtime: RuntimeDep,
    admin: AdminDep,
    sort: Annotated[
        Literal[
            "account_id", "spent", "remaining", "used", "cap", "delta", "charges",
            "last_charge", "created",
        ],
        Query(description="spent: composed at each account's delta; used: spent / cap."),
    ] = "spent",
    order: Literal["asc", "desc"] = "desc",
    type: Literal["user", "service", "admin"] | None = None,
    q: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=r"^[^\x00-\x1f\x7f]*$",
            description="An account id, a node id (or its prefix), or part of a label.",
        ),
    ] = None,
    status: Annotated[
        Literal["any", "active", "near_cap", "over_cap", "idle"],
        Query(description="active: spent > 0; idle: nothing spent; near_cap: spent >= "
              "fraction * cap; over_cap: spent > cap."),
    ] = "any",
    near_cap_fraction: Annotated[float, Query(gt=0, le=1)] = 0.8,
    min_spent_epsilon: Annotated[float | None, Query(ge=0, le=1e9)] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> AccountTable:  # fmt: skip
    """Accounts with their budgets, sorted, filtered and paginated in the database, with the
    total number of matches. Ties are broken by account id, so pages never overlap."""
    flt = AccountFilter(
        type=type,
        q=q or None,
        status=status,
        near_cap_fraction=near_cap_fraction,
        min_spent_epsilon=min_spent_epsilon,
    )
    page = _views(runtime).listing.accounts_page(
        flt, sort=sort, descending=order == "desc", limit=limit, offset=offset
    )
    return AccountTable(
        total=page.total,
        limit=page.limit,
        offset=page.offset,
        sort=sort,
        order=order,
        items=[AccountRow(**asdict(r)) for r in page.items],
    )


@router.get("/usage", operation_id="getUsage", response_model=Usage, responses=_ERRORS)
def usage(runtime: RuntimeDep, admin: AdminDep, hours: Hours = 24) -> Usage:
    """Queries charged and their per-query eps per hour, with refunds and refusals, over the
    last `hours` hours (every hour present)."""
    series = _views(runtime).activity.usage_per_hour(hours)
    return Usage.model_validate(
        {
            "hours": hours,
            "queries": sum(h.queries for h in series),
            "epsilon": float(sum(h.epsilon for h in series)),
            "refusals": sum(h.refusals for h in series),
            "series": [asdict(h) for h in series],
        }
    )


@router.get("/refusals", operation_id="getRefusals", response_model=Refusals, responses=_ERRORS)
def refusals(
    runtime: RuntimeDep,
    admin: AdminDep,
    hours: Annotated[int | None, Query(ge=1, le=24 * 90)] = None,
) -> Refusals:
    """Queries the ledger refused, by reason (`budget_exhausted`, `service_quota_exhausted`,
    `graph_budget_exhausted`, `mode_not_allowed`), kept durably across workers and restarts."""
    by_reason = _views(runtime).activity.refusals_by_reason(hours)
    return Refusals(hours=hours, total=sum(by_reason.values()), by_reason=by_reason)


@router.get("/spenders", operation_id="getSpenders", response_model=Spenders, responses=_ERRORS)
def spenders(
    runtime: RuntimeDep,
    admin: AdminDep,
    limit: Limit = 10,
    near_cap_fraction: Annotated[float, Query(gt=0, le=1)] = 0.8,
) -> Spenders:
    """Top spenders (composed spend) and the accounts nearest their cap."""
    views = _views(runtime)
    top = views.listing.accounts_page(AccountFilter(status="active"), sort="spent", limit=limit)
    near = views.listing.accounts_page(
        AccountFilter(status="near_cap", near_cap_fraction=near_cap_fraction),
        sort="used",
        limit=limit,
    )
    over = views.listing.accounts_page(AccountFilter(status="over_cap"), limit=1)
    return Spenders(
        top=[AccountRow(**asdict(r)) for r in top.items],
        near_cap=[AccountRow(**asdict(r)) for r in near.items],
        near_cap_total=near.total,
        near_cap_fraction=near_cap_fraction,
        over_cap_total=over.total,
    )


def degree_histogram(degrees: np.ndarray) -> list[DegreeBucket]:
    """Power-of-two buckets: [0], [1], [2, 3], [4, 7], ... up to the largest degree."""
    values = np.asarray(degrees, dtype=np.int64)
    if values.size == 0:
        return []
    top = int(values.max())
    edges = [0, 1] + [2**i for i in range(1, max(1, top).bit_length() + 1)]
    counts = np.bincount(np.searchsorted(edges, values, side="right") - 1, minlength=len(edges))
    buckets = []
    for i, low in enumerate(edges):
        if low > top:
            break
        high = edges[i + 1] - 1 if i + 1 < len(edges) else top
        buckets.append(DegreeBucket(low=low, high=min(high, top), nodes=int(counts[i])))
    return buckets


@router.get(
    "/graph/degrees", operation_id="getGraphDegrees", response_model=GraphDegrees, responses=_ERRORS
)
def graph_degrees(runtime: RuntimeDep, admin: AdminDep) -> GraphDegrees:
    """The loaded graph and its degree histogram, read from the degree cache. Exact degrees
    are shown to admins only, in buckets."""
    loaded = runtime.graphs.loaded
    assert loaded is not None
    graph = loaded.graph
    degrees = runtime.caches.degrees.get(graph.version)
    source: Literal["cache", "graph"] = "cache"
    if degrees is None:  # this worker's cache may be gone: refill it from the graph
        degrees, source = graph.degrees, "graph"
        runtime.caches.degrees.put(graph.version, degrees)
    return GraphDegrees(
        version=graph.version,
        source=loaded.source,
        nodes=graph.n,
        edges=graph.m,
        degree_min=int(degrees.min()) if degrees.size else 0,
        degree_mean=float(degrees.mean()) if degrees.size else 0.0,
        degree_max=int(degrees.max()) if degrees.size else 0,
        loaded_at=loaded.loaded_at,
        load_seconds=loaded.load_seconds,
        degree_source=source,
        histogram=degree_histogram(degrees),
    )


def _cache_rates() -> tuple[list[CacheRate], Literal["all workers", "this process"]]:
    """Cache lookups by cache and result from the Prometheus counters: summed over every
    worker when they share a metrics directory, else this process's."""
    scope: Literal["all workers", "this process"] = "this process"
    registry: Any = REGISTRY
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        scope = "all workers"
    counts: dict[str, dict[str, float]] = {}
    for metric in registry.collect():
        if metric.name != "ppr_cache_events":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                cache, result = sample.labels["cache"], sample.labels["result"]
                by = counts.setdefault(cache, {})
                by[result] = by.get(result, 0.0) + sample.value
    rates = []
    for cache in ("degrees", "calibration", "replay", "prefixes"):
        by = counts.get(cache, {})
        hits, misses = int(by.get("hit", 0)), int(by.get("miss", 0))
        looked = hits + misses
        rates.append(
            CacheRate(
                cache=cache,
                hits=hits,
                misses=misses,
                errors=int(by.get("error", 0)),
                hit_rate=hits / looked if looked else None,
            )
        )
    return rates, scope


def _live_worker_pids() -> list[int]:
    """Worker pids that wrote metrics into the shared directory and are still alive."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory or not os.path.isdir(directory):
        return [os.getpid()]
    pids: set[int] = set()
    for name in os.listdir(directory):
        stem = name.rsplit(".", 1)[0]
        tail = stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            pid = int(tail)
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):
                continue
            pids.add(pid)
    return sorted(pids | {os.getpid()})


@router.get("/health", operation_id="getAdminHealth", response_model=Health, responses=_ERRORS)
def health(runtime: RuntimeDep, admin: AdminDep) -> Health:
    """Database (latency, charges in flight), workers, and cache hit rates."""
    started = time.perf_counter()
    database_ok = runtime.ledger.ping()
    latency = (time.perf_counter() - started) * 1000
    in_flight: tuple[int | None, float | None] = (None, None)
    if database_ok:
        in_flight = _views(runtime).activity.in_flight()
    rates, scope = _cache_rates()
    cache_state = runtime.caches.state()
    loaded = runtime.graphs.loaded
    return Health(
        database=DatabaseHealth(
            status="ok" if database_ok else "unreachable",
            dialect=runtime.ledger.engine.dialect.name,
            latency_ms=round(latency, 3) if database_ok else None,
            in_flight_charges=in_flight[0],
            oldest_in_flight_seconds=in_flight[1],
        ),
        workers=WorkerHealth(
            configured=runtime.settings.workers,
            pid=os.getpid(),
            live_pids=_live_worker_pids(),
            uptime_seconds=round(time.time() - _STARTED, 1),
            reconciler_running=runtime.reconciler is not None,
        ),
        cache=CacheHealth(
            backend=str(cache_state.get("backend", "unknown")),
            status=str(cache_state.get("status", "unknown")),
            scope=scope,
            rates=rates,
            detail=cache_state,
        ),
        graph_version=loaded.graph.version if loaded is not None else None,
    )


@router.get(
    "/accounts/{account_id}/curve",
    operation_id="getAccountCurve",
    response_model=AccountCurve,
    responses=_ACCOUNT_ERRORS,
)
def account_curve(account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep) -> AccountCurve:
    """The account's spend after each live charge, composed in admission order by the RDP
    accountant at the account's delta, beside the naive sum of per-query epsilons."""
    curve = _views(runtime).account.account_curve(account_id)
    return AccountCurve.model_validate(asdict(curve))


@router.get(
    "/accounts/{account_id}/charges",
    operation_id="listAccountCharges",
    response_model=ChargePage,
    responses=_ACCOUNT_ERRORS,
)
def account_charges(
    account_id: AccountIdPath,
    runtime: RuntimeDep,
    admin: AdminDep,
    role: Annotated[
        Literal["charged", "principal"],
        Query(description="charged: charges to this account; principal: queries it made."),
    ] = "charged",
    state: Literal["admitted", "released", "refunded"] | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ChargePage:
    """An account's charges with their parameters and states, newest first, with the total."""
    page = _views(runtime).account.charges_page(
        account_id, role=role, state=state, limit=limit, offset=offset
    )
    return ChargePage.model_validate(asdict(page))


@router.get(
    "/accounts/{account_id}/service-usage",
    operation_id="getServiceUsage",
    response_model=ServiceUsage,
    responses=_ACCOUNT_ERRORS,
)
def service_usage(account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep) -> ServiceUsage:
    """A service account's modes, quota, quota used in the last 24 h, what it charged to
    other accounts, and its read figure (what its answers reveal; 422 for other types)."""
    usage = _views(runtime).account.service_usage(
        account_id, default_quota=runtime.settings.service_quota_epsilon
    )
    reads = runtime.ledger.read_figures.read_view(
        account_id, default_cap_epsilon=runtime.settings.service_read_cap_epsilon
    )
    return ServiceUsage.model_validate(
        {
            **asdict(usage),
            "read_epsilon": reads.epsilon,
            "read_releases": reads.releases,
            "read_cap_epsilon": reads.cap_epsilon,
        }
    )


@router.post(
    "/accounts/{account_id}/budget/preview",
    operation_id="previewAccountBudget",
    response_model=BudgetPreview,
    responses=_ACCOUNT_ERRORS,
)
def preview_budget(
    account_id: AccountIdPath, body: SetBudget, runtime: RuntimeDep, admin: AdminDep
) -> BudgetPreview:
    """What `PUT /v1/admin/accounts/{id}/budget` would make of the budget; nothing changes."""
    preview = _views(runtime).account.preview_budget(
        account_id, cap_epsilon=body.cap_epsilon, delta=body.delta
    )
    return BudgetPreview.model_validate(asdict(preview))


@router.get("/audit-log", operation_id="getAuditLog", response_model=AuditPage, responses=_ERRORS)
def audit_log(
    runtime: RuntimeDep,
    admin: AdminDep,
    action: Annotated[
        str | None,
        Query(
            max_length=100,
            pattern=r"^[a-z_.]*$",
            description="An action (`budget.set`), or a prefix ending in `.` (`api_key.`).",
        ),
    ] = None,
    actor_account_id: OptionalAccountId = None,
    target_account_id: OptionalAccountId = None,
    account_id: Annotated[
        int | None, Query(ge=1, le=ID_MAX, description="Actor or target.")
    ] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> AuditPage:
    """Admin actions, newest first, filterable, with the total."""
    page = _views(runtime).audit.audit_page(
        action=action or None,
        actor_account_id=actor_account_id,
        target_account_id=target_account_id,
        account_id=account_id,
        limit=limit,
        offset=offset,
    )
    return AuditPage.model_validate(asdict(page))
