"""What storing only the top entries of a release (``PPR_REPLAY_STORE_TOP``) does to its free
embedding, and how many nodes the noise alone lifts above 1/n.

For random seeds (degree >= 1) of a graph, one noisy diffusion release per seed and eps (the
service's calibration: beta 0.8, K 100, eta 1e-7, delta min(1e-6, 1/|E|)), its free embedding
from the full vector and from the top ``--top`` entries (negatives clipped, k = 256, one salt):
the mean relative l1 change ||w_full - w_top||_1 / ||w_full||_1, the mean cosine between them,
and the mean number of entries with n x_v > 1 (the only ones that reach the embedding).

    nice -n 15 .venv/bin/python benchmarks/embedding_store_top.py \\
        --graph ../shared/data/facebook_combined.txt --epsilon 0.5 1 5 --top 100 1000 --seeds 20
"""

from __future__ import annotations

import argparse

import numpy as np

from service.embeddings.free import free_embedding, stored_top
from service.embeddings.hashing import embedding_hashes, new_salt
from service.evaluation.runner import default_delta, sample_seeds
from service.graph.loader import load_edge_list
from service.mechanisms.diffusion import noisy_diffusion
from service.mechanisms.randomness import fresh_generator
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0])
    parser.add_argument("--top", type=int, nargs="+", default=[1000])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--mode", type=Mode, default=Mode.EDGE)
    args = parser.parse_args()
    graph = load_edge_list(args.graph)
    hashes = embedding_hashes(graph.node_ids, new_salt(), 256)
    seeds = sample_seeds(graph, args.seeds, np.random.default_rng(0))
    delta = default_delta(graph)
    print(f"graph n={graph.n} m={graph.m} mode={args.mode.value} seeds={len(seeds)}")
    for eps in args.epsilon:
        config = plan_diffusion(eps, delta, 100, 0.8, 1e-7, args.mode).config
        released = [noisy_diffusion(graph, int(s), config, rng=fresh_generator()) for s in seeds]
        above = np.mean([int((x * graph.n > 1).sum()) for x in released])
        full = [free_embedding(x, hashes) for x in released]
        for top in args.top:
            cut = [free_embedding(stored_top(x, top), hashes) for x in released]
            rel = np.mean([np.abs(a - b).sum() / max(np.abs(a).sum(), 1e-300)
                           for a, b in zip(full, cut, strict=True)])  # fmt: skip
            cos = np.mean([float(a @ b) / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300)
                           for a, b in zip(full, cut, strict=True)])  # fmt: skip
            print(f"eps={eps:g} top={top}: entries n x_v > 1: {above:.1f}; "
                  f"relative l1 change {rel:.3f}; cosine {cos:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
