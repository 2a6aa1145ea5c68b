"""``evaluate --task classification``: node classification on private embeddings.

Loads the graph and the labels file (one ``node label`` pair per line), computes every row of
:mod:`service.evaluation.embeddings` and prints Micro-/Macro-F1 (mean ± half-width of the 95%
t-interval over splits) per training fraction, with each row's graph-wide exposure. A bad labels
file (unreadable, malformed, unknown nodes, a single class) fails with one line, exit 2.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from service.cli.common import print_json, print_table
from service.errors import InvalidParameter
from service.evaluation.classification import FractionScore


def _progress(text: str) -> None:
    print(f"[evaluate] {text}", file=sys.stderr, flush=True)


def _cell(mean: float, ci: tuple[float, float]) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci[0]):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {(ci[1] - ci[0]) / 2:.3f}"


def _num(x: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def run_classification(args: argparse.Namespace) -> int:
    from service.embeddings.dp import check_k, check_sigma
    from service.evaluation.classification import load_labels
    from service.evaluation.embeddings import evaluate_embeddings
    from service.evaluation.runner import default_delta, validate_parameters

    if not args.labels:
        raise InvalidParameter("labels", "--task classification needs --labels FILE")
    check_k(args.dim)
    for fraction in args.fractions:
        if not 0.0 < fraction < 1.0:
            raise InvalidParameter("fractions", f"must be in (0, 1), got {fraction}")
    for sigma in args.embedding_sigma:
        check_sigma(sigma)
    validate_parameters(
        args.epsilon, 1, 1, args.eta, args.delta, args.beta, args.steps, ["random"], 1e-6,
        args.popular_epsilon,
    )  # fmt: skip
    if args.demo:
        from service.graph.demo import demo_graph

        graph = demo_graph()
    else:
        from service.graph.loader import load_edge_list

        graph = load_edge_list(args.graph)
    labels = load_labels(args.labels, graph)
    delta = args.delta if args.delta is not None else default_delta(graph)
    _progress(
        f"graph: {graph.n} nodes, {graph.m} edges; {labels.nodes.shape[0]} labelled nodes, "
        f"{len(labels.classes)} classes{' (multi-label)' if labels.multi_label else ''}"
    )
    rows = evaluate_embeddings(
        graph, labels, args.epsilon, rows=args.rows, k=args.dim, sigmas=args.embedding_sigma,
        floors=args.embedding_floor, fractions=args.fractions, splits=args.splits, delta=delta,
        store_top=args.store_top,
        beta=args.beta, steps=args.steps, eta=args.eta, popular_epsilon=args.popular_epsilon,
        rng=np.random.default_rng(args.sample_seed), progress=_progress, n_jobs=args.jobs,
        estimate=True,
    )  # fmt: skip
    if args.json:
        print_json([row.to_dict() for row in rows])
        return 0
    headers = ["row", "eps", "sigma"]
    for fraction in args.fractions:
        headers += [f"Mi-F1 {fraction:.0%}", f"Ma-F1 {fraction:.0%}"]
    headers += [f"exposure eps (delta {delta:.0e})", "pure eps", "note"]
    body = []
    for row in rows:
        cells = [row.row, _num(row.epsilon, "{:g}"), _num(row.sigma, "{:g}")]
        score: FractionScore
        for score in row.scores:
            cells += [_cell(score.micro, score.micro_ci), _cell(score.macro, score.macro_ci)]
        exposure = "n/a" if row.note.startswith("joint") else _num(row.exposure_epsilon)
        note = row.note
        if "floor" in row.extra:
            note = f"{note} floor {row.extra['floor']:g}".strip()
        if "mean_support" in row.extra:
            note = f"{note} support {row.extra['mean_support']:.1f}".strip()
        if "top_vs_full_l1_relative" in row.extra:
            note = f"{note} (top vs full: {row.extra['top_vs_full_l1_relative']:.3f} rel. l1)"
        pure = "n/a" if row.note.startswith("joint") else _num(row.exposure_pure)
        body.append([*cells, exposure, pure, note])
    print_table(headers, body)
    print(
        f"(mean ± half-width of the 95% t-interval over {args.splits} splits; exposure: the "
        f"graph-wide cost of releasing all {labels.nodes.shape[0]} labelled nodes' embeddings; "
        "support: mean number of non-seed nodes with n p_v > 1 in the capped PPR)"
    )
    return 0
