"""Paired variants of the ``communities`` generator: what moves Cora's path length and AUC.

    OPENBLAS_NUM_THREADS=1 python benchmarks/synthetic_variants.py ../shared/data/cora.cites \\
        --epsilon 1 --runs 8 default periphery:0.9 hub_avoid:1:8 min_block:3 \\
        param:locality_share=0.08

Every run draws one 80/20 split of the real edges; every variant synthesizes from the whole
graph (structural metrics) and from the training part (link-prediction AUC, as
``evaluate --task synthetic``). The variants are post-processing changes of the generator made
here by wrapping its steps (none is in the generator):

- ``default``: the generator as shipped;
- ``periphery:S``: each stub of a node of released degree <= 3 is, with probability S, paired
  with another such stub (a leaf's never with a leaf's) instead of the configuration model;
- ``hub_avoid:S:K``: each stub of a node of released degree >= K is, with probability S, paired
  with a stub of a node below K;
- ``min_block:M``: the affinity (BTER) blocks take only nodes of released degree >= M;
- ``low_blocks:C:A``: pairs of affinity blocks whose smallest released degree is <= C are
  kept A times as often as the others (one rho still fitted to the released triangle count):
  the real graph's low-degree nodes are the clustered ones;
- ``param:NAME=VALUE``: a ``CommunityParams`` field (e.g. a budget share).

Printed first: the real graph's share of edges within windows of the node order. Then per
variant: mean ± 95% half-width of the evaluation's metrics, the synthetic CPL, and
three degree-mixing counts of the synthetic graph next to the real graph's (edges between nodes
of degree >= 8, between nodes of degree <= 3, and between a leaf and a node of degree 2-3).
Evaluation only: it reads the real graph's exact statistics (not the serving path).
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import stats

import service.synthetic.blocks as blocks
import service.synthetic.communities as communities
from service.evaluation.synthetic import (
    adjacency,
    link_auc,
    relative_errors,
    split_edges,
    structure,
)
from service.graph.loader import load_edge_list
from service.synthetic.sampling import block_configuration, simple_edges

METRICS = ("triangles_mre", "wedges_mre", "claws_mre", "cpl_mre", "diameter_mre", "lcc_mre")
METRICS_ALL = (*METRICS, "ks", "auc", "cpl", "hub_hub", "low_low", "leaf_inner")


def mixing_counts(a: sp.csr_matrix) -> dict[str, float]:
    d = np.asarray(a.sum(axis=1)).ravel()
    c = a.tocoo()
    keep = c.row < c.col
    u, v = c.row[keep], c.col[keep]
    inner_u, inner_v = (d[u] >= 2) & (d[u] <= 3), (d[v] >= 2) & (d[v] <= 3)
    return {
        "hub_hub": float(np.sum((d[u] >= 8) & (d[v] >= 8))),
        "low_low": float(np.sum((d[u] <= 3) & (d[v] <= 3))),
        "leaf_inner": float(np.sum(((d[u] == 1) & inner_v) | ((d[v] == 1) & inner_u))),
    }


def locality(u: np.ndarray, v: np.ndarray, n: int) -> dict[str, str]:
    """Share of the edges at most w - 1 apart in the node order (sorted ids), against the share
    a uniformly random pair has, 1 - (1 - w / n) ** 2."""
    gap = np.abs(u - v)
    return {
        f"w={w}": f"{np.mean(gap < w):.4f} (random {1 - (1 - w / n) ** 2:.4f})"
        for w in (2, 5, 20, 100, 500)
    }


Rest = Callable[..., tuple[np.ndarray, np.ndarray]]


def _paired_rest(selected: Callable[[np.ndarray], np.ndarray], share: float, kind: str) -> Rest:
    """A block configuration model where stubs of ``selected(released degrees)`` nodes are first
    paired (with probability ``share``) as ``kind`` says."""
    released: dict[str, np.ndarray] = {}
    denoise = communities.denoise_degrees

    def capture(*args: Any, **kwargs: Any) -> np.ndarray:
        out: np.ndarray = denoise(*args, **kwargs)
        released["target"] = out
        return out

    communities.denoise_degrees = capture  # type: ignore[assignment]

    def rest(
        degrees: np.ndarray, groups: np.ndarray, mixing: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        n = degrees.size
        mark = selected(released["target"])
        owner = np.repeat(np.arange(n), degrees)
        chosen = rng.permutation(owner[mark[owner] & (rng.random(owner.size) < share)])
        if kind == "periphery":
            leaf = released["target"][chosen] <= 1
            left, right = chosen[leaf], chosen[~leaf]
            pairs = min(left.size, right.size)
            spare = right[pairs:]
            half = spare.size // 2
            a = np.concatenate([left[:pairs], spare[:half]])
            b = np.concatenate([right[:pairs], spare[half : 2 * half]])
        else:
            others = rng.permutation(owner[~mark[owner]])
            pairs = min(chosen.size, others.size)
            a, b = chosen[:pairs], others[:pairs]
        rest_degrees = degrees - np.bincount(np.concatenate([a, b]), minlength=n)
        cu, cv = block_configuration(rest_degrees, groups, mixing, rng)
        return simple_edges(np.concatenate([a, cu]), np.concatenate([b, cv]), n)

    return rest


def _weighted_block_pairs(cut: int, factor: float) -> Callable[..., tuple[np.ndarray, ...]]:
    """Block pairs where a pair of a block whose first (lowest-degree) node has released degree
    <= ``cut`` appears as if drawn ``factor`` times more often: its uniform draw is divided by
    ``factor`` through a third array the layer reads as the pair's weight."""
    original = blocks.block_pairs
    original_layer = blocks._layer

    def pairs(block_list: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        u, v = original(block_list)
        low = [np.full(b.size * (b.size - 1) // 2, b.size - 1 <= cut) for b in block_list]
        flags = np.concatenate(low) if low else np.zeros(0, bool)

        def layer(p: Any, weight: np.ndarray, rng: np.random.Generator) -> Any:
            blocks._layer = original_layer  # type: ignore[assignment]
            if p[0].size == flags.size:
                weight = np.where(flags, factor, 1.0)
            return original_layer(p, weight, rng)

        blocks._layer = layer  # type: ignore[assignment]
        return u, v

    return pairs


@contextlib.contextmanager
def variant(spec: str) -> Iterator[communities.CommunityParams]:
    """The parameters to use, with the generator's steps wrapped as ``spec`` says."""
    saved = (
        communities.block_configuration,
        communities.denoise_degrees,
        blocks.affinity_blocks,
        blocks.block_pairs,
    )
    params = communities.CommunityParams()
    kind, _, arg = spec.partition(":")
    try:
        if kind == "periphery":
            communities.block_configuration = _paired_rest(  # type: ignore[assignment]
                lambda d: d <= 3, float(arg), "periphery"
            )
        elif kind == "hub_avoid":
            share, hub = arg.split(":")
            communities.block_configuration = _paired_rest(  # type: ignore[assignment]
                lambda d: d >= int(hub), float(share), "hub"
            )
        elif kind == "min_block":
            original = blocks.affinity_blocks

            def fewer(degrees: np.ndarray, *args: Any) -> list[np.ndarray]:
                return original(np.where(degrees >= int(arg), degrees, 0), *args)

            blocks.affinity_blocks = fewer  # type: ignore[assignment]
        elif kind == "low_blocks":
            blocks.block_pairs = _weighted_block_pairs(  # type: ignore[assignment]
                int(arg.split(":")[0]), float(arg.split(":")[1])
            )
        elif kind == "param":
            name, value = arg.split("=")
            field_type = type(getattr(params, name))
            params = replace(params, **{name: field_type(float(value))})
        elif kind != "default":
            raise SystemExit(f"unknown variant {spec}")
        yield params
    finally:
        communities.block_configuration = saved[0]  # type: ignore[assignment]
        communities.denoise_degrees = saved[1]  # type: ignore[assignment]
        blocks.affinity_blocks = saved[2]  # type: ignore[assignment]
        blocks.block_pairs = saved[3]  # type: ignore[assignment]


def _summary(xs: list[float]) -> str:
    a = np.array(xs)
    if a.size < 2:
        return f"{a.mean():.4f}"
    half = stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size)
    return f"{a.mean():.4f} ± {half:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph")
    parser.add_argument("variants", nargs="*")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_intermixed_args()
    graph = load_edge_list(args.graph)
    u, v = (x.astype(np.int64) for x in graph.edge_arrays())
    n = graph.n
    full = adjacency(u, v, n)
    rng = np.random.default_rng()
    real = structure(full, rng)
    print("real", {"cpl": round(real.cpl, 3), **mixing_counts(full)})
    print("real", locality(u, v, n))
    values: dict[str, dict[str, list[float]]] = {s: {} for s in args.variants}
    for _ in range(args.runs):
        split = split_edges((u, v), n, rng)
        train = adjacency(split.train[0], split.train[1], n)
        for spec in args.variants:
            with variant(spec) as params:
                su, sv, _, _ = communities.community_synthesize(
                    full.indptr, full.indices, args.epsilon, params, rng
                )
                tu, tv, _, _ = communities.community_synthesize(
                    train.indptr, train.indices, args.epsilon, params, rng
                )
            synthetic = adjacency(su, sv, n)
            shape = structure(synthetic, rng)
            found = {**relative_errors(real, shape), **mixing_counts(synthetic)}
            found["auc"] = link_auc(adjacency(tu, tv, n), split)
            found["cpl"] = shape.cpl
            for key in METRICS_ALL:
                values[spec].setdefault(key, []).append(found[key])
    for spec in args.variants:
        cells = ", ".join(f"{k} {_summary(values[spec][k])}" for k in METRICS_ALL)
        print(f"eps {args.epsilon:g} {spec}: {cells}")


if __name__ == "__main__":
    main()
