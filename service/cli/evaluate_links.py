"""``evaluate --task links``: how well each ranking finds the edges it was not shown.

Hides a seeded random 10% of the edges, serves every ranking from the rest, and prints recall@k
and NDCG@k of the hidden edges among each seed's non-friends, with 95% t-intervals over the
seeds (service.evaluation.links states the protocol). ``--plan CAP DAYS ANSWERS_PER_DAY
VERSIONS`` adds a row per private ranking at the per-answer epsilon the budget planner allows
it on that schedule. Progress goes to stderr; ``--json`` prints the report on stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from service.cli.arg_types import positive_float
from service.cli.common import print_json, print_table
from service.errors import InvalidParameter
from service.evaluation.options import LINK_ROWS

if TYPE_CHECKING:
    from service.evaluation.links import LinkReport

#: Defaults of the links task where they differ from the ranking task's.
LINK_SEEDS = 200
LINK_K = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--task links")
    group.add_argument("--link-rows", nargs="+", choices=LINK_ROWS, default=list(LINK_ROWS),
                       metavar="R", help=f"links task: any of {', '.join(LINK_ROWS)}")  # fmt: skip
    group.add_argument("--split-seed", type=int, default=0,
                       help="seed of the random 10%% of edges hidden (default 0)")  # fmt: skip
    group.add_argument(
        "--plan", nargs=4, type=positive_float, default=None,
        metavar=("CAP", "DAYS", "PER_DAY", "VERSIONS"),
        help="also measure each private ranking at the per-answer epsilon the budget planner "
        "allows it for this schedule (e.g. 1 365 1 4)",
    )  # fmt: skip


def _progress(text: str) -> None:
    print(f"[evaluate] {text}", file=sys.stderr, flush=True)


def _cell(mean: float, ci: tuple[float, float]) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci[0]):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {(ci[1] - ci[0]) / 2:.3f}"


def planned_epsilons(args: argparse.Namespace, rows: list[str]) -> dict[str, float]:
    """Each private ranking's largest per-answer epsilon on the ``--plan`` schedule (with this
    evaluation's diffusion settings and eps_d)."""
    from dataclasses import replace

    from service.config import MechanismSettings
    from service.planning.budget import Deployment, plan_budget

    cap, days, per_day, versions = args.plan
    for name, value in (("days", days), ("answers_per_day", per_day), ("versions", versions)):
        if not float(value).is_integer():
            raise InvalidParameter("plan", f"{name} must be a whole number, got {value:g}")
    deployment = replace(
        Deployment.of(MechanismSettings()),
        steps=args.steps, beta=args.beta, popular_epsilon=args.popular_epsilon,
    )  # fmt: skip
    found: dict[str, float] = {}
    for name in ("blended", "noisy_diffusion", "friends_of_friends", "common_neighbours"):
        if name not in rows and not ("default" in rows and name == deployment.default_mechanism):
            continue
        if args.mode.value == "edge" and name != "noisy_diffusion":
            continue
        plan = plan_budget(
            cap, int(days), int(per_day), mechanism=name, mode=args.mode, delta=args.delta,
            graph_versions=int(versions), deployment=deployment,
        )  # fmt: skip
        if plan.epsilon is not None:
            found[name] = plan.epsilon
            _progress(f"plan {cap:g} / {int(days)} days x {int(per_day)} / {int(versions)} "
                      f"versions: {name} at {plan.epsilon:.6g} per answer")  # fmt: skip
    return found


def _table(report: LinkReport, planned: dict[str, float]) -> None:
    k = report.k
    headers = ["mechanism", "eps", f"Recall@{k}", f"NDCG@{k}", "seeds"]
    body = []
    for r in report.rows:
        if r.epsilon is None:
            eps = "-"
        else:
            eps = f"{r.epsilon:g}"
            if planned.get(r.mechanism) == r.epsilon:
                eps += " (plan)"
        body.append([r.mechanism, eps, _cell(r.recall, r.recall_ci), _cell(r.ndcg, r.ndcg_ci),
                     str(r.seeds)])  # fmt: skip
    print_table(headers, body)
    print(
        f"(hidden: {report.hidden_edges} of {report.edges} edges, split seed "
        f"{report.split_seed}; {report.seeds} of {report.eligible_seeds} eligible seeds; "
        "recall and NDCG of a seed's hidden edges among its non-friends; mean ± half-width of "
        "the 95% t-interval over seeds)"
    )


def run_links(args: argparse.Namespace) -> int:
    from service.config import MechanismSettings
    from service.evaluation.links import evaluate_links

    if args.demo:
        from service.graph.demo import demo_graph

        graph = demo_graph()
    else:
        from service.graph.loader import load_edge_list

        graph = load_edge_list(args.graph)
    _progress(f"graph: {graph.n} nodes, {graph.m} edges")
    epsilons = list(args.epsilon or [])
    planned = planned_epsilons(args, args.link_rows) if args.plan is not None else {}
    if not epsilons and not planned:
        raise InvalidParameter("epsilon", "give at least one --epsilon value (or --plan)")
    report = evaluate_links(
        graph,
        epsilons,
        seeds=args.seeds,
        k=args.k,
        mechanisms=args.link_rows,
        mode=args.mode,
        beta=args.beta,
        steps=args.steps,
        eta=args.eta,
        delta=args.delta,
        sigma=args.sigma,
        popular_epsilon=args.popular_epsilon,
        split_seed=args.split_seed,
        sample_seed=args.sample_seed,
        own_epsilons=planned,
        default_mechanism=MechanismSettings().default_mechanism.value,
        progress=_progress,
    )
    if args.json:
        payload: dict[str, Any] = {
            "nodes": report.nodes, "edges": report.edges, "hidden_edges": report.hidden_edges,
            "split_seed": report.split_seed, "eligible_seeds": report.eligible_seeds,
            "seeds": report.seeds, "k": report.k, "planned_epsilons": planned,
            "rows": [r.to_dict() for r in report.rows], "notes": report.notes,
        }  # fmt: skip
        print_json(payload)
        return 0
    _table(report, planned)
    for text in report.notes:
        print(f"note: {text}")
    return 0
