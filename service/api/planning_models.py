"""Bodies of the admin planning endpoints: the budget planner and the run-out projections."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.dashboard_models import AccountRow
from service.api.figures import ComposedFigure
from service.api.params import CapEpsilonField, DeltaField
from service.bounds import PLAN_ANSWERS_PER_DAY_MAX, PLAN_DAYS_MAX, PLAN_GRAPH_VERSIONS_MAX

MechanismName = Literal[
    "noisy_diffusion", "popular", "common_neighbours", "friends_of_friends", "blended"
]

PROJECTION = (
    "the account's live charges of the last `window_days` days, composed (RDP, order by order), "
    "are assumed to repeat at the same rate: after t days the spend is the spend now plus "
    "t / window_days times that curve; the account runs out at the first t where this converts "
    "at its delta to its cap or more (to the minute). No charge in the window: no date."
)


class PlanRequest(BaseModel):
    """A schedule of fresh answers to fit under a cap."""

    model_config = ConfigDict(extra="forbid")

    cap_epsilon: CapEpsilonField
    days: int = Field(strict=True, ge=1, le=PLAN_DAYS_MAX, description="Days the budget lasts.")
    answers_per_day: int = Field(
        strict=True, ge=1, le=PLAN_ANSWERS_PER_DAY_MAX,
        description="Fresh (charged) answers per day; replays are free.",
    )  # fmt: skip
    mechanism: MechanismName | None = Field(
        None, description="The ranking; default PPR_DEFAULT_MECHANISM, resolved for the mode."
    )
    mode: Literal["personalized", "edge"] = "personalized"
    delta: DeltaField | None = Field(None, description="Default: new accounts' delta.")
    graph_versions: int = Field(
        1, strict=True, ge=1, le=PLAN_GRAPH_VERSIONS_MAX,
        description="Graph versions the answers span: blended and popular charge the degree "
        "release once per version.",
    )  # fmt: skip


class PlanCurveRow(BaseModel):
    order: float | None = Field(description="Renyi order; null: infinity (the pure value).")
    rdp: float | None
    epsilon: float | None = Field(description="What this order certifies at delta.")
    best: bool = Field(description="The order the accountant takes (the smallest epsilon).")


class Plan(BaseModel):
    """The largest per-answer epsilon that fits, and the composed curve it spends."""

    mechanism: MechanismName
    mode: Literal["personalized", "edge"]
    cap_epsilon: float
    delta: float
    days: int
    answers_per_day: int
    answers: int
    graph_versions: int
    degree_releases: int = Field(description="Degree releases the account pays (one a version).")
    degree_epsilon: float | None = Field(description="eps_d of each (PPR_POPULAR_EPSILON).")
    epsilon: float | None = Field(
        description="The largest per-answer epsilon that fits, rounded down (null for "
        "`popular`: nothing is charged per answer); at most PPR_EPSILON_MAX."
    )
    answer_epsilon: float | None = Field(description="What one such answer states (<= epsilon).")
    within_query_range: bool = Field(
        description="The service accepts queries at `epsilon` (PPR_EPSILON_MIN.._MAX)."
    )
    epsilon_min: float
    epsilon_max: float
    spent_epsilon: float = Field(description="The whole schedule composed, at delta.")
    degrees_spent_epsilon: float = Field(description="The degree releases alone, composed.")
    steps: int
    beta: float
    curve: list[PlanCurveRow]
    notes: list[str]


class RunOut(BaseModel):
    """When the account runs out of budget at its recent rate."""

    account_id: int
    cap_epsilon: float
    delta: float
    spent_epsilon: ComposedFigure
    window_days: float
    window_charges: int = Field(description="Live charges created in the window.")
    window_epsilon: ComposedFigure = Field(description="Their composition, at delta.")
    days_left: float | None = Field(description="Days until the cap (null: not at this rate).")
    runs_out_at: str | None = Field(description="That moment (UTC); null: not at this rate.")
    as_of: str
    projection: str = Field(PROJECTION, description="How the date is projected.")


class RunOutRow(BaseModel):
    account: AccountRow
    run_out: RunOut


class NearCapRunOut(BaseModel):
    """Accounts near their cap, soonest to run out first."""

    as_of: str
    window_days: float
    near_cap_fraction: float
    near_cap_total: int = Field(description="Accounts with spent >= fraction x cap.")
    scanned: int = Field(description="Of those, the most used projected (at most 1000).")
    projection: str = PROJECTION
    items: list[RunOutRow]
