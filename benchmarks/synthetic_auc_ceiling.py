"""What bounds link-prediction AUC from DP degrees: the degree-sum score on random 80/20 splits.

    OPENBLAS_NUM_THREADS=1 python benchmarks/synthetic_auc_ceiling.py ../shared/data/cora.cites \\
        --epsilon 1 --degree-share 0.87 --splits 8

Evaluation only. For each split (the evaluation's own ``split_edges``: held-out 20% of the real
edges against as many sampled non-edges), the pairs are scored by the sum of the two endpoints'
degrees in the TRAINING graph, taken: exactly (no privacy); with Laplace noise of scale
2 / (eps x degree share), as the generator's degree release; as the posterior mean and median of
each degree under the distribution deconvolved from the noisy values
(service.synthetic.deconvolve); and the noisy values' own multiset handed out in the order of
the noisy degrees shrunk towards their neighbours in the public node order
(service.synthetic.order_shrinkage, what the generator does). Also printed: the noisy degree sum
plus a bonus for pairs less than 5 apart in the public node order (an oracle use of the node
order). ``--shuffle-order`` numbers the nodes at random first: the control where the order
carries nothing.
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
from sklearn.metrics import roc_auc_score

from service.evaluation.synthetic import adjacency, split_edges
from service.graph.loader import load_edge_list
from service.synthetic.deconvolve import deconvolved_degrees
from service.synthetic.order_shrinkage import DEFAULT_HALF_WINDOW, order_shrunk_degrees
from service.synthetic.sampling import handed_out_by_rank


def posterior(noisy: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and median of each degree under the deconvolved prior."""
    support, counts = np.unique(np.round(deconvolved_degrees(noisy, scale, 1)), return_counts=True)
    weight = np.exp(-np.abs(noisy[:, None] - support[None, :]) / scale) * counts[None, :]
    mean = (weight * support).sum(axis=1) / weight.sum(axis=1)
    cdf = np.cumsum(weight, axis=1) / weight.sum(axis=1, keepdims=True)
    return mean, support[np.argmax(cdf >= 0.5, axis=1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--degree-share", type=float, default=0.87)
    parser.add_argument("--splits", type=int, default=8)
    parser.add_argument("--half-window", type=int, default=DEFAULT_HALF_WINDOW)
    parser.add_argument("--shuffle-order", action="store_true")
    args = parser.parse_args()
    graph = load_edge_list(args.graph)
    n = graph.n
    full = adjacency(*(x.astype(np.int64) for x in graph.edge_arrays()), n)
    u, v = (x.astype(np.int64) for x in sp.triu(full, 1).nonzero())
    scale = 2.0 / (args.epsilon * args.degree_share)
    rng = np.random.default_rng()
    if args.shuffle_order:
        relabel = rng.permutation(n)
        u, v = relabel[u], relabel[v]
    rows: dict[str, list[float]] = {}
    for _ in range(args.splits):
        split = split_edges((u, v), n, rng)
        train = adjacency(split.train[0], split.train[1], n)
        true = np.asarray(train.sum(axis=1)).ravel()
        noisy = true + rng.laplace(0.0, scale, n)
        mean, median = posterior(noisy, scale)
        shrunk, _ = order_shrunk_degrees(noisy, scale, args.half_window)
        floored = np.maximum(noisy, 1.0)
        by_order = handed_out_by_rank(floored, shrunk)
        p, q = split.pairs
        near = np.abs(p - q) < 5
        scores = {
            "true training degrees": true[p] + true[q],
            f"noisy (Laplace scale {scale:.3g})": noisy[p] + noisy[q],
            "posterior mean": mean[p] + mean[q],
            "posterior median": median[p] + median[q],
            "noisy values (floor 1), by their own rank": floored[p] + floored[q],
            "noisy values (floor 1), by order-shrunk rank": by_order[p] + by_order[q],
            "noisy + bonus for pairs < 5 ids apart (oracle)": noisy[p] + noisy[q] + 1e6 * near,
        }
        for name, score in scores.items():
            rows.setdefault(name, []).append(float(roc_auc_score(split.labels, score)))
    for name, values in rows.items():
        print(f"{name:50s} AUC {np.mean(values):.4f} ({min(values):.4f}-{max(values):.4f})")


if __name__ == "__main__":
    main()
