"""Paired comparison of the rankings beyond the seed's neighbours (NDCG@k against exact PPR).

    python benchmarks/ranking_paired.py ../shared/data/email-Eu-core.txt --seeds 80
    python benchmarks/ranking_paired.py gen:5000:60000:0.5:0.05 --seeds 60

A graph is an edge-list file or ``gen:NODES:EDGES:MIXING:CLOSURE`` (``generate_graph`` with
seed 1). For every sampled seed and epsilon, every mechanism is scored on the same seed:

- the baselines ``noisy_diffusion`` (the spec's Mechanism 1: beta 0.8, K 100, eta 1e-7,
  delta min(1e-6, 1/|E|), as ``evaluate``), ``popular`` (one degree release for the run) and
  ``common_neighbours`` (Lap(2/eps) on every count);
- ``friends_of_friends`` (the two-scale counts: Lap(1/eps) on the candidates, Lap(2/eps) on
  the friends), ``blended`` (the two-scale counts blended with the degrees) and
  ``blended_one_scale`` (the same blend of one-scale counts: an earlier default).

The printed differences ``X - best baseline`` (the baseline with the best mean at that eps;
mean and 95% half-width over seeds) do not carry the seed-to-seed spread that the
per-mechanism intervals of ``evaluate`` do. Noise comes from OS entropy: runs differ within
those intervals. Evaluation only (not the serving path).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from service.evaluation.metrics import ndcg_at_k, private_ranking
from service.evaluation.runner import DEFAULT_ETA, default_delta, sample_seeds
from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.mechanisms.blended import blend
from service.mechanisms.common_neighbours import common_neighbour_counts, count_noise_scales
from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
from service.mechanisms.exact import exact_ppr
from service.mechanisms.friends_of_friends import friends_first
from service.mechanisms.randomness import fresh_generator
from service.privacy.calibration import plan_diffusion
from service.privacy.laplace import plan_two_scale
from service.privacy.modes import Mode

BASELINES = ("noisy_diffusion", "popular", "common_neighbours")
CONTENDERS = ("friends_of_friends", "blended", "blended_one_scale")


def _graph(spec: str) -> Graph:
    if spec.startswith("gen:"):
        _, nodes, edges, mixing, closure = spec.split(":")
        return generate_graph(
            int(nodes), int(edges), 1, mixing=float(mixing), closure=float(closure)
        )
    return load_edge_list(spec)


def _half_width(x: np.ndarray) -> float:
    return float(1.96 * x.std(ddof=1) / np.sqrt(x.shape[0])) if x.shape[0] > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("graph")
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    parser.add_argument("--popular-epsilon", type=float, default=0.1)
    parser.add_argument("--beta", type=float, default=0.8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sample-seed", type=int, default=99)
    parser.add_argument(
        "--no-diffusion", action="store_true", help="leave noisy_diffusion out (it is slow)"
    )
    args = parser.parse_args()

    graph = _graph(args.graph)
    noise = fresh_generator()
    b_d = 2.0 / args.popular_epsilon
    degrees = graph.degrees + noise.laplace(0.0, b_d, graph.n)
    seeds = sample_seeds(graph, args.seeds, np.random.default_rng(args.sample_seed))
    baselines = [b for b in BASELINES if not (args.no_diffusion and b == "noisy_diffusion")]
    names = [*baselines, *CONTENDERS]
    delta = default_delta(graph)
    mode = Mode.PERSONALIZED
    diffusion = {
        eps: plan_diffusion(eps, delta, args.steps, args.beta, DEFAULT_ETA, mode)
        for eps in args.epsilon
    }
    scores: dict[tuple[str, float], list[float]] = {}
    for number, seed_value in enumerate(seeds, start=1):
        seed = int(seed_value)
        exact = exact_ppr(graph, seed, args.beta)
        beyond = np.concatenate([[seed], graph.neighbors(seed)]).astype(np.int64)
        counts = common_neighbour_counts(graph, seed)
        prefixes: dict[int, np.ndarray] = {}
        for eps in args.epsilon:
            two = plan_two_scale(eps)
            one_scale = counts + noise.laplace(0.0, two.friend_scale, graph.n)
            scales = count_noise_scales(graph, seed, two)
            two_scale = counts + noise.laplace(0.0, 1.0, graph.n) * scales
            two_scale[seed] = 0.0
            ranked = {
                "popular": degrees,
                "common_neighbours": one_scale,
                "friends_of_friends": friends_first(graph, seed, two_scale),
                "blended": blend(graph, seed, two_scale, degrees, two.candidate_scale, b_d).scores,
                "blended_one_scale": blend(
                    graph, seed, one_scale, degrees, two.friend_scale, b_d
                ).scores,
            }
            if "noisy_diffusion" in baselines:
                config = diffusion[eps].config
                m = config.noise_free_steps
                if m not in prefixes:
                    prefixes[m] = noise_free_prefix(graph, seed, mode, args.beta, DEFAULT_ETA, m)
                ranked["noisy_diffusion"] = noisy_diffusion(
                    graph, seed, config, rng=fresh_generator(), prefix=prefixes[m]
                )
            for name in names:
                top = private_ranking(ranked[name], args.k, beyond)
                scores.setdefault((name, eps), []).append(ndcg_at_k(top, exact, args.k, beyond))
        print(f"seed {number}/{len(seeds)}", file=sys.stderr, end="\r")
    print(f"{args.graph}: {graph.n} nodes, {graph.m} edges, {len(seeds)} seeds, k {args.k}")
    print("eps    " + "  ".join(f"{name:>18}" for name in names))
    for eps in args.epsilon:
        values = {name: np.array(scores[(name, eps)]) for name in names}
        print(f"{eps:<5g}  " + "  ".join(f"{np.nanmean(values[n]):18.3f}" for n in names))
    print("paired: contender - best baseline (mean ± 95% half-width over seeds)")
    for eps in args.epsilon:
        values = {name: np.array(scores[(name, eps)]) for name in names}
        best = max(baselines, key=lambda n: float(np.nanmean(values[n])))
        parts = []
        for name in CONTENDERS:
            diff = values[name] - values[best]
            diff = diff[~np.isnan(diff)]
            parts.append(f"{name} {diff.mean():+.3f} ± {_half_width(diff):.3f}")
        print(f"{eps:<5g}  vs {best}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
