"""What a plan buys: ranking quality at the planned per-answer epsilon on a graph, measured by
``evaluate``'s runner (:func:`service.evaluation.runner.evaluate`): NDCG@k against exact PPR,
overall (the seed excluded) and beyond the seed's neighbours, means with 95% t-intervals over
random seeds, with the plan's delta, mode, diffusion settings and degree release epsilon.

:func:`compare_plans` plans every ranking the mode offers on the same schedule, each at its own
largest epsilon, so rankings are compared at what the budget really allows each of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.errors import InvalidParameter
from service.evaluation.options import DEFAULT_ETA
from service.evaluation.runner import EvaluationRow, evaluate
from service.graph.model import Graph
from service.mechanisms.registry import PERSONALIZED_ONLY, RankingMechanism
from service.planning.budget import BudgetPlan, Deployment, plan_budget
from service.privacy.modes import Mode

__all__ = ["PlanComparison", "compare_plans", "plan_quality", "recommended"]


def plan_quality(
    graph: Graph,
    plan: BudgetPlan,
    *,
    k: int = 20,
    seeds: int = 200,
    sample_seed: int | None = None,
    eta: float = DEFAULT_ETA,
    progress: Callable[[str], None] | None = None,
) -> EvaluationRow:
    """NDCG@k of ``plan``'s ranking at its per-answer epsilon on ``graph`` (``popular`` does not
    depend on it), over ``seeds`` random seeds of degree >= 1 (``sample_seed`` fixes the sample,
    never the noise)."""
    epsilon = plan.epsilon if plan.epsilon is not None else plan.epsilon_min
    (row,) = evaluate(
        graph,
        [epsilon],
        seeds_count=seeds,
        k=k,
        eta=eta,
        delta=plan.delta,
        beta=plan.beta,
        steps=plan.steps,
        mechanisms=[plan.mechanism],
        mode=plan.mode,
        rng=np.random.default_rng(sample_seed),
        popular_epsilon=plan.degree_epsilon or Deployment().popular_epsilon,
        progress=progress,
    )
    return row


@dataclass(frozen=True)
class PlanComparison:
    """One ranking's plan on a shared schedule, its quality when measured, or why it has none."""

    mechanism: str
    plan: BudgetPlan | None
    quality: EvaluationRow | None = None
    refused: str | None = None


def compare_plans(
    cap_epsilon: float,
    days: int,
    answers_per_day: int,
    *,
    mode: Mode | str = Mode.PERSONALIZED,
    delta: float | None = None,
    graph_versions: int = 1,
    deployment: Deployment | None = None,
    graph: Graph | None = None,
    k: int = 20,
    seeds: int = 200,
    sample_seed: int | None = None,
    eta: float = DEFAULT_ETA,
) -> list[PlanComparison]:
    """Every ranking the mode offers planned on the same schedule (and measured on ``graph``
    with the same seed sample when given). A ranking that cannot fit is listed with the reason."""
    mode = Mode(mode)
    rows: list[PlanComparison] = []
    for name in RankingMechanism:
        if mode is Mode.EDGE and name in PERSONALIZED_ONLY:
            continue
        try:
            plan = plan_budget(
                cap_epsilon, days, answers_per_day, mechanism=name.value, mode=mode,
                delta=delta, graph_versions=graph_versions, deployment=deployment,
            )  # fmt: skip
        except InvalidParameter as exc:
            rows.append(PlanComparison(name.value, None, refused=exc.message))
            continue
        quality = None
        if graph is not None:
            quality = plan_quality(graph, plan, k=k, seeds=seeds, sample_seed=sample_seed, eta=eta)
        rows.append(PlanComparison(name.value, plan, quality))
    return rows


def recommended(rows: list[PlanComparison]) -> PlanComparison | None:
    """The ranking to use on this schedule, among the measured plans the service accepts
    (per-answer epsilon within its range): the best NDCG@k beyond the neighbours, or, among
    those level with it (95% intervals overlapping the best's), the one that spends the least of
    the cap. None when nothing was measured."""
    usable = [
        r for r in rows
        if r.plan is not None and r.plan.within_query_range and r.quality is not None
        and not math.isnan(r.quality.ndcg_beyond)
    ]  # fmt: skip
    if not usable:
        return None

    def mean(r: PlanComparison) -> float:
        assert r.quality is not None
        return r.quality.ndcg_beyond

    def upper(r: PlanComparison) -> float:
        assert r.quality is not None
        high = r.quality.ndcg_beyond_ci[1]
        return mean(r) if math.isnan(high) else high

    best = max(usable, key=mean)
    assert best.quality is not None
    low = best.quality.ndcg_beyond_ci[0]
    floor = mean(best) if math.isnan(low) else low
    level = [r for r in usable if upper(r) >= floor]
    return min(level, key=lambda r: (r.plan.spent_epsilon if r.plan else math.inf, -mean(r)))
