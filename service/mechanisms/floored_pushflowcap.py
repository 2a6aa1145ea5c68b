"""PushFlowCap with a floor: DP-IE's local PushFlowCap, the same sensitivity bound as Theorem 4.3.

Algorithm 2 (:mod:`service.mechanisms.pushflowcap`) pushes, in each of its R rounds, every
node's residual up to its cap, so the flow reaches every node of a well-connected graph within
a few rounds and each round costs a pass over every edge. By the paper's Lemma 4.2 (in the
service's notation: the lazy walk with keeps for degree-0 nodes, P = (1 - alpha) / 2 (I + K +
A D^-1) with K = [d = 0]), the total flow h a node has pushed after round i is

    h^(i) = min(e_s + P h^(i-1), c),     h^(0) = 0,     c_v = d(v) T_v,     p = alpha h^(R),

where e_s + P h is the flow a node has received so far (its cumulative inflow). This module
computes the same recursion with one change, a **floor** tau: a node keeps the first tau of
the flow it receives and pushes only what it receives beyond that,

    h^(i) = min(max(e_s + P h^(i-1) - tau, 0), c),

with tau = floor / (alpha n), so that floor / n is the PPR mass a node holds before it pushes
any (InstantEmbedding reads only p_v > 1 / n). A node whose inflow stays below tau never pushes,
so the flow stops where it thins out: the rounds cost the volume of the nodes that push, not
the graph's.

Sensitivity (docs/privacy.md, "DP-IE's PushFlowCap with a floor"): the proof of Theorem 4.3
uses only that x -> min(x, c) is 1-Lipschitz, that |min(a, c) - min(a', c')| <= |a - a'| +
|c - c'|, and that h_v <= d(v) T_v; x -> min(max(x - tau, 0), c) has all three, so ||p(G) -
p(G')||_1 <= (2 - alpha)(T_x + T_y) <= sigma for one edge, as for Algorithm 2, for any tau >= 0
that does not depend on the edges (tau depends on n, beta and the public floor only). With
floor 0 it is Algorithm 2 itself (up to rounding: the kernel adds in another order).

The kernel keeps the cumulative inflow I = e_s + P h and, each round, evaluates only the nodes
whose inflow changed in the previous round (the others would compute the h they hold), then
adds P (h^(i) - h^(i-1)) into I, node by node in the order the nodes were reached. It stops
after a round in which no node's h changed: the recursion is then at its fixed point. Its
float64 rounding (and that of Algorithm 2's kernel) is bounded from public parameters by
:mod:`service.mechanisms.pushflowcap_rounding`, a margin DP-IE's plan adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.pushflowcap import (
    edge_threshold,
    node_arrays,
    pushflowcap,
    validate_pushflowcap,
    warm_up_graph,
)
from service.privacy.modes import Mode

__all__ = [
    "FlowWork",
    "floor_threshold",
    "floored_pushflowcap",
    "floored_pushflowcap_reference",
    "floored_pushflowcap_traced",
    "pushflowcap_with_floor",
    "warm_up_floored_kernel",
]


def floor_threshold(beta: float, n: int, floor: float) -> float:
    """tau = floor / (alpha n), alpha = 1 - beta: the flow a node keeps before it pushes."""
    if (
        isinstance(floor, bool)
        or not isinstance(floor, int | float)
        or not math.isfinite(floor)
        or floor < 0
    ):
        raise InvalidParameter("floor", f"must be a finite number >= 0, got {floor!r}")
    return float(floor) / ((1.0 - beta) * n)


@dataclass(frozen=True)
class FlowWork:
    """What one run cost: rounds until nothing changed (at most R), neighbour-list entries
    read, nodes that pushed at least once."""

    rounds: int
    edge_visits: int
    pushed_nodes: int


def floored_pushflowcap(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float,
    mode: Mode,
    floor: float,
) -> np.ndarray:
    """p = alpha h^(R) of the floored recursion (module docstring) for ``seed`` (internal
    index), as a dense n-vector; zero outside the nodes that pushed."""
    return floored_pushflowcap_traced(graph, seed, beta, rounds, sigma, mode, floor)[0]


def pushflowcap_with_floor(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float,
    mode: Mode,
    floor: float,
) -> np.ndarray:
    """DP-IE's PushFlowCap: :func:`floored_pushflowcap` for a floor > 0; at floor 0 the
    paper's Algorithm 2 itself (:func:`service.mechanisms.pushflowcap.pushflowcap`, bit for bit
    its dense rounds)."""
    if floor == 0:
        return pushflowcap(graph, seed, beta, rounds, sigma, mode)
    return floored_pushflowcap(graph, seed, beta, rounds, sigma, mode, floor)


def floored_pushflowcap_traced(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float,
    mode: Mode,
    floor: float,
) -> tuple[np.ndarray, FlowWork]:
    """:func:`floored_pushflowcap` and what it cost (:class:`FlowWork`)."""
    validate_pushflowcap(graph, seed, beta, rounds, sigma)
    mode = Mode(mode)
    tau = floor_threshold(beta, graph.n, floor)
    alpha = 1.0 - beta
    inv_degree, keeps, degrees, _ = node_arrays(graph)
    cap = degrees * edge_threshold(beta, sigma)
    pushed = np.zeros(graph.n)
    done, visits, reached = _floored_rounds(
        graph.indptr, graph.indices, inv_degree, keeps, cap, int(seed),
        mode is Mode.PERSONALIZED, (1.0 - alpha) / 2.0, tau, rounds, pushed,
    )  # fmt: skip
    out: np.ndarray = alpha * pushed
    return out, FlowWork(int(done), int(visits), int(reached))


def floored_pushflowcap_reference(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float,
    mode: Mode,
    floor: float,
) -> np.ndarray:
    """The recursion h = min(max(e_s + P h - tau, 0), c) on whole n-vectors, R times (numpy and
    scipy): the reference the kernel is tested against."""
    validate_pushflowcap(graph, seed, beta, rounds, sigma)
    tau = floor_threshold(beta, graph.n, floor)
    alpha = 1.0 - beta
    lazy = (1.0 - alpha) / 2.0
    degrees = graph.degrees.astype(np.float64)
    cap = degrees * edge_threshold(beta, sigma)
    if Mode(mode) is Mode.PERSONALIZED:
        cap[seed] = math.inf
    inv_degree = np.divide(1.0, degrees, out=np.zeros_like(degrees), where=degrees > 0)
    keeps = (degrees == 0).astype(np.float64)
    start = np.zeros(graph.n)
    start[seed] = 1.0
    pushed = np.zeros(graph.n)
    for _ in range(rounds):
        inflow = start + lazy * (pushed * (1.0 + keeps) + graph.adjacency @ (pushed * inv_degree))
        pushed = np.minimum(np.maximum(inflow - tau, 0.0), cap)
    out: np.ndarray = alpha * pushed
    return out


def warm_up_floored_kernel(indptr: np.ndarray, indices: np.ndarray) -> None:
    """Compile (or load from numba's cache) the kernel for these index dtypes."""
    tiny_indptr, tiny_indices, inv_degree, keeps, _ = warm_up_graph(indptr, indices)
    _floored_rounds(
        tiny_indptr, tiny_indices, inv_degree, keeps, np.ones(2), 0, False, 0.25, 0.0, 1,
        np.zeros(2),
    )  # fmt: skip


@njit(nogil=True, cache=True, fastmath=False)
def _floored_rounds(
    indptr: Any,
    indices: Any,
    inv_degree: Any,
    keeps: Any,
    cap: Any,
    seed: int,
    personalized: bool,
    lazy: float,
    tau: float,
    rounds: int,
    pushed: Any,
) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """The floored recursion into ``pushed`` (h, zeros on entry). Returns (rounds run, neighbour
    entries read, nodes that pushed)."""
    n = pushed.shape[0]
    inflow = np.zeros(n)  # I = e_s + P h: the flow each node has received so far
    inflow[seed] = 1.0
    listed = np.zeros(n, dtype=np.bool_)
    current = np.empty(n, dtype=np.int64)  # nodes whose inflow changed last round, above tau
    following = np.empty(n, dtype=np.int64)
    movers = np.empty(n, dtype=np.int64)
    moved = np.empty(n)
    current[0] = seed
    n_current = 1
    visits = 0
    reached = 0
    done = 0
    for _ in range(rounds):
        # h_v = min(max(I_v - tau, 0), c_v) for every node whose I changed; the rest keep theirs
        n_movers = 0
        for i in range(n_current):
            v = np.uint64(current[i])
            c = cap[v]
            if personalized and v == seed:
                c = np.inf
            x = inflow[v] - tau
            if x < 0.0:
                x = 0.0
            h = x if x < c else c
            step = h - pushed[v]
            if step > 0.0:
                if pushed[v] == 0.0:
                    reached += 1
                pushed[v] = h
                movers[n_movers] = v
                moved[n_movers] = step
                n_movers += 1
        if n_movers == 0:
            break  # a fixed point: every later round computes the same h
        done += 1
        # I += P (h^(i) - h^(i-1)), mover by mover, each neighbour list in CSR order; listed for
        # the next round: the nodes whose inflow changed and now exceeds tau
        n_following = 0
        for j in range(n_movers):
            v = movers[j]
            step = moved[j]
            inflow[v] += lazy * (step * (1.0 + keeps[v]))
            if not listed[v]:
                listed[v] = True
                following[n_following] = v
                n_following += 1
            add = lazy * (step * inv_degree[v])
            lo = indptr[v]
            hi = indptr[v + 1]
            for jj in range(lo, hi):
                u = np.uint64(indices[jj])  # unsigned: no wraparound test on the gather
                total = inflow[u] + add
                inflow[u] = total
                if total > tau and not listed[u]:  # below tau, h_u stays 0: nothing to do
                    listed[u] = True
                    following[n_following] = u
                    n_following += 1
            visits += hi - lo
        for i in range(n_following):
            listed[following[i]] = False
        current, following = following, current
        n_current = n_following
    return done, visits, reached
