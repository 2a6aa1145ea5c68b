"""``query``: one private PPR release for a seed, from the command line (no ledger)."""

from __future__ import annotations

import argparse
from typing import Any

from service.cli.arg_types import open_unit_float, positive_float, positive_int
from service.cli.common import (
    add_graph_argument,
    add_mechanism_arguments,
    load_graph,
    print_json,
    print_table,
)
from service.errors import InvalidParameter
from service.privacy.modes import Mode


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "query",
        help="one private PPR ranking for a seed",
        description="Release one noisy-diffusion ranking for SEED. Not charged to any ledger: "
        "an operator's tool for trying parameters.",
    )
    add_graph_argument(parser)
    parser.add_argument("--seed", required=True, help="external node id of the seed")
    parser.add_argument("--epsilon", type=positive_float, required=True)
    parser.add_argument("--delta", type=open_unit_float, default=None,
                        help="default: PPR_DEFAULT_DELTA (1e-6)")  # fmt: skip
    parser.add_argument("--k", type=positive_int, default=20, help="results to show")
    parser.add_argument("--exclude-neighbors", action="store_true",
                        help="drop the seed's neighbours (personalized mode only)")  # fmt: skip
    add_mechanism_arguments(parser)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from service.config import MechanismSettings
    from service.mechanisms.diffusion import noisy_diffusion
    from service.mechanisms.postprocess import ranked_results, score_grid
    from service.mechanisms.registry import RankingMechanism
    from service.privacy.calibration import plan_diffusion

    if args.exclude_neighbors and args.mode is not Mode.PERSONALIZED:
        raise InvalidParameter(
            "exclude-neighbors", "uses the seed's own edges, which edge mode protects"
        )
    graph = load_graph(args.graph)
    seed = graph.index_of(args.seed)
    delta = args.delta if args.delta is not None else MechanismSettings().account_delta
    plan = plan_diffusion(args.epsilon, delta, args.steps, args.beta, args.eta, args.mode)
    scores = noisy_diffusion(graph, seed, plan.config)
    config = plan.config
    grid = score_grid(config.noise_scale)
    results = ranked_results(
        graph, seed, scores, args.k, grid=grid, exclude_neighbors=args.exclude_neighbors
    )
    payload = {
        "node": args.seed,
        "graph_version": graph.version,
        "results": [{"node": r.node, "score": r.score} for r in results],
        "mechanism": {
            "name": RankingMechanism.NOISY_DIFFUSION.value,
            "mode": config.mode.value,
            "epsilon": plan.epsilon,
            "delta": plan.delta,
            "beta": config.beta,
            "steps": config.steps,
            "noisy_steps": config.noisy_steps,
            "eta": config.eta,
            "noise_scale": config.noise_scale,
            "score_grid": grid,
        },
    }
    if args.json:
        print_json(payload)
    else:
        print_table(
            ["rank", "node", "score"],
            [[str(i + 1), r.node, f"{r.score:.4g}"] for i, r in enumerate(results)],
        )
    return 0
