"""The budget planner: the largest per-answer epsilon that lets an account receive ``days`` x
``answers_per_day`` fresh answers of one ranking within its cap.

What is composed is exactly what the service charges (:mod:`service.mechanisms.charges`):

    total(eps) = (days * answers_per_day) x answer_curve(eps)  +  releases x degree_curve

with ``releases`` = min(graph versions, answers) for the rankings built on the graph version's
degree release (``blended``, ``popular``: the account pays it once per version, with its first
answer of the version) and 0 for the others; composition adds the RDP curves order by order, and
the total is converted at the account's delta as admission converts it. The planned epsilon is the
largest eps with total(eps) <= cap (bisection, then rounded DOWN to six significant digits; see
:mod:`service.privacy.horizon`), so a plan never overspends: every planned answer is admitted.
Replays of a stored answer are free and are not counted; each planned answer is a fresh draw.

``popular`` charges nothing per answer: its plan has no per-answer epsilon, only the degree
releases, which fit or do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from service.bounds import (
    CAP_EPSILON_MAX,
    CAP_EPSILON_MIN,
    DELTA_MAX,
    DELTA_MIN,
    PLAN_ANSWERS_PER_DAY_MAX,
    PLAN_DAYS_MAX,
    PLAN_GRAPH_VERSIONS_MAX,
)
from service.errors import InvalidParameter
from service.mechanisms.charges import BUILT_ON_DEGREES, answer_curve, version_curve
from service.mechanisms.registry import DEFAULT_MECHANISM, RankingMechanism, resolve_mechanism
from service.privacy.accountant import RdpCurve
from service.privacy.horizon import OrderRow, conversion_table, fits, largest_fitting
from service.privacy.modes import Mode

__all__ = ["BudgetPlan", "Deployment", "plan_budget"]

#: The smallest per-answer epsilon the bisection considers (below it nothing is worth serving).
SMALLEST_EPSILON = 1e-6


@dataclass(frozen=True)
class Deployment:
    """What a plan takes from the deployment's settings (``PPR_*``; :meth:`of` reads them from
    a :class:`service.settings.mechanism.MechanismSettings`)."""

    steps: int = 100
    beta: float = 0.8
    popular_epsilon: float = 0.1
    epsilon_min: float = 0.01
    epsilon_max: float = 2.0
    default_mechanism: str = DEFAULT_MECHANISM.value
    delta: float = 1e-6

    @classmethod
    def of(cls, settings: Any) -> Deployment:
        return cls(
            steps=int(settings.steps),
            beta=float(settings.beta),
            popular_epsilon=float(settings.popular_epsilon),
            epsilon_min=float(settings.epsilon_min),
            epsilon_max=float(settings.epsilon_max),
            default_mechanism=RankingMechanism(settings.default_mechanism).value,
            delta=float(settings.account_delta),
        )


@dataclass(frozen=True)
class BudgetPlan:
    """A plan: the schedule, the planned per-answer epsilon, and the composed curve it spends."""

    mechanism: str
    mode: str
    cap_epsilon: float
    delta: float
    days: int
    answers_per_day: int
    graph_versions: int
    #: Degree releases the account pays for (0 for rankings not built on them).
    degree_releases: int
    #: eps_d of each degree release (None when the ranking is not built on it).
    degree_epsilon: float | None
    #: The largest per-answer epsilon that fits, at most ``PPR_EPSILON_MAX`` (None for
    #: ``popular``: nothing is charged per answer).
    epsilon: float | None
    #: What one answer at ``epsilon`` is charged, as the service states it (<= ``epsilon``).
    answer_epsilon: float | None
    composed: RdpCurve
    #: The composed curve converted at ``delta``: what the account will have spent.
    spent_epsilon: float
    #: The degree releases alone, composed and converted.
    degrees_spent_epsilon: float
    epsilon_min: float
    epsilon_max: float
    steps: int
    beta: float
    table: list[OrderRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return self.days * self.answers_per_day

    @property
    def within_query_range(self) -> bool:
        """The service accepts a query at ``epsilon`` (``PPR_EPSILON_MIN`` .. ``_MAX``)."""
        return self.epsilon is None or self.epsilon_min <= self.epsilon <= self.epsilon_max

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the admin API's answer; infinity is written as None)."""

        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {
            "mechanism": self.mechanism,
            "mode": self.mode,
            "cap_epsilon": self.cap_epsilon,
            "delta": self.delta,
            "days": self.days,
            "answers_per_day": self.answers_per_day,
            "answers": self.answers,
            "graph_versions": self.graph_versions,
            "degree_releases": self.degree_releases,
            "degree_epsilon": self.degree_epsilon,
            "epsilon": self.epsilon,
            "answer_epsilon": self.answer_epsilon,
            "within_query_range": self.within_query_range,
            "epsilon_min": self.epsilon_min,
            "epsilon_max": self.epsilon_max,
            "spent_epsilon": self.spent_epsilon,
            "degrees_spent_epsilon": self.degrees_spent_epsilon,
            "steps": self.steps,
            "beta": self.beta,
            "curve": [
                {
                    "order": num(r.order),
                    "rdp": num(r.rdp),
                    "epsilon": num(r.epsilon),
                    "best": r.best,
                }
                for r in self.table
            ],
            "notes": list(self.notes),
        }


def _integer(name: str, value: Any, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidParameter(name, f"must be an integer in [1, {high}], got {value!r}")
    return int(value)


def _number(name: str, value: Any, low: float, high: float, *, high_open: bool = False) -> float:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and low <= value
        and (value < high if high_open else value <= high)
    )
    if not ok:
        right = ")" if high_open else "]"
        raise InvalidParameter(
            name, f"must be a number in [{low:g}, {high:g}{right}, got {value!r}"
        )
    return float(value)


def plan_budget(
    cap_epsilon: float,
    days: int,
    answers_per_day: int,
    *,
    mechanism: str | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
    delta: float | None = None,
    graph_versions: int = 1,
    deployment: Deployment | None = None,
) -> BudgetPlan:
    """Plan ``days`` x ``answers_per_day`` fresh answers of ``mechanism`` (default: the
    deployment's, resolved for ``mode`` as a query without ``mechanism`` is) under
    ``cap_epsilon`` at ``delta`` (default: new accounts' delta), over ``graph_versions``
    versions of the graph.

    Raises :class:`InvalidParameter` for a bad input, or when nothing fits: the degree releases
    alone pass the cap, or not even answers at :data:`SMALLEST_EPSILON` fit.
    """
    d = deployment or Deployment()
    cap = _number("cap_epsilon", cap_epsilon, CAP_EPSILON_MIN, CAP_EPSILON_MAX)
    days = _integer("days", days, PLAN_DAYS_MAX)
    per_day = _integer("answers_per_day", answers_per_day, PLAN_ANSWERS_PER_DAY_MAX)
    versions = _integer("graph_versions", graph_versions, PLAN_GRAPH_VERSIONS_MAX)
    delta = d.delta if delta is None else _number("delta", delta, DELTA_MIN, DELTA_MAX,
                                                   high_open=True)  # fmt: skip
    try:
        mode = Mode(mode)
    except ValueError:
        raise InvalidParameter("mode", f"must be one of {[m.value for m in Mode]}") from None
    name = resolve_mechanism(mechanism, mode, d.default_mechanism)
    answers = days * per_day

    built_on_degrees = name in BUILT_ON_DEGREES
    releases = min(versions, answers) if built_on_degrees else 0
    degrees = version_curve(name, d.popular_epsilon) * releases
    degrees_spent = degrees.epsilon(delta)
    notes: list[str] = []
    if built_on_degrees and not fits(degrees, cap, delta):
        raise InvalidParameter(
            "cap_epsilon",
            f"the {releases} degree releases {name.value} is built on (one per graph version, "
            f"eps_d {d.popular_epsilon:g} each, PPR_POPULAR_EPSILON) compose to "
            f"{degrees_spent:.6g} alone, above the cap {cap:g}: plan fewer graph versions, a "
            "larger cap, or a ranking not built on the degree release",
        )

    def per_answer(eps: float) -> RdpCurve:
        return answer_curve(name, eps, delta=delta, steps=d.steps, beta=d.beta, mode=mode)

    epsilon: float | None = None
    answer_epsilon: float | None = None
    if name is RankingMechanism.POPULAR:
        composed = degrees
        notes.append(
            "popular charges nothing per answer: every answer ranks the graph version's one "
            "degree release, paid once per version"
        )
    else:

        def total(eps: float) -> RdpCurve:
            return per_answer(eps) * answers + degrees

        if fits(total(d.epsilon_max), cap, delta):
            epsilon = d.epsilon_max
            notes.append(
                f"even PPR_EPSILON_MAX ({d.epsilon_max:g}), the largest epsilon a query may ask "
                "for, fits: the plan uses it per answer and leaves budget unspent"
            )
        else:
            found = largest_fitting(total, cap, delta, low=SMALLEST_EPSILON)
            if found is None:
                raise InvalidParameter(
                    "answers_per_day",
                    f"{answers} answers do not fit the cap {cap:g} even at epsilon "
                    f"{SMALLEST_EPSILON:g} each: plan fewer answers or a larger cap",
                )
            epsilon = found
        composed = per_answer(epsilon) * answers + degrees
        answer_epsilon = _stated_epsilon(name, per_answer(epsilon), epsilon, delta)
        if epsilon < d.epsilon_min:
            at_min = (per_answer(d.epsilon_min) * answers + degrees).epsilon(delta)
            notes.append(
                f"{epsilon:.6g} is below PPR_EPSILON_MIN ({d.epsilon_min:g}): the service "
                f"refuses such queries (422). At {d.epsilon_min:g} per answer the schedule "
                f"would need a cap of {at_min:.4g}; or lower PPR_EPSILON_MIN, plan fewer "
                "answers, or choose another ranking"
            )
    if built_on_degrees:
        notes.append(
            f"includes {releases} degree release(s) at eps_d {d.popular_epsilon:g} "
            f"(PPR_POPULAR_EPSILON), one per graph version: {degrees_spent:.4g} of the cap alone"
        )
    return BudgetPlan(
        mechanism=name.value,
        mode=mode.value,
        cap_epsilon=cap,
        delta=delta,
        days=days,
        answers_per_day=per_day,
        graph_versions=versions,
        degree_releases=releases,
        degree_epsilon=d.popular_epsilon if built_on_degrees else None,
        epsilon=epsilon,
        answer_epsilon=answer_epsilon,
        composed=composed,
        spent_epsilon=composed.epsilon(delta),
        degrees_spent_epsilon=degrees_spent,
        epsilon_min=d.epsilon_min,
        epsilon_max=d.epsilon_max,
        steps=d.steps,
        beta=d.beta,
        table=conversion_table(composed, delta),
        notes=notes,
    )


def _stated_epsilon(name: RankingMechanism, curve: RdpCurve, epsilon: float, delta: float) -> float:
    """The epsilon an answer states: a count release's achieved pure epsilon (its scale is
    rounded up), the diffusion's curve converted at the account's delta."""
    if name is RankingMechanism.NOISY_DIFFUSION:
        return min(epsilon, curve.epsilon(delta))
    return min(epsilon, curve.pure)
