"""Admin endpoints: accounts, keys, budgets, charges, the audit log and the graph.

Every change is written to the ledger's audit log with the acting admin's account id.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, status

from service.api.dashboard_models import BudgetChange
from service.api.deps import AdminDep, RuntimeDep
from service.api.models import (
    Account,
    AccountWithBudget,
    ApiKey,
    Budget,
    Charge,
    CreateAccount,
    CreatedAccount,
    ErrorResponse,
    Exposure,
    GraphInfo,
    NewApiKey,
    Reads,
    ReloadGraph,
    SetBudget,
    SetScopes,
)
from service.api.params import AccountIdPath, AccountIdQuery, KeyIdPath, Limit, Offset
from service.api.runtime import Runtime, node_set_origin
from service.api.strict import StrictRoute
from service.errors import Conflict, InvalidParameter
from service.graph.configured import graph_file_in
from service.ledger.records import AccountRecord

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse},
    403: {"model": ErrorResponse},
    404: {"model": ErrorResponse},
    409: {"model": ErrorResponse},
    422: {"model": ErrorResponse},
}


def _with_budget(runtime: Runtime, record: AccountRecord) -> AccountWithBudget:
    budget = Budget.of(runtime.ledger.budgets.budget(record.account_id))
    return AccountWithBudget(**Account.of(record).model_dump(), budget=budget)


@router.get(
    "/accounts",
    operation_id="listAccounts",
    response_model=list[AccountWithBudget],
    responses=_ERRORS,
)
def list_accounts(
    runtime: RuntimeDep,
    admin: AdminDep,
    type: Annotated[Literal["user", "service", "admin"] | None, Query()] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[AccountWithBudget]:
    records = runtime.ledger.accounts.list_accounts(type=type, limit=limit, offset=offset)
    return [_with_budget(runtime, r) for r in records]


@router.post(
    "/accounts",
    operation_id="createAccount",
    response_model=CreatedAccount,
    status_code=status.HTTP_201_CREATED,
    responses=_ERRORS,
)
def create_account(body: CreateAccount, runtime: RuntimeDep, admin: AdminDep) -> CreatedAccount:
    """Create an account and its first API key (shown once)."""
    graph = runtime.graphs.current
    if body.type == "user" and body.node_id is not None:
        graph.index_of(body.node_id)  # unknown_node if the graph does not have it
    opened = runtime.ledger.open_account(
        body.type,
        defaults=runtime.settings,
        node_id=body.node_id,
        cap_epsilon=body.cap_epsilon,
        delta=body.delta,
        label=body.label,
        may_create_seed_accounts=body.may_create_seed_accounts,
        modes=body.modes,
        quota_epsilon=body.quota_epsilon,
        actor_account_id=admin.account_id,
    )
    account = _with_budget(runtime, opened.account)
    return CreatedAccount(
        **account.model_dump(), key=NewApiKey(**opened.key.__dict__, api_key=opened.api_key)
    )


@router.get(
    "/accounts/{account_id}",
    operation_id="getAccount",
    response_model=AccountWithBudget,
    responses=_ERRORS,
)
def get_account(
    account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep
) -> AccountWithBudget:
    return _with_budget(runtime, runtime.ledger.accounts.get_account(account_id))


@router.put(
    "/accounts/{account_id}/budget",
    operation_id="setAccountBudget",
    response_model=BudgetChange,
    responses=_ERRORS,
)
def set_budget(
    account_id: AccountIdPath, body: SetBudget, runtime: RuntimeDep, admin: AdminDep
) -> BudgetChange:
    """Change an account's cap and/or delta, and its budget period (audited). The spend is
    kept as an RDP curve, so it is re-converted at a new delta; a cap below the spend is
    allowed (flagged as `cap_below_spent`) and simply refuses further queries. A period
    (`day`, `week`, `month`: UTC windows) with `period_cap_epsilon` caps what the account
    spends per period on top of the lifetime cap; `clear_period` removes it."""
    view = runtime.ledger.budgets.set_budget(
        account_id,
        cap_epsilon=body.cap_epsilon,
        delta=body.delta,
        period=body.period,
        period_cap_epsilon=body.period_cap_epsilon,
        clear_period=body.clear_period,
        actor_account_id=admin.account_id,
    )
    return BudgetChange(**view.to_dict(), cap_below_spent=view.cap_epsilon < view.spent_epsilon)


@router.put(
    "/accounts/{account_id}/scopes",
    operation_id="setAccountScopes",
    response_model=Account,
    responses=_ERRORS,
)
def set_scopes(
    account_id: AccountIdPath, body: SetScopes, runtime: RuntimeDep, admin: AdminDep
) -> Account:
    """Change a service account's scopes (audited): the modes it may query (personalized mode
    charges seed users' budgets and must be granted explicitly), whether it may create seed
    users' accounts, and its 24-hour quota of eps charged to other accounts."""
    if body.quota_epsilon is not None and body.default_quota:
        raise InvalidParameter("quota_epsilon", "cannot be given with default_quota")
    if body.read_cap_epsilon is not None and body.default_read_cap:
        raise InvalidParameter("read_cap_epsilon", "cannot be given with default_read_cap")
    record = runtime.ledger.budgets.set_scopes(
        account_id,
        modes=tuple(body.modes) if body.modes is not None else None,
        may_create_seed_accounts=body.may_create_seed_accounts,
        quota_epsilon=body.quota_epsilon,
        clear_quota=body.default_quota,
        actor_account_id=admin.account_id,
        read_cap_epsilon=body.read_cap_epsilon,
        clear_read_cap=body.default_read_cap,
    )
    return Account.of(record)


@router.get(
    "/accounts/{account_id}/reads",
    operation_id="getAccountReads",
    response_model=Reads,
    responses=_ERRORS,
)
def account_reads(account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep) -> Reads:
    """A service account's read figure (what its answers reveal, composed) and its cap."""
    record = runtime.ledger.accounts.get_account(account_id)
    if record.type != "service":
        raise InvalidParameter("account_id", "only service accounts have a read figure")
    return Reads.of(
        runtime.ledger.read_figures.read_view(
            account_id, default_cap_epsilon=runtime.settings.service_read_cap_epsilon
        )
    )


@router.get("/exposure", operation_id="getExposure", response_model=Exposure, responses=_ERRORS)
def exposure(
    runtime: RuntimeDep,
    admin: AdminDep,
    delta: Annotated[float | None, Query(gt=0, lt=1)] = None,
) -> Exposure:
    """The graph-wide exposure: every live charge of every account (and every graph-wide
    release) composed by the RDP accountant into one bound on what all accounts together can
    have learned about any one edge, with its hourly growth. `delta` defaults to
    `PPR_EXPOSURE_DELTA`, or else the smallest account delta."""
    settings = runtime.settings
    report = runtime.ledger.reports.exposure(
        delta=delta if delta is not None else settings.exposure_delta,
        cap_epsilon=settings.graph_cap_epsilon,
    )
    return Exposure.model_validate(report.to_dict())


@router.get(
    "/accounts/{account_id}/keys",
    operation_id="listAccountKeys",
    response_model=list[ApiKey],
    responses=_ERRORS,
)
def list_keys(account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep) -> list[ApiKey]:
    runtime.ledger.accounts.get_account(account_id)
    return [ApiKey.of(k) for k in runtime.ledger.api_keys.list_api_keys(account_id)]


@router.post(
    "/accounts/{account_id}/keys",
    operation_id="createAccountKey",
    response_model=NewApiKey,
    status_code=status.HTTP_201_CREATED,
    responses=_ERRORS,
)
def create_key(account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep) -> NewApiKey:
    runtime.ledger.accounts.get_account(account_id)
    key, record = runtime.ledger.api_keys.create_api_key(
        account_id, actor_account_id=admin.account_id
    )
    return NewApiKey(**record.__dict__, api_key=key)


@router.post(
    "/keys/{key_id}/revoke", operation_id="revokeKey", response_model=ApiKey, responses=_ERRORS
)
def revoke_key(key_id: KeyIdPath, runtime: RuntimeDep, admin: AdminDep) -> ApiKey:
    """Revoke a key (idempotent). The key's row stays; it no longer authenticates."""
    return ApiKey.of(
        runtime.ledger.api_keys.revoke_api_key(key_id, actor_account_id=admin.account_id)
    )


@router.get("/charges", operation_id="listCharges", response_model=list[Charge], responses=_ERRORS)
def list_charges(
    runtime: RuntimeDep,
    admin: AdminDep,
    account_id: AccountIdQuery = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[Charge]:
    """Charges, newest first (refunded ones marked); optionally of one charged account."""
    records = runtime.ledger.reports.list_charges(account_id, limit=limit, offset=offset)
    return [Charge.of(r) for r in records]


@router.get("/audit", operation_id="listAudit", responses=_ERRORS)
def audit_log(runtime: RuntimeDep, admin: AdminDep, limit: Limit = 100) -> list[dict[str, Any]]:
    return runtime.ledger.reports.list_audit(limit=limit)


def _graph_info(runtime: Runtime) -> GraphInfo:
    loaded = runtime.graphs.loaded
    assert loaded is not None
    graph = loaded.graph
    degrees = runtime.caches.degrees.get(graph.version)
    if degrees is None:  # another worker's cache may be gone: rebuild it from the graph
        degrees = graph.degrees
        runtime.caches.degrees.put(graph.version, degrees)
    return GraphInfo(
        version=graph.version,
        fingerprint=graph.fingerprint,
        node_set=node_set_origin(runtime.settings, loaded.source),
        max_degree_bound=graph.degree_bound,
        source=loaded.source,
        nodes=graph.n,
        edges=graph.m,
        degree_min=int(degrees.min()) if degrees.size else 0,
        degree_mean=float(degrees.mean()) if degrees.size else 0.0,
        degree_max=int(degrees.max()) if degrees.size else 0,
        loaded_at=loaded.loaded_at,
        load_seconds=loaded.load_seconds,
    )


@router.get("/graph", operation_id="getGraph", response_model=GraphInfo, responses=_ERRORS)
def graph_info(runtime: RuntimeDep, admin: AdminDep) -> GraphInfo:
    return _graph_info(runtime)


@router.post(
    "/graph/reload", operation_id="reloadGraph", response_model=GraphInfo, responses=_ERRORS
)
def reload_graph(
    runtime: RuntimeDep, admin: AdminDep, body: ReloadGraph | None = None
) -> GraphInfo:
    """Load the graph again and swap it in atomically.

    With no body (or `{}`), the current file is read again (`PPR_GRAPH_PATH`, or the file last
    loaded). With `{"path": "NAME"}`, the file NAME inside `PPR_GRAPH_DIR` is loaded instead
    and becomes the current file; a name that leaves that directory (`..`, an absolute path,
    a symbolic link pointing out) or a service with no `PPR_GRAPH_DIR` is
    `422 invalid_parameter`. Queries in flight finish on the old version. A broken file
    leaves the old graph serving and answers with the loader's error (`graph_load_error`,
    naming file and line). The new version and its file are recorded in the ledger database;
    every other worker and replica compares its own version with it at most every
    `PPR_GRAPH_VERSION_CHECK_MS` and loads the recorded file. A sandbox (a synthetic release
    served with charging off) cannot reload: `409 conflict`.
    """
    if runtime.sandbox is not None:
        raise Conflict(
            "this service is a sandbox serving a synthetic release: restart it on another "
            "file instead of reloading"
        )
    previous = runtime.graphs.current.version
    path = None
    if body is not None and body.path is not None:
        path = graph_file_in(runtime.settings.graph_dir, body.path)
    try:
        loaded = runtime.graphs.load(path)
    except Exception as exc:
        runtime.ledger.reports.record_audit(
            admin.account_id,
            "graph.reload_failed",
            details={"error": str(exc)[:500], "path": body.path if body else None},
        )
        raise
    runtime.ledger.reports.record_audit(
        admin.account_id,
        "graph.reload",
        details={
            "previous_version": previous,
            "version": loaded.graph.version,
            "source": loaded.source,
        },
    )
    return _graph_info(runtime)
