"""What a plan buys on a graph, measured two ways at the planned per-answer epsilon:

- ``ranking``: ``evaluate``'s runner (:func:`service.evaluation.runner.evaluate`): NDCG@k against
  exact PPR, overall (the seed excluded) and beyond the seed's neighbours;
- ``links``: ``evaluate --task links`` (:func:`service.evaluation.links.evaluate_links`):
  recall@k and NDCG@k of a seeded random 10% of the edges, hidden from the ranking, among each
  seed's non-friends (what a recommender is for);

means with 95% t-intervals over random seeds, with the plan's delta, mode, diffusion settings and
degree release epsilon.

:func:`compare_plans` plans every ranking the mode offers on the same schedule, each at its own
largest epsilon, so rankings are compared at what the budget really allows each of them, and
:func:`recommended` picks one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.errors import InvalidParameter
from service.evaluation.links import LinkRow, evaluate_links
from service.evaluation.options import DEFAULT_ETA
from service.evaluation.runner import EvaluationRow, evaluate
from service.graph.model import Graph
from service.mechanisms.registry import PERSONALIZED_ONLY, RankingMechanism
from service.planning.budget import BudgetPlan, Deployment, plan_budget
from service.privacy.modes import Mode

__all__ = [
    "PlanComparison",
    "Quality",
    "compare_plans",
    "plan_links",
    "plan_quality",
    "recommended",
]

#: How a plan's quality is measured.
Quality = Literal["ranking", "links"]


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


def _links(
    graph: Graph,
    plans: list[BudgetPlan],
    *,
    k: int,
    seeds: int,
    sample_seed: int | None,
    split_seed: int,
    eta: float,
    progress: Callable[[str], None] | None = None,
) -> dict[str, LinkRow]:
    """Each plan's link-prediction row at its own epsilon, on one split and one seed sample."""
    if not plans:
        return {}
    first = plans[0]
    own = {p.mechanism: p.epsilon for p in plans if p.epsilon is not None}
    degree_epsilon = next((p.degree_epsilon for p in plans if p.degree_epsilon), None)
    report = evaluate_links(
        graph,
        [],
        seeds=seeds,
        k=k,
        mechanisms=[p.mechanism for p in plans],
        mode=first.mode,
        beta=first.beta,
        steps=first.steps,
        eta=eta,
        delta=first.delta,
        popular_epsilon=degree_epsilon or Deployment().popular_epsilon,
        split_seed=split_seed,
        sample_seed=sample_seed,
        own_epsilons=own,
        progress=progress,
    )
    return {r.mechanism: r for r in report.rows if r.epsilon == own.get(r.mechanism)}


def plan_links(
    graph: Graph,
    plan: BudgetPlan,
    *,
    k: int = 20,
    seeds: int = 200,
    sample_seed: int | None = None,
    split_seed: int = 0,
    eta: float = DEFAULT_ETA,
    progress: Callable[[str], None] | None = None,
) -> LinkRow:
    """Recall@k and NDCG@k of hidden edges for ``plan``'s ranking at its per-answer epsilon."""
    rows = _links(graph, [plan], k=k, seeds=seeds, sample_seed=sample_seed,
                  split_seed=split_seed, eta=eta, progress=progress)  # fmt: skip
    return rows[plan.mechanism]


@dataclass(frozen=True)
class PlanComparison:
    """One ranking's plan on a shared schedule, its quality when measured, or why it has none."""

    mechanism: str
    plan: BudgetPlan | None
    quality: EvaluationRow | None = None
    links: LinkRow | None = None
    refused: str | None = None

    def score(self) -> tuple[float, tuple[float, float]] | None:
        """What :func:`recommended` compares: recall@k of hidden edges when measured, else
        NDCG@k beyond the neighbours; None when not measured."""
        if self.links is not None:
            return self.links.recall, self.links.recall_ci
        if self.quality is not None:
            return self.quality.ndcg_beyond, self.quality.ndcg_beyond_ci
        return None


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
    quality: Quality = "ranking",
    k: int = 20,
    seeds: int = 200,
    sample_seed: int | None = None,
    split_seed: int = 0,
    eta: float = DEFAULT_ETA,
) -> list[PlanComparison]:
    """Every ranking the mode offers planned on the same schedule (and measured on ``graph``
    with the same seed sample when given). A ranking that cannot fit is listed with the reason."""
    mode = Mode(mode)
    planned: list[tuple[str, BudgetPlan | None, str | None]] = []
    for name in RankingMechanism:
        if mode is Mode.EDGE and name in PERSONALIZED_ONLY:
            continue
        try:
            plan = plan_budget(
                cap_epsilon, days, answers_per_day, mechanism=name.value, mode=mode,
                delta=delta, graph_versions=graph_versions, deployment=deployment,
            )  # fmt: skip
        except InvalidParameter as exc:
            planned.append((name.value, None, exc.message))
            continue
        planned.append((name.value, plan, None))
    made = [p for _, p, _ in planned if p is not None]
    links: dict[str, LinkRow] = {}
    if graph is not None and quality == "links":
        links = _links(graph, made, k=k, seeds=seeds, sample_seed=sample_seed,
                       split_seed=split_seed, eta=eta)  # fmt: skip
    rows: list[PlanComparison] = []
    for label, made_plan, refused in planned:
        ranking = None
        if graph is not None and made_plan is not None and quality == "ranking":
            ranking = plan_quality(
                graph, made_plan, k=k, seeds=seeds, sample_seed=sample_seed, eta=eta
            )
        rows.append(PlanComparison(label, made_plan, ranking, links.get(label), refused))
    return rows


def recommended(rows: list[PlanComparison]) -> PlanComparison | None:
    """The ranking to use on this schedule, among the measured plans the service accepts
    (per-answer epsilon within its range): the best score (:meth:`PlanComparison.score`), or,
    among those level with it (95% intervals overlapping the best's), the one that spends the
    least of the cap. None when nothing was measured."""
    scored: list[tuple[PlanComparison, float, float, float]] = []
    for r in rows:
        measured = r.score()
        if r.plan is None or not r.plan.within_query_range or measured is None:
            continue
        mean, (low, high) = measured
        if math.isnan(mean):
            continue
        low = mean if math.isnan(low) else low
        high = mean if math.isnan(high) else high
        scored.append((r, mean, low, high))
    if not scored:
        return None
    best = max(scored, key=lambda s: s[1])
    level = [s for s in scored if s[3] >= best[2]]
    chosen = min(level, key=lambda s: (s[0].plan.spent_epsilon if s[0].plan else math.inf, -s[1]))
    return chosen[0]
