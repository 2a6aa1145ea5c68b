"""``evaluate``: ranking quality of every mechanism against exact PPR over random seeds.

Prints, per epsilon and mechanism, NDCG@k and Recall@k with 95% confidence intervals, the
same beyond the seed's neighbours, and the seed sample's size (evaluation.md). Progress goes
to stderr; ``--json`` prints the rows as a JSON list on stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from service.cli.arg_types import (
    non_negative_float,
    open_unit_float,
    positive_float,
    positive_int,
)
from service.cli.common import add_mechanism_arguments, print_json, print_table
from service.cli.evaluate_links import LINK_K, LINK_SEEDS
from service.cli.evaluate_links import add_arguments as add_link_arguments
from service.cli.evaluate_synthetic import add_arguments as add_synthetic_arguments
from service.cli.evaluate_synthetic import run_synthetic
from service.embeddings.parameters import DEFAULT_EMBEDDING_SIGMA, DEFAULT_K, EMBEDDING_FLOOR
from service.errors import InvalidParameter
from service.evaluation.options import (
    DEFAULT_ETA,
    DEFAULT_FRACTIONS,
    DEFAULT_POPULAR_EPSILON,
    DEFAULT_SPLITS,
    MECHANISMS,
    ROWS,
)
from service.mechanisms.parameters import EDGE_FLIPPING_MAX_NODES, PUSHFLOWCAP_SIGMA

if TYPE_CHECKING:
    from service.evaluation.runner import EvaluationRow


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="ranking quality of the mechanisms against exact PPR",
        description="Compare the private mechanisms and baselines with exact PPR on random "
        "seeds (degree >= 1): NDCG@k and Recall@k with the seed excluded, and beyond the "
        "seed's neighbours, as means with 95% t-intervals.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--graph", metavar="FILE", help="edge-list file")
    source.add_argument("--demo", action="store_true",
                        help="the built-in 10,000-node demo graph (no file needed)")  # fmt: skip
    parser.add_argument("--epsilon", type=positive_float, nargs="+", default=None,
                        metavar="E", help="per-query epsilon(s) (required)")  # fmt: skip
    parser.add_argument("--task", choices=["ranking", "links", "classification", "synthetic"],
                        default="ranking",
                        help="ranking quality (default), link prediction of hidden edges "
                        "(docs/ranking.md), node classification on embeddings "
                        "(docs/embeddings.md), or synthetic graphs "
                        "(docs/synthetic.md)")  # fmt: skip
    add_classification_arguments(parser)
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help=f"seeds to sample (default 20; links {LINK_SEEDS})")  # fmt: skip
    parser.add_argument("--k", type=positive_int, default=None,
                        help=f"ranking depth (default 100; links {LINK_K})")  # fmt: skip
    parser.add_argument("--delta", type=open_unit_float, default=None,
                        help="default: 1/|E|")  # fmt: skip
    add_mechanism_arguments(parser, eta=DEFAULT_ETA)
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS),
                        metavar="M", help=f"any of: {', '.join(MECHANISMS)}")  # fmt: skip
    parser.add_argument("--sigma", type=positive_float, default=PUSHFLOWCAP_SIGMA,
                        help="PushFlowCap's sensitivity parameter")  # fmt: skip
    parser.add_argument("--popular-epsilon", type=positive_float, default=DEFAULT_POPULAR_EPSILON,
                        metavar="EPS_D", help="epsilon of the one graph-wide DP degree release "
                        "behind 'popular' (not a per-query cost)")  # fmt: skip
    parser.add_argument("--max-flip-nodes", type=positive_int, default=EDGE_FLIPPING_MAX_NODES,
                        help="largest graph edge flipping runs on")  # fmt: skip
    parser.add_argument("--sample-seed", type=int, default=None,
                        help="seed of the seed sample (never of any noise)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="JSON rows on stdout")
    add_link_arguments(parser)
    add_synthetic_arguments(parser)
    parser.set_defaults(handler=run)


def add_classification_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--task classification")
    group.add_argument("--labels", metavar="FILE",
                       help="'node label' per line (multi-label ok; also the synthetic task's "
                       "node classification)")  # fmt: skip
    group.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), metavar="R",
                       help=f"any of: {', '.join(ROWS)}")  # fmt: skip
    group.add_argument("--dim", type=positive_int, default=DEFAULT_K, help="embedding dimension k")
    group.add_argument("--embedding-sigma", type=positive_float, nargs="+",
                       default=[DEFAULT_EMBEDDING_SIGMA], metavar="S",
                       help="DP-IE's PushFlowCap sigma(s); several make a sweep")  # fmt: skip
    group.add_argument("--embedding-floor", type=non_negative_float, nargs="+",
                       default=[EMBEDDING_FLOOR], metavar="F",
                       help="DP-IE's PushFlowCap floor(s) (default %(default)s; 0 is the "
                       "paper's Algorithm 2); several make a sweep")  # fmt: skip
    group.add_argument("--fractions", type=positive_float, nargs="+",
                       default=list(DEFAULT_FRACTIONS), help="training fractions")  # fmt: skip
    group.add_argument("--splits", type=positive_int, default=DEFAULT_SPLITS,
                       help="random splits per fraction")  # fmt: skip
    group.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                       help="threads for PushFlowCap and the classifier fits (default: every "
                       "core this process may use)")  # fmt: skip
    group.add_argument("--store-top", type=positive_int, default=1000,
                       help="entries a stored release keeps (PPR_REPLAY_STORE_TOP)")  # fmt: skip


def _progress(text: str) -> None:
    print(f"[evaluate] {text}", file=sys.stderr, flush=True)


def _cell(mean: float, ci: tuple[float, float]) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci[0]):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {(ci[1] - ci[0]) / 2:.3f}"


def _table(rows: list[EvaluationRow], k: int) -> None:
    headers = [
        "mechanism", "eps", f"NDCG@{k}", f"Recall@{k}",
        f"NDCG@{k} beyond", f"Recall@{k} beyond", "seeds",
    ]  # fmt: skip
    body = [
        [
            r.mechanism,
            f"{r.epsilon:g}",
            _cell(r.ndcg, r.ndcg_ci),
            _cell(r.recall, r.recall_ci),
            _cell(r.ndcg_beyond, r.ndcg_beyond_ci),
            _cell(r.recall_beyond, r.recall_beyond_ci),
            str(r.seeds),
        ]
        for r in rows
    ]
    print_table(headers, body)
    print(
        "(mean ± half-width of the 95% t-interval over seeds; 'beyond' excludes the seed "
        "and its neighbours from both rankings)"
    )


def run(args: argparse.Namespace) -> int:
    links = args.task == "links"
    if args.seeds is None:
        args.seeds = LINK_SEEDS if links else 20
    if args.k is None:
        args.k = LINK_K if links else 100
    if links:
        from service.cli.evaluate_links import run_links

        return run_links(args)
    if args.epsilon is None:
        raise InvalidParameter("epsilon", "give at least one --epsilon value")
    if args.task == "synthetic":
        if args.graph is None:
            raise InvalidParameter("graph", "--task synthetic needs --graph FILE")
        from service.graph.loader import load_edge_list

        return run_synthetic(args, load_edge_list(args.graph))
    if args.task == "classification":
        from service.cli.classification import run_classification

        return run_classification(args)
    import numpy as np

    from service.evaluation.runner import evaluate, validate_parameters

    validate_parameters(
        args.epsilon, args.seeds, args.k, args.eta, args.delta, args.beta, args.steps,
        args.mechanisms, args.sigma, args.popular_epsilon,
    )  # fmt: skip
    from service.config import MechanismSettings

    default_mechanism = MechanismSettings().default_mechanism.value
    if args.demo:
        from service.graph.demo import demo_graph

        graph = demo_graph()
    else:
        from service.graph.loader import load_edge_list

        graph = load_edge_list(args.graph)
    _progress(f"graph: {graph.n} nodes, {graph.m} edges")
    notes: list[str] = []
    rows = evaluate(
        graph,
        args.epsilon,
        seeds_count=args.seeds,
        k=args.k,
        eta=args.eta,
        delta=args.delta,
        beta=args.beta,
        steps=args.steps,
        mechanisms=args.mechanisms,
        mode=args.mode,
        rng=np.random.default_rng(args.sample_seed),
        sigma=args.sigma,
        popular_epsilon=args.popular_epsilon,
        edge_flipping_max_nodes=args.max_flip_nodes,
        progress=_progress,
        notes=notes,
        default_mechanism=default_mechanism,
    )
    if args.json:
        print_json([row.to_dict() for row in rows])
    else:
        _table(rows, args.k)
        for text in notes:
            print(f"note: {text}")
    return 0
