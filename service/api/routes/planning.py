"""Admin planning endpoints: the budget planner (``POST /v1/admin/plan``) and when accounts run
out of budget at their recent rate (``GET /v1/admin/run-out``, ``GET
/v1/admin/accounts/{id}/run-out``). Admin-only; nothing here changes the ledger."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.dashboard_models import AccountRow
from service.api.deps import AdminDep, RuntimeDep
from service.api.models import ErrorResponse
from service.api.params import AccountIdPath, Limit
from service.api.planning_models import NearCapRunOut, Plan, PlanRequest, RunOut, RunOutRow
from service.api.strict import StrictRoute
from service.ledger.admin_views import AdminViews
from service.planning.budget import Deployment, plan_budget

router = APIRouter(prefix="/v1/admin", tags=["admin planning"], route_class=StrictRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse},
    403: {"model": ErrorResponse, "description": "`forbidden`: not an admin key"},
    422: {
        "model": ErrorResponse,
        "description": "`invalid_parameter` (`details.parameter` names it): a value out of "
        "range, a mechanism the mode does not offer, or a schedule nothing fits (the degree "
        "releases alone pass the cap)",
    },
}
_ACCOUNT_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": ErrorResponse, "description": "`unknown_account`"},
}
WindowDays = Annotated[
    float, Query(ge=1, le=90, description="The window of the recent rate, in days.")
]
NearCapFraction = Annotated[float, Query(gt=0, le=1)]


@router.post("/plan", response_model=Plan, responses=_ERRORS, operation_id="planBudget")
def plan(body: PlanRequest, runtime: RuntimeDep, admin: AdminDep) -> Plan:
    """The largest per-answer epsilon for `days` x `answers_per_day` fresh answers of a
    ranking to fit `cap_epsilon`: the curve the service charges per answer composed that many
    times, plus the degree release once per graph version for `blended` and `popular`,
    converted at delta (bisection, rounded down: every planned answer is admitted); and the
    composed curve at a few orders. Uses this deployment's settings (steps, beta,
    PPR_POPULAR_EPSILON, the per-query epsilon range)."""
    made = plan_budget(
        body.cap_epsilon,
        body.days,
        body.answers_per_day,
        mechanism=body.mechanism,
        mode=body.mode,
        delta=body.delta,
        graph_versions=body.graph_versions,
        deployment=Deployment.of(runtime.settings),
    )
    return Plan.model_validate(made.to_dict())


@router.get("/run-out", response_model=NearCapRunOut, responses=_ERRORS, operation_id="listRunOut")
def run_out(
    runtime: RuntimeDep,
    admin: AdminDep,
    window_days: WindowDays = 7.0,
    near_cap_fraction: NearCapFraction = 0.8,
    limit: Limit = 10,
) -> NearCapRunOut:
    """Accounts near their cap (spent >= `near_cap_fraction` x cap; the 1000 most used),
    sorted by when they run out at their rate of the last `window_days` days (see
    `projection`): soonest first, those not running out at that rate last."""
    page = AdminViews(runtime.ledger).run_outs.near_cap(
        near_cap_fraction=near_cap_fraction, window_days=window_days, limit=limit
    )
    return NearCapRunOut(
        as_of=page.as_of,
        window_days=page.window_days,
        near_cap_fraction=page.near_cap_fraction,
        near_cap_total=page.near_cap_total,
        scanned=page.scanned,
        items=[
            RunOutRow(account=AccountRow(**asdict(row)), run_out=RunOut(**asdict(run)))
            for row, run in page.items
        ],
    )


@router.get(
    "/accounts/{account_id}/run-out",
    response_model=RunOut,
    responses=_ACCOUNT_ERRORS,
    operation_id="getAccountRunOut",
)
def account_run_out(
    account_id: AccountIdPath, runtime: RuntimeDep, admin: AdminDep, window_days: WindowDays = 7.0
) -> RunOut:
    """When this account runs out of budget at its rate of the last `window_days` days."""
    run = AdminViews(runtime.ledger).run_outs.run_out_of(account_id, window_days=window_days)
    return RunOut(**asdict(run))
