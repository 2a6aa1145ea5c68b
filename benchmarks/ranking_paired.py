"""Paired comparison of the rankings beyond the seed's neighbours (NDCG@k against exact PPR).

    python benchmarks/ranking_paired.py ../shared/data/email-Eu-core.txt --seeds 80
    python benchmarks/ranking_paired.py gen:5000:60000:0.5:0.05 --seeds 60

A graph is an edge-list file or ``gen:NODES:EDGES:MIXING:CLOSURE`` (``generate_graph`` with
seed 1). For every sampled seed and epsilon, ``popular`` (one degree release for the run),
``common_neighbours`` and ``blended`` are scored on the same seed, so the printed differences
``blended - best baseline`` (mean and 95% half-width over seeds) do not carry the seed-to-seed
spread that the per-mechanism intervals of ``evaluate`` do. Noise comes from OS entropy: runs
differ within those intervals. Evaluation only (not the serving path).
"""

from __future__ import annotations

import argparse

import numpy as np

from service.evaluation.metrics import ndcg_at_k, private_ranking
from service.evaluation.runner import sample_seeds
from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.mechanisms.blended import blend
from service.mechanisms.common_neighbours import common_neighbour_counts
from service.mechanisms.exact import exact_ppr
from service.mechanisms.randomness import fresh_generator


def _graph(spec: str) -> Graph:
    if spec.startswith("gen:"):
        _, nodes, edges, mixing, closure = spec.split(":")
        return generate_graph(
            int(nodes), int(edges), 1, mixing=float(mixing), closure=float(closure)
        )
    return load_edge_list(spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph")
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    parser.add_argument("--popular-epsilon", type=float, default=0.1)
    parser.add_argument("--beta", type=float, default=0.8)
    parser.add_argument("--sample-seed", type=int, default=99)
    args = parser.parse_args()

    graph = _graph(args.graph)
    noise = fresh_generator()
    b_d = 2.0 / args.popular_epsilon
    degrees = graph.degrees + noise.laplace(0.0, b_d, graph.n)
    seeds = sample_seeds(graph, args.seeds, np.random.default_rng(args.sample_seed))
    names = ("popular", "common_neighbours", "blended")
    scores: dict[tuple[str, float], list[float]] = {}
    for seed_value in seeds:
        seed = int(seed_value)
        exact = exact_ppr(graph, seed, args.beta)
        beyond = np.concatenate([[seed], graph.neighbors(seed)]).astype(np.int64)
        counts = common_neighbour_counts(graph, seed)
        for eps in args.epsilon:
            b = 2.0 / eps
            noisy = counts + noise.laplace(0.0, b, graph.n)
            ranked = {
                "popular": degrees,
                "common_neighbours": noisy,
                "blended": blend(graph, seed, noisy, degrees, b, b_d).scores,
            }
            for name in names:
                top = private_ranking(ranked[name], args.k, beyond)
                scores.setdefault((name, eps), []).append(ndcg_at_k(top, exact, args.k, beyond))
    print(f"{args.graph}: {graph.n} nodes, {graph.m} edges, {len(seeds)} seeds, k {args.k}")
    print("eps    popular  common_n  blended  blended - best baseline")
    for eps in args.epsilon:
        values = {name: np.array(scores[(name, eps)]) for name in names}
        best = max(("popular", "common_neighbours"), key=lambda n: np.nanmean(values[n]))
        diff = values["blended"] - values[best]
        diff = diff[~np.isnan(diff)]
        half = 1.96 * diff.std(ddof=1) / np.sqrt(diff.shape[0]) if diff.shape[0] > 1 else 0.0
        means = "  ".join(f"{np.nanmean(values[n]):7.3f}" for n in names)
        print(f"{eps:<5g}  {means}  {diff.mean():+.3f} ± {half:.3f} (vs {best})")


if __name__ == "__main__":
    main()
