"""Where a sparse graph's paths are long: ball sizes around hubs, and the anchored model's sweep.

    OPENBLAS_NUM_THREADS=1 python benchmarks/hub_neighbourhoods.py ../shared/data/cora.cites \\
        --p 0 0.6 0.9 1 --anchor-factor 4

Evaluation only (it reads the real graph exactly; nothing here is a release). Printed:

1. the mean number of nodes within distance r = 1..6 of a node, by degree class (>= 20, 4-19,
   <= 3), for the real graph and for a configuration model on its exact degrees;
2. the anchored configuration model (service.synthetic.anchors) on the exact degrees, for each
   closure p: edges, triangles, the truncated triangle count (D = 10, one random priority
   order, the statistic the generator releases) and the exact characteristic path length of the
   largest component, next to the real graph's.
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from service.evaluation.synthetic import adjacency, structure
from service.graph.loader import load_edge_list
from service.synthetic.anchors import anchor_threshold, anchored_configuration
from service.synthetic.sampling import block_configuration
from service.synthetic.triangles import truncated_triangles

CLASSES = (("degree >= 20", 20, None), ("degree 4-19", 4, 19), ("degree <= 3", 1, 3))


def ball_sizes(a: sp.csr_matrix, degrees: np.ndarray, radii: int = 6) -> dict[str, list[float]]:
    dist = shortest_path(a, directed=False, unweighted=True)
    out = {}
    for name, low, high in CLASSES:
        chosen = (degrees >= low) & (degrees <= (high if high is not None else np.inf))
        rows = dist[chosen]
        out[name] = [float(np.mean(np.sum(rows <= r, axis=1))) for r in range(1, radii + 1)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph")
    parser.add_argument("--p", type=float, nargs="*", default=[0.0, 0.6, 0.9, 1.0])
    parser.add_argument("--anchor-factor", type=float, default=4.0)
    args = parser.parse_args()
    graph = load_edge_list(args.graph)
    u, v = (x.astype(np.int64) for x in graph.edge_arrays())
    n = graph.n
    real = adjacency(u, v, n)
    degrees = np.asarray(real.sum(axis=1)).ravel().astype(np.int64)
    rng = np.random.default_rng()
    config = adjacency(
        *block_configuration(degrees, np.zeros(n, np.int64), np.ones((1, 1)), rng), n
    )
    print("nodes within distance r = 1..6 (mean by degree class)")
    for label, a in (("real", real), ("configuration model", config)):
        for name, sizes in ball_sizes(a, degrees).items():
            print(f"  {label:20s} {name:13s} " + " ".join(f"{x:8.1f}" for x in sizes))
    priority = rng.permutation(n)
    threshold = anchor_threshold(degrees, args.anchor_factor)
    print(f"anchored model: anchors have degree >= {threshold} ({np.sum(degrees >= threshold)})")
    print("  model       edges  triangles  truncated(D=10)  CPL")

    def row(name: str, a: sp.csr_matrix) -> None:
        shape = structure(a, rng)
        trunc = truncated_triangles(a.indptr, a.indices, priority, 10)
        edges = a.nnz // 2
        print(f"  {name:10s} {edges:6d} {shape.triangles:10.0f} {trunc:16.0f}  {shape.cpl:.3f}")

    row("real", real)
    for p in args.p:
        seed = int(rng.integers(2**63))
        row(f"p={p:g}", adjacency(*anchored_configuration(degrees, threshold, p, seed), n))


if __name__ == "__main__":
    main()
