"""``plan``: how large each answer may be for a schedule of fresh answers to fit a cap.

Prints the largest per-answer epsilon that fits (the ranking's charged curve composed
days x answers-per-day times, plus its degree releases, one per graph version, converted at
delta; rounded down), the composed curve as a table of orders, and with ``--graph`` the ranking
quality at that epsilon (``evaluate``'s NDCG@k, overall and beyond the seed's neighbours, with
95% intervals over the seeds). ``--compare`` plans every ranking of the mode on the same
schedule. The deployment's settings (``PPR_STEPS``, ``PPR_BETA``, ``PPR_POPULAR_EPSILON``,
``PPR_EPSILON_MIN``/``_MAX``, ``PPR_DEFAULT_MECHANISM``, ``PPR_DEFAULT_DELTA``) are read from
the environment, as the service reads them.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from service.bounds import PLAN_ANSWERS_PER_DAY_MAX, PLAN_DAYS_MAX, PLAN_GRAPH_VERSIONS_MAX
from service.cli.arg_types import budget_delta, cap_epsilon, positive_float, positive_int
from service.cli.common import print_json, print_table
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode

if TYPE_CHECKING:
    from service.evaluation.links import LinkRow
    from service.evaluation.runner import EvaluationRow
    from service.planning.budget import BudgetPlan
    from service.planning.quality import PlanComparison


def _bounded(high: int) -> Any:
    """An integer in [1, ``high``]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [1, {high}], got {text}")
        return value

    return parse


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="the per-answer epsilon a schedule of answers allows under a cap",
        description="Plan a budget over time: the largest per-answer epsilon for DAYS x "
        "ANSWERS_PER_DAY fresh answers of a ranking to fit the cap (composed under RDP with the "
        "curves the service charges, the degree release counted once per graph version for "
        "blended and popular; rounded down, so the plan never overspends), the composed curve, "
        "and with --graph the ranking quality that epsilon buys.",
    )
    parser.add_argument("--cap", type=cap_epsilon, required=True, metavar="C",
                        help="the account's cap epsilon")  # fmt: skip
    parser.add_argument("--days", type=_bounded(PLAN_DAYS_MAX), required=True,
                        metavar="D", help="days the budget must last")  # fmt: skip
    parser.add_argument("--answers-per-day", type=_bounded(PLAN_ANSWERS_PER_DAY_MAX),
                        required=True, metavar="A",
                        help="fresh (charged) answers per day; replays are free")  # fmt: skip
    names = [m.value for m in RankingMechanism]
    parser.add_argument(
        "--mechanism", choices=names, default=None, metavar="M",
        help="the ranking (default: PPR_DEFAULT_MECHANISM, resolved for the mode); one of: "
        + ", ".join(names),
    )  # fmt: skip
    parser.add_argument("--mode", type=Mode, choices=list(Mode), default=Mode.PERSONALIZED,
                        help="privacy model")  # fmt: skip
    parser.add_argument(
        "--delta", type=budget_delta, default=None,
        help="the account's delta (default: new accounts', PPR_DEFAULT_DELTA)",
    )  # fmt: skip
    parser.add_argument(
        "--graph-versions", type=_bounded(PLAN_GRAPH_VERSIONS_MAX), default=1, metavar="V",
        help="graph versions the answers span (each charges the degree release once for "
        "blended and popular; default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--popular-epsilon", type=positive_float, default=None, metavar="EPS_D",
        help="eps_d of each degree release (default: PPR_POPULAR_EPSILON)",
    )  # fmt: skip
    parser.add_argument("--compare", action="store_true",
                        help="plan every ranking of the mode on the same schedule")  # fmt: skip
    quality = parser.add_argument_group("expected quality (with --graph)")
    quality.add_argument("--graph", metavar="FILE", default=None, help="edge-list file")
    quality.add_argument("--k", type=positive_int, default=20, help="ranking depth")
    quality.add_argument("--seeds", type=positive_int, default=200, help="seeds to sample")
    quality.add_argument("--sample-seed", type=int, default=None,
                         help="seed of the seed sample (never of any noise)")  # fmt: skip
    quality.add_argument(
        "--quality", choices=["ranking", "links"], default="ranking",
        help="ranking: NDCG@k against exact PPR, overall and beyond the neighbours (default); "
        "links: recall@k and NDCG@k of a hidden random 10%% of the edges (evaluate --task links)",
    )  # fmt: skip
    quality.add_argument("--split-seed", type=int, default=0,
                         help="--quality links: seed of the hidden edges (default 0)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.set_defaults(handler=run)


def _progress(text: str) -> None:
    if not text.startswith("seed "):
        print(f"[plan] {text}", file=sys.stderr, flush=True)


def _cell(mean: float, ci: tuple[float, float]) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci[0]):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {(ci[1] - ci[0]) / 2:.3f}"


def _quality_dict(row: EvaluationRow, k: int) -> dict[str, Any]:
    data = row.to_dict()
    return {
        "k": k,
        "seeds": row.seeds,
        "ndcg": data["ndcg"],
        "ndcg_ci": data["ndcg_ci"],
        "ndcg_beyond": data["ndcg_beyond"],
        "ndcg_beyond_ci": data["ndcg_beyond_ci"],
    }


def _links_dict(row: LinkRow, k: int) -> dict[str, Any]:
    data = row.to_dict()
    return {"k": k, "seeds": row.seeds, "recall": data["recall"], "recall_ci": data["recall_ci"],
            "ndcg": data["ndcg"], "ndcg_ci": data["ndcg_ci"]}  # fmt: skip


def _print_plan(plan: BudgetPlan) -> None:
    print(f"plan: {plan.mechanism}, {plan.mode} mode, cap {plan.cap_epsilon:g} at delta "
          f"{plan.delta:g}")  # fmt: skip
    print(f"schedule: {plan.days} days x {plan.answers_per_day} answers/day = {plan.answers} "
          f"fresh answers, over {plan.graph_versions} graph version(s)")  # fmt: skip
    if plan.epsilon is None:
        print("largest per-answer epsilon: none charged per answer")
    else:
        print(f"largest per-answer epsilon: {plan.epsilon:.6g} (rounded down; each answer "
              f"states epsilon {plan.answer_epsilon:.6g})")  # fmt: skip
    degrees = ""
    if plan.degree_releases:
        degrees = (f" (the {plan.degree_releases} degree release(s) alone: "
                   f"{plan.degrees_spent_epsilon:.6g})")  # fmt: skip
    print(f"composed spend: {plan.spent_epsilon:.6g} of cap {plan.cap_epsilon:g}{degrees}")
    verdict = "ok" if plan.within_query_range else "OUTSIDE"
    print(f"query range: {verdict} [PPR_EPSILON_MIN {plan.epsilon_min:g}, "
          f"PPR_EPSILON_MAX {plan.epsilon_max:g}]")  # fmt: skip
    print()
    print("composed curve (RDP summed over every answer and degree release; epsilon at delta = "
          "RDP + ln(1 - 1/order) - ln(delta order)/(order - 1), the accountant takes the "
          "smallest, marked *):")  # fmt: skip
    rows = [
        [
            "inf (pure)" if math.isinf(r.order) else f"{r.order:.6g}",
            f"{r.rdp:.6g}",
            f"{r.epsilon:.6g}" + (" *" if r.best else ""),
        ]
        for r in plan.table
    ]
    print_table(["order", "RDP", "epsilon"], rows)
    for note in plan.notes:
        print(f"note: {note}")


def _print_links(row: LinkRow, k: int, graph_label: str) -> None:
    print()
    print(f"expected link prediction on {graph_label}, {row.seeds} seeds, k {k}: a hidden random "
          "10% of the edges, ranked among each seed's non-friends (mean ± 95% t-interval "
          "half-width over seeds):")  # fmt: skip
    print(f"  Recall@{k} of hidden edges: {_cell(row.recall, row.recall_ci)}")
    print(f"  NDCG@{k} of hidden edges:   {_cell(row.ndcg, row.ndcg_ci)}")


def _print_quality(row: EvaluationRow, k: int, graph_label: str) -> None:
    print()
    print(f"expected quality on {graph_label}, {row.seeds} seeds, k {k} (mean ± 95% t-interval "
          "half-width over seeds):")  # fmt: skip
    print(f"  NDCG@{k} overall (seed excluded):      {_cell(row.ndcg, row.ndcg_ci)}")
    print(f"  NDCG@{k} beyond the seed's neighbours: "
          f"{_cell(row.ndcg_beyond, row.ndcg_beyond_ci)}")  # fmt: skip


def _print_comparison(rows: list[PlanComparison], k: int, best: PlanComparison | None) -> None:
    headers = ["mechanism", "per-answer eps", "composed", "in query range"]
    ranking = any(r.quality is not None for r in rows)
    links = any(r.links is not None for r in rows)
    if ranking:
        headers += [f"NDCG@{k}", f"NDCG@{k} beyond"]
    if links:
        headers += [f"Recall@{k} hidden", f"NDCG@{k} hidden"]
    extra = 2 if ranking or links else 0
    body = []
    for r in rows:
        if r.plan is None:
            body.append([r.mechanism, "does not fit", "-", "-"] + ["-"] * extra)
            continue
        p = r.plan
        line = [
            r.mechanism,
            "none (free)" if p.epsilon is None else f"{p.epsilon:.6g}",
            f"{p.spent_epsilon:.6g}",
            "yes" if p.within_query_range else "no",
        ]
        if ranking:
            q = r.quality
            if q is None:
                line += ["-", "-"]
            else:
                line += [_cell(q.ndcg, q.ndcg_ci), _cell(q.ndcg_beyond, q.ndcg_beyond_ci)]
        if links:
            h = r.links
            line += (
                ["-", "-"]
                if h is None
                else [_cell(h.recall, h.recall_ci), _cell(h.ndcg, h.ndcg_ci)]
            )
        body.append(line)
    print_table(headers, body)
    for r in rows:
        if r.refused:
            print(f"note: {r.mechanism}: {r.refused}")
    if best is not None:
        measure = f"recall@{k} of hidden edges" if links else f"NDCG@{k} beyond the neighbours"
        print(f"recommended: {best.mechanism} (the best {measure} among the rankings whose "
              "planned epsilon the service accepts or, among those level with it (95% "
              "intervals overlapping), the one that spends the least)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from service.config import MechanismSettings
    from service.planning.budget import Deployment, plan_budget

    deployment = Deployment.of(MechanismSettings())
    if args.popular_epsilon is not None:
        deployment = replace(deployment, popular_epsilon=args.popular_epsilon)
    schedule: dict[str, Any] = {
        "mode": args.mode, "delta": args.delta, "graph_versions": args.graph_versions,
        "deployment": deployment,
    }  # fmt: skip
    # the plan first: bad input fails before any graph is read
    plan = plan_budget(args.cap, args.days, args.answers_per_day, mechanism=args.mechanism,
                       **schedule)  # fmt: skip
    graph = None
    if args.graph is not None:
        from service.graph.loader import load_edge_list

        graph = load_edge_list(args.graph)
        _progress(f"graph: {graph.n} nodes, {graph.m} edges")
    if args.compare:
        from service.planning.quality import compare_plans, recommended

        rows = compare_plans(
            args.cap, args.days, args.answers_per_day, graph=graph, quality=args.quality,
            k=args.k, seeds=args.seeds, sample_seed=args.sample_seed, split_seed=args.split_seed,
            **schedule,
        )  # fmt: skip
        best = recommended(rows)
        if args.json:
            print_json({
                "plans": [
                    {"mechanism": r.mechanism,
                     "plan": None if r.plan is None else r.plan.to_dict(),
                     "quality": None if r.quality is None else _quality_dict(r.quality, args.k),
                     "links": None if r.links is None else _links_dict(r.links, args.k),
                     "refused": r.refused}
                    for r in rows
                ],
                "recommended": None if best is None else best.mechanism,
            })  # fmt: skip
        else:
            _print_comparison(rows, args.k, best)
        return 0
    quality = links = None
    if graph is not None and args.quality == "links":
        from service.planning.quality import plan_links

        links = plan_links(graph, plan, k=args.k, seeds=args.seeds, sample_seed=args.sample_seed,
                           split_seed=args.split_seed, progress=_progress)  # fmt: skip
    elif graph is not None:
        from service.planning.quality import plan_quality

        quality = plan_quality(graph, plan, k=args.k, seeds=args.seeds,
                               sample_seed=args.sample_seed, progress=_progress)  # fmt: skip
    if args.json:
        payload = plan.to_dict()
        payload["quality"] = None if quality is None else _quality_dict(quality, args.k)
        payload["links"] = None if links is None else _links_dict(links, args.k)
        print_json(payload)
        return 0
    _print_plan(plan)
    label = f"{args.graph} ({graph.n if graph else 0} nodes)"
    if quality is not None:
        _print_quality(quality, args.k, label)
    if links is not None:
        _print_links(links, args.k, label)
    return 0
