"""``evaluate --task synthetic``: the PrivDPR paper's metrics for every synthetic-graph generator.

Per data set, run and epsilon, every method synthesizes twice: once from the whole graph (for the
structural metrics and node classification) and once from the training 80% of the edges only
(for link prediction, so that no test edge leaks). Rows: the real graph, ``privdpr``
(node-level DP), ``communities`` (ours, edge-level DP), ``chung_lu`` (the degree release) and
``erdos_renyi`` (the DP edge count).

Metrics (spec-synthetic-graph.md, "How the paper evaluates it"):

- relative error |x_syn - x_real| / x_real of the triangle, wedge and claw counts, the relative
  edge-distribution entropy REDE = sum_i -(d_i / 2|E|) ln(d_i / 2|E|) / ln N, the characteristic
  path length (CPL) and the diameter of the largest connected component, and its size (LCC);
  CPL and diameter are exact (a BFS from every node of the LCC) when the LCC has at most
  ``EXACT_PATH_NODES`` nodes, and otherwise estimated from BFS trees of ``bfs_sources`` random
  sources (the same estimator on the real and the synthetic graph; the estimated diameter is
  the largest eccentricity found, after a double sweep from the farthest node);
- KS: the two-sample Kolmogorov-Smirnov distance between the degree sequences;
- link-prediction AUC: the held-out 20% of the real edges against as many sampled real
  non-edges, scored by the number of common neighbours IN THE SYNTHETIC GRAPH, ties broken by
  the sum of the two synthetic degrees;
- node classification Micro-F1 (where labels exist): logistic regression on a 32-dimensional
  truncated SVD of the synthetic adjacency, 90% train / 10% test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import stats
from scipy.sparse.csgraph import connected_components, shortest_path

from service.evaluation.options import SYNTHETIC_METHODS
from service.synthetic.baselines import chung_lu_synthesize, erdos_renyi_synthesize
from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.privdpr import PrivdprParams, privdpr_synthesize

METHODS = SYNTHETIC_METHODS
REAL = "real"
STRUCTURAL = ("triangles", "wedges", "claws", "rede", "cpl", "diameter", "lcc")
METRICS = (*(f"{m}_mre" for m in STRUCTURAL), "ks", "auc", "micro_f1")

Edges = tuple[np.ndarray, np.ndarray]


def adjacency(u: np.ndarray, v: np.ndarray, n: int) -> sp.csr_matrix:
    a = sp.csr_matrix((np.ones(u.size), (u, v)), shape=(n, n))
    out: sp.csr_matrix = (a + a.T).tocsr()
    out.data[:] = 1.0
    return out


@dataclass(frozen=True)
class Structure:
    triangles: float
    wedges: float
    claws: float
    rede: float
    cpl: float
    diameter: float
    lcc: float
    degrees: np.ndarray = field(repr=False)


#: Largest LCC whose path lengths are computed exactly (every node a BFS source, in chunks).
EXACT_PATH_NODES = 10_000
_BFS_CHUNK = 512


def _path_lengths(sub: sp.csr_matrix, sources: np.ndarray) -> tuple[float, int, float, int]:
    """Sum and count of the finite positive distances from ``sources``, the largest of them
    and a node that far from a source (BFS in chunks: memory stays at a chunk of rows)."""
    total, count, farthest, far = 0.0, 0, -1.0, 0
    for start in range(0, sources.size, _BFS_CHUNK):
        dist = shortest_path(
            sub, directed=False, unweighted=True, indices=sources[start : start + _BFS_CHUNK]
        )
        finite = dist[np.isfinite(dist) & (dist > 0)]
        total += float(finite.sum())
        count += int(finite.size)
        if dist.size and dist.max() > farthest:
            farthest = float(dist.max())
            far = int(np.unravel_index(np.argmax(dist), dist.shape)[1])
    return total, count, max(farthest, 0.0), far


def structure(a: sp.csr_matrix, rng: np.random.Generator, bfs_sources: int = 200) -> Structure:
    n = a.shape[0]
    d = np.asarray(a.sum(axis=1)).ravel()
    triangles = float((a @ a).multiply(a).sum() / 6.0)
    wedges = float(np.sum(d * (d - 1) / 2.0))
    claws = float(np.sum(d * (d - 1) * (d - 2) / 6.0))
    total = d.sum()
    p = d[d > 0] / total if total > 0 else np.ones(1)
    rede = float(-np.sum(p * np.log(p)) / math.log(n)) if n > 1 else 0.0
    _, labels = connected_components(a, directed=False)
    largest = np.flatnonzero(labels == np.argmax(np.bincount(labels)))
    sub = a[largest][:, largest]
    if largest.size <= EXACT_PATH_NODES:
        sources = np.arange(largest.size)
    else:
        sources = rng.choice(largest.size, min(bfs_sources, largest.size), replace=False)
    path_sum, count, farthest, far = _path_lengths(sub, sources)
    cpl = path_sum / count if count else 0.0
    sweep = shortest_path(sub, directed=False, unweighted=True, indices=[far])
    diameter = max(farthest, float(sweep.max(initial=0.0)))
    return Structure(triangles, wedges, claws, rede, cpl, diameter, float(largest.size), d)


def relative_errors(real: Structure, synthetic: Structure) -> dict[str, float]:
    out = {}
    for name in STRUCTURAL:
        truth = getattr(real, name)
        out[f"{name}_mre"] = abs(getattr(synthetic, name) - truth) / truth if truth else math.nan
    out["ks"] = float(stats.ks_2samp(real.degrees, synthetic.degrees).statistic)
    return out


@dataclass(frozen=True)
class Split:
    """The training graph's edges and the scored pairs (test edges, then sampled non-edges)."""

    train: Edges
    pairs: Edges
    labels: np.ndarray


def split_edges(edges: Edges, n: int, rng: np.random.Generator) -> Split:
    u, v = edges
    order = rng.permutation(u.size)
    test, train = order[: u.size // 5], order[u.size // 5 :]
    present = set((u * n + v).tolist())
    negatives: list[tuple[int, int]] = []
    while len(negatives) < test.size:
        a, b = rng.integers(0, n, 2)
        lo, hi = min(a, b), max(a, b)
        if lo != hi and lo * n + hi not in present:
            negatives.append((lo, hi))
    neg = np.array(negatives, dtype=np.int64).reshape(-1, 2)
    pairs = (np.concatenate([u[test], neg[:, 0]]), np.concatenate([v[test], neg[:, 1]]))
    labels = np.concatenate([np.ones(test.size), np.zeros(neg.shape[0])])
    return Split((u[train], v[train]), pairs, labels)


def link_auc(a: sp.csr_matrix, split: Split) -> float:
    """AUC of common neighbours in ``a``, ties broken by the degree sum in ``a``."""
    from sklearn.metrics import roc_auc_score

    p, q = split.pairs
    d = np.asarray(a.sum(axis=1)).ravel()
    common = np.asarray(a[p].multiply(a[q]).sum(axis=1)).ravel()
    score = common + (d[p] + d[q]) / (2.0 * d.max(initial=0.0) + 1.0)
    return float(roc_auc_score(split.labels, score))


def micro_f1(a: sp.csr_matrix, labels: np.ndarray, rng: np.random.Generator) -> float:
    """Logistic regression on a 32-dim truncated SVD of ``a``; 90/10 split of labelled nodes."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score

    known = np.flatnonzero(labels >= 0)
    dims = max(1, min(32, a.shape[0] - 1))
    features = TruncatedSVD(dims, random_state=int(rng.integers(2**31))).fit_transform(a)
    order = rng.permutation(known)
    cut = int(0.9 * order.size)
    train, test = order[:cut], order[cut:]
    model = LogisticRegression(max_iter=2000)
    model.fit(features[train], labels[train])
    return float(f1_score(labels[test], model.predict(features[test]), average="micro"))


@dataclass(frozen=True)
class SyntheticSettings:
    privdpr: PrivdprParams = field(default_factory=PrivdprParams)
    communities: CommunityParams = field(default_factory=CommunityParams)
    bfs_sources: int = 200


def synthesize(
    method: str,
    csr: sp.csr_matrix,
    epsilon: float,
    settings: SyntheticSettings,
    rng: np.random.Generator,
    *,
    noise: np.random.Generator | None = None,
) -> Edges:
    """One synthetic graph: ``noise`` draws the method's releases (exact samplers only;
    default ``rng``), ``rng`` everything else."""
    if method == "privdpr":
        u, v, _ = privdpr_synthesize(
            csr.indptr, csr.indices, epsilon, settings.privdpr, rng, noise=noise
        )
        return u, v
    if method == "communities":
        u, v, _, _ = community_synthesize(
            csr.indptr, csr.indices, epsilon, settings.communities, rng, noise=noise
        )
        return u, v
    if method == "chung_lu":
        return chung_lu_synthesize(csr.indptr, epsilon, rng, noise=noise)
    if method == "erdos_renyi":
        return erdos_renyi_synthesize(csr.indptr, epsilon, rng, noise=noise)
    raise ValueError(f"unknown method {method}")


@dataclass
class Cell:
    """One (method, epsilon) row: every metric's values over the runs."""

    method: str
    epsilon: float
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.values.setdefault(key, []).append(value)

    def summary(self, metric: str) -> tuple[float, float]:
        """Mean and half-width of the 95% t-interval (NaN when fewer than 2 runs)."""
        xs = np.array([x for x in self.values.get(metric, []) if not math.isnan(x)])
        if xs.size == 0:
            return math.nan, math.nan
        if xs.size == 1:
            return float(xs[0]), math.nan
        half = stats.t.ppf(0.975, xs.size - 1) * xs.std(ddof=1) / math.sqrt(xs.size)
        return float(xs.mean()), float(half)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "epsilon": self.epsilon}
        for metric in METRICS:
            mean, half = self.summary(metric)
            out[metric] = None if math.isnan(mean) else mean
            out[f"{metric}_ci"] = None if math.isnan(half) else half
        out["runs"] = max((len(v) for v in self.values.values()), default=0)
        return out


def evaluate_synthetic(
    edges: Edges,
    n: int,
    epsilons: Sequence[float],
    *,
    runs: int,
    methods: Sequence[str],
    settings: SyntheticSettings,
    rng: np.random.Generator,
    labels: np.ndarray | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Cell]:
    """Cells for the real graph (epsilon 0) and every (method, epsilon)."""
    full = adjacency(edges[0], edges[1], n)
    real = structure(full, rng, settings.bfs_sources)
    cells: dict[tuple[str, float], Cell] = {}

    def cell(method: str, eps: float) -> Cell:
        return cells.setdefault((method, eps), Cell(method, eps))

    for run in range(runs):
        split = split_edges(edges, n, rng)
        train = adjacency(split.train[0], split.train[1], n)
        base = {**relative_errors(real, real), "auc": link_auc(train, split)}
        if labels is not None:
            base["micro_f1"] = micro_f1(full, labels, rng)
        cell(REAL, 0.0).add(base)
        for eps in epsilons:
            for method in methods:
                if progress is not None:
                    progress(f"run {run + 1}/{runs}, eps {eps:g}, {method}")
                su, sv = synthesize(method, full, eps, settings, rng)
                synthetic = adjacency(su, sv, n)
                metrics = relative_errors(real, structure(synthetic, rng, settings.bfs_sources))
                tu, tv = synthesize(method, train, eps, settings, rng)
                metrics["auc"] = link_auc(adjacency(tu, tv, n), split)
                if labels is not None:
                    metrics["micro_f1"] = micro_f1(synthetic, labels, rng)
                cell(method, eps).add(metrics)
    return list(cells.values())
