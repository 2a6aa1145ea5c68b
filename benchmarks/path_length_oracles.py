"""Which structure carries Cora's path length? Noise-free ("oracle") null models of the real graph.

    OPENBLAS_NUM_THREADS=1 python benchmarks/path_length_oracles.py ../shared/data/cora.cites \\
        --runs 2

Evaluation only: every model here reads the real graph EXACTLY (nothing is private); it asks
what a generator would have to reproduce, not what it can release. Printed per model: the
characteristic path length (the evaluation's estimator), the edge count, the wedge and LCC
errors against the real graph, and ball counts S_r of the degree-4 projection (ordered pairs
within distance r, r = 1..4, the projection of service.synthetic.triangles with one random
priority order), a bounded-sensitivity path statistic a generator could release.

- ``config``: the configuration model on the exact degrees (loops and repeats dropped);
- ``2K``: the real graph rewired by double-edge swaps that keep every node's degree and every
  edge's pair of end degrees (the joint degree distribution, dK-2), 10 swaps tried per edge;
- ``planted:K:MU``: K groups drawn uniformly at random, each stub inside its group with
  probability MU, uniform mixing otherwise, stubs lost to repeats re-paired at random (so the
  degrees are kept);
- ``spectral:K``: the real graph's own K communities (k-means on the top K eigenvectors of the
  normalised adjacency) and their exact block matrix, as a degree-corrected block model, once
  with the stubs lost to repeats dropped (``erased``) and once re-paired (``kept``).
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh

from service.evaluation.synthetic import adjacency, relative_errors, structure
from service.graph.loader import load_edge_list
from service.synthetic.sampling import block_configuration, simple_edges
from service.synthetic.triangles import truncated_projection

Edges = tuple[np.ndarray, np.ndarray]


def ball_counts(
    a: sp.csr_matrix, priority: np.ndarray, bound: int = 4, radius: int = 4
) -> list[int]:
    n = a.shape[0]
    h = truncated_projection(a.indptr, a.indices, priority, bound) + sp.identity(n, format="csr")
    h.data[:] = 1.0
    reach = sp.identity(n, format="csr")
    out = []
    for _ in range(radius):
        reach = reach @ h
        reach.data[:] = 1.0
        out.append(int(reach.nnz - n))
    return out


def repaired(degrees: np.ndarray, edges: Edges, rng: np.random.Generator) -> Edges:
    """Re-pair at random the stubs the simple graph lost (a few passes)."""
    u, v = edges
    n = degrees.size
    for _ in range(4):
        left = np.maximum(degrees - np.bincount(np.concatenate([u, v]), minlength=n), 0)
        stubs = rng.permutation(np.repeat(np.arange(n), left))
        half = stubs.size // 2
        u, v = simple_edges(
            np.concatenate([u, stubs[:half]]), np.concatenate([v, stubs[half : 2 * half]]), n
        )
    return u, v


def joint_degree_swaps(u: np.ndarray, v: np.ndarray, n: int, rng: np.random.Generator) -> Edges:
    degrees = np.bincount(np.concatenate([u, v]), minlength=n)
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for a, b in zip(u.tolist(), v.tolist(), strict=True):
        neighbours[a].add(b)
        neighbours[b].add(a)
    edges = list(zip(u.tolist(), v.tolist(), strict=True))
    for _ in range(10 * len(edges)):
        i, j = rng.integers(len(edges), size=2)
        a, b = edges[i]
        c, e = edges[j]
        if rng.random() < 0.5:
            c, e = e, c
        if degrees[b] != degrees[e] or len({a, b, c, e}) < 4:
            continue
        if e in neighbours[a] or b in neighbours[c]:
            continue
        neighbours[a] -= {b}
        neighbours[b] -= {a}
        neighbours[c] -= {e}
        neighbours[e] -= {c}
        neighbours[a].add(e)
        neighbours[e].add(a)
        neighbours[c].add(b)
        neighbours[b].add(c)
        edges[i], edges[j] = (a, e), (c, b)
    return simple_edges(np.array([x for x, _ in edges]), np.array([y for _, y in edges]), n)


def spectral_groups(a: sp.csr_matrix, k: int, rng: np.random.Generator) -> np.ndarray:
    from sklearn.cluster import KMeans  # evaluation extra, as in the classification task

    d = np.asarray(a.sum(axis=1)).ravel()
    scale = sp.diags(1.0 / np.sqrt(np.maximum(d, 1.0)))
    _, vectors = eigsh(scale @ a @ scale, k=k, which="LA")
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    labels: np.ndarray = KMeans(k, n_init=3, random_state=int(rng.integers(2**31))).fit_predict(x)
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--planted", nargs="*", default=["100:0.9", "30:0.97"])
    parser.add_argument("--spectral", type=int, nargs="*", default=[30])
    args = parser.parse_args()
    graph = load_edge_list(args.graph)
    u, v = (x.astype(np.int64) for x in graph.edge_arrays())
    n = graph.n
    real_a = adjacency(u, v, n)
    degrees = np.diff(real_a.indptr).astype(np.int64)
    rng = np.random.default_rng()
    real = structure(real_a, rng)
    priority = rng.permutation(n)
    print(f"real: cpl {real.cpl:.2f}, edges {u.size}, S_r {ball_counts(real_a, priority)}")
    one = np.zeros(n, np.int64)

    def show(name: str, edges: Edges) -> None:
        a = adjacency(edges[0], edges[1], n)
        s = structure(a, rng)
        e = relative_errors(real, s)
        print(
            f"{name}: cpl {s.cpl:.2f}, edges {edges[0].size}, wedge err {e['wedges_mre']:.3f},"
            f" lcc err {e['lcc_mre']:.3f}, S_r {ball_counts(a, priority)}",
            flush=True,
        )

    for _ in range(args.runs):
        show("config", block_configuration(degrees, one, np.ones((1, 1)), rng))
        show("2K", joint_degree_swaps(u, v, n, rng))
        for spec in args.planted:
            k_text, mu_text = spec.split(":")
            k, mu = int(k_text), float(mu_text)
            mixing = np.full((k, k), (1.0 - mu) / (k - 1))
            np.fill_diagonal(mixing, mu)
            groups = rng.integers(0, k, n)
            show(
                f"planted:{spec}",
                repaired(degrees, block_configuration(degrees, groups, mixing, rng), rng),
            )
        for k in args.spectral:
            groups = spectral_groups(real_a, k, rng)
            h = sp.csr_matrix((np.ones(n), (np.arange(n), groups)), shape=(n, k))
            block = (h.T @ real_a @ h).toarray()
            mixing = block / np.maximum(block.sum(axis=1, keepdims=True), 1e-12)
            inside = np.trace(block) / block.sum()
            erased = block_configuration(degrees, groups, mixing, rng)
            show(f"spectral:{k} (intra {inside:.2f}) erased", erased)
            show(f"spectral:{k} kept", repaired(degrees, erased, rng))


if __name__ == "__main__":
    main()
