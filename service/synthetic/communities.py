"""``communities``: our edge-level DP generator (a degree-corrected block configuration model).

Privacy unit: ONE EDGE (pure eps edge-level DP). PrivDPR's is one NODE with all its edges
((eps, delta) node-level DP): not the same promise; docs/synthetic.md puts them side by side.

Releases (all Laplace, split by :func:`service.privacy.synthetic.community_plan`; drawn by
the project's exact sampler on a grid, :mod:`service.synthetic.noise`: pure DP as planned,
delta 0; :func:`community_release` makes them, :func:`community_graph` is the rest):

1. probe: |E| + Lap(1 / eps_probe). The rounds run only where they can pay off: when a group
   cell's expected count, (released mean degree) / groups, is at least ``min_signal`` times
   the rounds' Laplace scale 2 / eps_round. Otherwise their budget goes to the degrees
   (measured: on Cora the rounds do not beat a random partition even at eps 3.2, and on
   email-Eu-core and ego-Facebook at eps <= 1 they cost more in degree accuracy than they
   bring). The decision reads a DP output only.
2. degrees: d + Lap(2 / eps_degrees), clipped at the floor and rescaled to the probe's edge
   count (post-processing); with ``deconvolve`` the nodes take instead the deconvolved degree
   distribution at their noisy ranks (service.synthetic.deconvolve, post-processing). With
   ``order_window`` the values go to the nodes in the order of their noisy degrees shrunk
   towards those of their neighbours in the public node order
   (service.synthetic.order_shrinkage, post-processing): same values, better placed.
3. ``rounds`` rounds of group counts: C = A H(g) + Lap(2 / eps_round), H(g) the n x k indicator
   of the current partition g (the first is uniformly random, drawn without the data). After
   every round but the last, each node moves to the group its noisy counts favour most,
   relative to the group's total (a noisy power-iteration step); the last round's counts give the
   block mixing matrix between the groups.

The synthetic graph (service.synthetic.blocks) is a band along the public node order, the hubs'
closed neighbourhoods (the anchored configuration model, sparse graphs only) and affinity blocks
fitted to the released counts, then a block configuration model on the degrees left, the
partition and the mixing matrix: post-processing of the releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from service.errors import InvalidParameter
from service.privacy.synthetic import (
    EDGE_COUNT_SENSITIVITY,
    GROUP_COUNT_SENSITIVITY,
    LOCALITY_SENSITIVITY,
    CommunityPlan,
    community_plan,
)
from service.synthetic.anchors import anchor_threshold
from service.synthetic.blocks import Targets, layered_graph
from service.synthetic.noise import noisy_count, noisy_counts
from service.synthetic.order_shrinkage import DEFAULT_HALF_WINDOW, order_shrunk_degrees
from service.synthetic.sampling import block_configuration, denoise_degrees
from service.synthetic.triangles import in_block_edges, public_block_size, truncated_triangles

DEGREE_SENSITIVITY = 2.0


@dataclass(frozen=True)
class CommunityParams:
    groups: int = 6
    rounds: int = 5
    probe_share: float = 0.03
    degree_share: float = 0.35
    min_signal: float = 1.0
    #: Share of eps for the truncated triangle count (0: no triangle release, no blocks).
    triangle_share: float = 0.07
    #: D of the triangle release: every node keeps its D lowest-priority neighbours.
    triangle_bound: int = 10
    #: Largest affinity block (BTER): bounds the triangles one block can hold.
    block_cap: int = 64
    #: Share of eps for the in-block edge count along the public node order (0: none).
    locality_share: float = 0.03
    #: A triangle or in-block count is used only when its released value is at least this many
    #: times its Laplace scale (below that it is mostly noise: its layer is left out).
    count_min_signal: float = 1.0
    #: Smallest synthetic degree (1: a graph read from an edge list has no isolated node).
    min_degree: int = 1
    #: Give the nodes the deconvolved degree distribution at their noisy ranks
    #: (service.synthetic.deconvolve; post-processing) instead of the noisy values. Off by
    #: default: on Cora at eps 1 it halves the degree KS distance and the claw error but costs
    #: link-prediction AUC about 0.006 (docs/notes/synthetic-communities-rounds-2026-11-26.md,
    #: "Second round").
    deconvolve: bool = False
    #: Hand the degrees out in the order of the noisy degrees shrunk towards the mean of the
    #: ``order_window`` nodes on each side in the public node order
    #: (service.synthetic.order_shrinkage; post-processing); 0: in the noisy values' order.
    #: Measured: Cora's link-prediction AUC at eps 1 rises by about 0.02 (the node order
    #: follows the papers' age there); email-Eu-core, ego-Facebook and shuffled ids unchanged.
    order_window: int = DEFAULT_HALF_WINDOW
    #: Let the anchored configuration model (service.synthetic.anchors) carry the triangles
    #: first, closing the hubs' neighbourhoods up to p = 1, and the affinity blocks the rest.
    anchors: bool = True
    #: Anchors are the nodes of released degree >= anchor_factor x the released mean degree.
    anchor_factor: float = 4.0
    #: The anchored layer is for sparse graphs: only when the released mean degree is at most
    #: this (measured: it lengthens Cora's paths to the real length, mean degree 3.9, and costs
    #: email-Eu-core and ego-Facebook, mean degree 32 and 44, their wedge and path errors).
    anchor_max_mean_degree: float = 10.0

    def validate(self) -> None:
        checks = (
            ("groups", 2 <= self.groups <= 256),
            ("rounds", 1 <= self.rounds <= 64),
            ("probe_share", 0.0 < self.probe_share < 0.5),
            ("degree_share", 0.0 < self.degree_share < 1.0),
            ("min_signal", 0.0 <= self.min_signal <= 1e6),
            ("triangle_share", 0.0 <= self.triangle_share < 0.5),
            ("triangle_bound", 2 <= self.triangle_bound <= 256),
            ("block_cap", 2 <= self.block_cap <= 1024),
            ("min_degree", 0 <= self.min_degree <= 8),
            ("locality_share", 0.0 <= self.locality_share < 0.5),
            ("count_min_signal", 0.0 <= self.count_min_signal <= 1e6),
            ("anchor_factor", 1.0 <= self.anchor_factor <= 1e3),
            ("anchor_max_mean_degree", 0.0 <= self.anchor_max_mean_degree <= 1e6),
            ("order_window", 0 <= self.order_window <= 10_000_000),
        )
        for name, ok in checks:
            if not ok:
                raise InvalidParameter(name, f"communities parameter {name} is out of range")

    def plan(self, epsilon: float) -> CommunityPlan:
        self.validate()
        return community_plan(
            epsilon,
            probe_share=self.probe_share,
            degree_share=self.degree_share,
            rounds=self.rounds,
            triangle_share=self.triangle_share,
            triangle_bound=self.triangle_bound,
            locality_share=self.locality_share,
        )


def _indicator(groups: np.ndarray, k: int) -> sp.csr_matrix:
    n = groups.size
    return sp.csr_matrix((np.ones(n), (np.arange(n), groups)), shape=(n, k))


@dataclass(frozen=True)
class CommunityRelease:
    """What ``communities`` releases about the graph (every number drawn by the exact sampler,
    :mod:`service.synthetic.noise`), and the public choices it was drawn with. Everything the
    generator does after :func:`community_release` reads this and public data only."""

    plan: CommunityPlan  # the plan used (the rounds' budget moved to the degrees if skipped)
    nodes: int
    edges: float  # |E| + Lap(1 / eps_probe)
    triangles: float | None  # truncated triangle count + Lap(2 (D - 1) / eps_t), or None
    in_block: float | None  # in-block edge count + Lap(1 / eps_l), or None
    block_size: int  # the in-block count's block length (from the released edge count)
    degrees: np.ndarray  # d + Lap(2 / eps_d)
    degree_scale: float
    groups: np.ndarray  # the partition of the last round (all zeros without rounds)
    counts: np.ndarray | None  # the last round's node-by-group counts + Lap(2 / eps_r)
    priority: np.ndarray  # the projection's public random node order

    @property
    def mean_degree(self) -> float:
        return 2.0 * max(self.edges, 0.0) / max(self.nodes, 1)


def community_release(
    indptr: np.ndarray,
    indices: np.ndarray,
    epsilon: float,
    params: CommunityParams,
    noise: np.random.Generator,
    public: np.random.Generator,
) -> CommunityRelease:
    """The releases (the graph -> noisy numbers), in order, each with its share of eps.

    ``noise`` draws the Laplace noise, by the exact sampler only (raw words); ``public`` draws
    what is chosen without the data: the projection's node order and the first partition. The
    decisions between releases (skipping the rounds, the block size, each round's partition)
    read earlier releases only."""
    n = int(indptr.size - 1)
    plan = params.plan(epsilon)
    degrees = np.diff(indptr).astype(np.float64)
    edges = noisy_count(
        float(degrees.sum() / 2.0), EDGE_COUNT_SENSITIVITY / plan.probe_epsilon, noise
    )
    mean_degree = 2.0 * max(edges, 0.0) / max(n, 1)
    signal = mean_degree / params.groups * plan.round_epsilon / GROUP_COUNT_SENSITIVITY
    if signal < params.min_signal:
        plan = plan.without_rounds()

    priority = public.permutation(n)  # drawn without the data: the projection's neighbour order
    triangles = None
    if plan.triangle_epsilon > 0.0:
        truncated = truncated_triangles(indptr, indices, priority, plan.triangle_bound)
        triangles = noisy_count(
            float(truncated), plan.triangle_sensitivity / plan.triangle_epsilon, noise
        )
    size = public_block_size(mean_degree, params.block_cap)  # from the probe: post-processing
    in_block = None
    if plan.locality_epsilon > 0.0:
        in_block = noisy_count(
            float(in_block_edges(indptr, indices, size)),
            LOCALITY_SENSITIVITY / plan.locality_epsilon,
            noise,
        )
    degree_scale = DEGREE_SENSITIVITY / plan.degree_epsilon
    noisy = noisy_counts(degrees, degree_scale, noise)

    k = params.groups if plan.rounds else 1
    groups = public.integers(0, k, n)  # the first partition: drawn without the data
    counts = None
    if plan.rounds:
        adjacency = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(n, n))
        for r in range(plan.rounds):
            exact = (adjacency @ _indicator(groups, k)).toarray()
            counts = noisy_counts(exact, GROUP_COUNT_SENSITIVITY / plan.round_epsilon, noise)
            if r < plan.rounds - 1:  # the next partition, from this round's release
                volume = np.maximum(counts.sum(axis=0), 1.0)
                groups = np.argmax(counts / volume, axis=1)
    return CommunityRelease(
        plan=plan, nodes=n, edges=edges, triangles=triangles, in_block=in_block,
        block_size=size, degrees=noisy, degree_scale=degree_scale, groups=groups,
        counts=counts, priority=priority,
    )  # fmt: skip


def community_graph(
    release: CommunityRelease, params: CommunityParams, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The synthetic graph from the releases (post-processing: ``rng`` draws the random
    rounding of the degrees and the graph's layers) and a summary of what was derived from
    them (safe to show: functions of the releases only)."""
    plan = release.plan
    rank_by, order_weight = None, -1.0
    if params.order_window > 0:
        rank_by, order_weight = order_shrunk_degrees(
            release.degrees, release.degree_scale, params.order_window
        )
    target = denoise_degrees(
        release.degrees,
        2.0 * max(release.edges, 0.0),
        rng,
        params.min_degree,
        release.degree_scale if params.deconvolve else None,
        rank_by,
    )
    k = params.groups if plan.rounds else 1
    groups = release.groups
    mixing = np.ones((1, 1))
    if release.counts is not None:
        positive = np.maximum(release.counts, 0.0)
        block = _indicator(groups, k).T @ positive  # k x k, row g: stubs of g towards h
        block = (block + block.T) / 2.0
        mixing = block / np.maximum(block.sum(axis=1, keepdims=True), 1e-12)
        mixing[block.sum(axis=1) <= 0] = 1.0 / k

    def rest(d: np.ndarray, r: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return block_configuration(d, groups, mixing, r)

    triangles, in_block = release.triangles, release.in_block
    use_triangles = triangles is not None and triangles >= (
        params.count_min_signal * plan.triangle_sensitivity / max(plan.triangle_epsilon, 1e-300)
    )
    use_in_block = in_block is not None and in_block >= (
        params.count_min_signal * LOCALITY_SENSITIVITY / max(plan.locality_epsilon, 1e-300)
    )
    targets = Targets(  # a count below the signal rule leaves its layer out: post-processing
        triangles=triangles if use_triangles else None,
        triangle_bound=plan.triangle_bound,
        priority=release.priority,
        in_block=in_block if use_in_block else None,
        block_size=release.block_size,
        anchor_min=anchor_threshold(target, params.anchor_factor)
        if params.anchors and k == 1 and release.mean_degree <= params.anchor_max_mean_degree
        else None,
    )
    (u, v), fitted = layered_graph(target, targets, params.block_cap, rest, rng, groups)
    summary = {
        "groups": int(k),
        "rounds": int(plan.rounds),
        "released_edges": float(round(release.edges, 3)),
        "released_triangles": None if triangles is None else float(round(triangles, 3)),
        "released_in_block": None if in_block is None else float(round(in_block, 3)),
        "block_size": int(release.block_size),
        "band": float(round(fitted["band"], 6)),
        "affinity": float(round(fitted["affinity"], 6)),
        "anchored": None if fitted["anchored"] < 0 else float(round(fitted["anchored"], 6)),
        "order_weight": None if order_weight < 0 else float(round(order_weight, 6)),
    }
    return u, v, summary


def community_synthesize(
    indptr: np.ndarray,
    indices: np.ndarray,
    epsilon: float,
    params: CommunityParams,
    rng: np.random.Generator,
    *,
    noise: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, CommunityPlan, dict[str, Any]]:
    """Synthetic edges (internal indices, ``u < v``), the plan actually used and a summary of
    what was released-derived. ``noise`` draws the releases (exact sampler; default ``rng``),
    ``rng`` the public choices and the post-processing."""
    release = community_release(
        indptr, indices, epsilon, params, rng if noise is None else noise, rng
    )
    u, v, summary = community_graph(release, params, rng)
    return u, v, release.plan, summary
