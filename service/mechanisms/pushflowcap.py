"""DP-PushFlowCap (Epasto et al., Algorithms 2 and 3): the baseline of privacy-spec.md Mechanism 2.

Push-flow PPR on the lazy walk with teleport alpha = 1 - beta, where every node v may push at
most d(v) * T_v of flow in total over all rounds (so at most T_v along each of its edges):

    T_u = sigma / (2 (2 - alpha))   for every u,   T_s = infinity in `personalized` (joint) mode.

Each of the R rounds pushes, for every node at once (the paper's "push all visited nodes"
variant), the flow f_v = min(r_v, d(v) T_v - h_v):

    h += f;  r -= f;  p += alpha f;  r += (1 - alpha)/2 f + (1 - alpha)/2 A (f / d)

(h = total flow pushed so far, p = alpha h by the paper's Observation 4.1). Nodes outside the
visited set have r = 0, so they push nothing and the set needs no bookkeeping. Theorem 4.3:
the output's L1 sensitivity is at most sigma to one edge not incident to s (joint mode) or to
any edge (non-joint), so adding Lap(sigma / eps) to every entry is pure eps-DP (Algorithm 3).

A node of degree 0 has cap 0 and never pushes, except the seed in personalized mode (cap
infinity): like the walk W, it then keeps the neighbours' share of its push (W e_s = e_s), so
with huge thresholds the output is the truncated series alpha sum_{k<R} ((1 - alpha) W)^k e_s.

The kernel. :func:`pushflowcap` and :func:`pushflowcap_block` run these rounds in a compiled
kernel (numba, fastmath off) that returns the SAME float64 vector as :func:`pushflowcap_dense`,
the numpy/scipy rounds kept as the reference (tests/test_pushflowcap_kernel.py: array_equal,
no tolerance), so Theorem 4.3 covers it with no new argument beyond the reference's own float64
rounding, which :mod:`service.mechanisms.pushflowcap_rounding` bounds and DP-IE's plan adds (the
evaluation-only :func:`dp_pushflowcap`, Algorithm 3, adds no such margin). Why each shortcut is
exact:

- every element-wise operation is the dense one in the same order: f = min(r, max(c - h, 0)),
  f / d as f * (1 / d), h + f, (r - f) + lazy (f (1 + keeps) + y);
- y = (A (f / d))_v is summed over v's neighbour list in CSR order from 0.0, as scipy's CSR
  product does (A is 0/1: no multiplications; four neighbours per pass are the same additions
  in the same order);
- a block of seeds keeps one column per seed, each summed in the same order as alone;
- offline (``skip_idle``), a row is skipped only if it has no flow and no neighbour with flow:
  its dense update adds +0.0 to non-negative numbers, which leaves them bit for bit as they
  were (rows are listed as the flow reaches them: the seed, then each pushing node's
  neighbours); and the rounds stop only after a round in which no node pushes, since every
  later dense round then adds only zeros too. The answers the service serves do not skip:
  how fast the flow spreads is an exact function of the edges, and it would show in the
  response time. At sigma 1e-3 the flow reaches every node of the generated 10k and 100k
  graphs within 5 of the 100 rounds, so the skip saves a few percent there.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
from numba import njit

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.parameters import PUSHFLOWCAP_SIGMA
from service.mechanisms.randomness import fresh_generator, laplace_noise
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_SIGMA",
    "add_laplace_noise",
    "dp_pushflowcap",
    "edge_threshold",
    "node_arrays",
    "pushflowcap",
    "pushflowcap_block",
    "pushflowcap_curve",
    "pushflowcap_dense",
    "validate_pushflowcap",
    "warm_up_graph",
    "warm_up_kernel",
]

#: The paper's experimental setting (Section 6): sigma = 1e-6 (service.mechanisms.parameters).
DEFAULT_SIGMA = PUSHFLOWCAP_SIGMA


def _finite_positive(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidParameter(name, f"must be a finite number > 0, got {value!r}")


def validate_pushflowcap(graph: Graph, seed: int, beta: float, rounds: int, sigma: float) -> None:
    if not (isinstance(beta, int | float) and math.isfinite(beta) and 0.0 < beta < 1.0):
        raise InvalidParameter("beta", f"must be in (0, 1), got {beta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidParameter("rounds", f"must be an integer >= 1, got {rounds!r}")
    _finite_positive("sigma", sigma)
    if not 0 <= seed < graph.n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {graph.n})")


def edge_threshold(beta: float, sigma: float) -> float:
    """T = sigma / (2 (2 - alpha)) with alpha = 1 - beta: the cap on flow along one edge."""
    alpha = 1.0 - beta
    return sigma / (2.0 * (2.0 - alpha))


def pushflowcap(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float = DEFAULT_SIGMA,
    mode: Mode = Mode.PERSONALIZED,
) -> np.ndarray:
    """PUSHFLOWCAP (Algorithm 2), non-private: the capped push-flow PPR vector p (sum <= 1).

    ``mode``: `personalized` is the paper's joint type (T_s = infinity), `edge` its non-joint
    type (T_s = T). ``seed`` is an internal index. Compiled (module docstring, "The kernel"):
    bit for bit the vector of :func:`pushflowcap_dense`.
    """
    validate_pushflowcap(graph, seed, beta, rounds, sigma)
    return pushflowcap_block(graph, np.array([seed]), beta, rounds, sigma, mode)[:, 0]


def pushflowcap_block(
    graph: Graph,
    seeds: np.ndarray,
    beta: float,
    rounds: int,
    sigma: float = DEFAULT_SIGMA,
    mode: Mode = Mode.PERSONALIZED,
    *,
    skip_idle: bool = False,
) -> np.ndarray:
    """:func:`pushflowcap` of each seed (internal indices), as the columns of an n x B array,
    in one pass over the graph per round (each column bit for bit that seed's vector).

    ``skip_idle`` visits only the rows the flow has reached and stops the rounds once no node
    pushes: the same vector, in a time that depends on how fast the flow spreads from the
    seeds, an exact function of the edges. Off, every row is visited in every round, as the
    dense rounds do: for answers whose response time a caller sees. On, for offline runs
    (the all-node release, the evaluation)."""
    seeds = np.ascontiguousarray(seeds, dtype=np.int64)
    if seeds.ndim != 1 or seeds.size == 0:
        raise InvalidParameter("seeds", "must be a non-empty list of internal indices")
    for s in (int(seeds.min()), int(seeds.max())):
        validate_pushflowcap(graph, s, beta, rounds, sigma)
    mode = Mode(mode)
    alpha = 1.0 - beta
    lazy = (1.0 - alpha) / 2.0
    inv_degree, keeps, degrees, order = node_arrays(graph)
    cap = degrees * edge_threshold(beta, sigma)  # total flow a node may push: d(v) T_v
    pushed = np.zeros((graph.n, seeds.size))
    _capped_push_rounds(
        graph.indptr, graph.indices, inv_degree, keeps, cap, seeds,
        mode is Mode.PERSONALIZED, lazy, rounds, pushed, order, not skip_idle,
    )  # fmt: skip
    out: np.ndarray = alpha * pushed
    return out


def warm_up_graph(
    indptr: np.ndarray, indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, 1 / d, keeps, order) of a two-node graph with the dtypes and
    write flags of ``indptr`` and ``indices`` and of what :func:`node_arrays` keeps: the
    arguments that make numba compile a PushFlowCap kernel for a served graph."""
    tiny_indptr = np.array([0, 1, 2], dtype=indptr.dtype)
    tiny_indices = np.array([1, 0], dtype=indices.dtype)
    tiny_indptr.setflags(write=indptr.flags.writeable)
    tiny_indices.setflags(write=indices.flags.writeable)
    inv_degree, keeps, order = np.ones(2), np.zeros(2), np.arange(2, dtype=np.int64)
    for array in (inv_degree, keeps, order):  # as node_arrays keeps them
        array.setflags(write=False)
    return tiny_indptr, tiny_indices, inv_degree, keeps, order


def warm_up_kernel(indptr: np.ndarray, indices: np.ndarray) -> None:
    """Compile (or load from numba's cache) the kernel for these index dtypes, on a two-node
    graph, before traffic arrives."""
    tiny_indptr, tiny_indices, inv_degree, keeps, order = warm_up_graph(indptr, indices)
    _capped_push_rounds(
        tiny_indptr, tiny_indices, inv_degree, keeps, np.ones(2), np.zeros(1, dtype=np.int64),
        False, 0.25, 1, np.zeros((2, 1)), order, True,
    )  # fmt: skip


_NODE_ARRAYS: weakref.WeakKeyDictionary[
    Graph, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
] = weakref.WeakKeyDictionary()


#: Rows are visited in windows of this many consecutive nodes, by degree within a window, so
#: that four rows summed side by side have about the same length (and stay near in memory).
ROW_WINDOW = 256


def node_arrays(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(1 / d (0 where d = 0), [d = 0], d) in float64, as :func:`pushflowcap_dense` computes
    them, and the order the kernel visits every row in; kept per graph (they do not depend
    on the query)."""
    arrays = _NODE_ARRAYS.get(graph)
    if arrays is None:
        degrees = graph.degrees.astype(np.float64)
        inv_degree = np.divide(1.0, degrees, out=np.zeros_like(degrees), where=degrees > 0)
        keeps = (degrees == 0).astype(np.float64)
        top = int(graph.degrees.max(initial=0)) + 1
        window = np.arange(graph.n, dtype=np.int64) // ROW_WINDOW
        order = np.argsort(window * top + (top - 1 - graph.degrees), kind="stable")
        for array in (degrees, inv_degree, keeps, order):
            array.setflags(write=False)
        arrays = (inv_degree, keeps, degrees, order)
        _NODE_ARRAYS[graph] = arrays
    return arrays


@njit(nogil=True, cache=True, fastmath=False, inline="always")
def _row_sum(indptr: Any, indices: Any, flat: Any, v: int) -> float:  # pragma: no cover
    """sum of flat[u] over v's neighbour list, in order from 0.0."""
    total = 0.0
    for jj in range(indptr[v], indptr[v + 1]):
        total += flat[np.uint64(indices[jj])]
    return total


@njit(nogil=True, cache=True, fastmath=False, inline="always")
def _update_row(
    v: int, total: float, flow: Any, pushed: Any, residual: Any, keeps: Any, lazy: float
) -> None:  # pragma: no cover - compiled
    f = flow[v, 0]
    pushed[v, 0] += f
    r = residual[v, 0] - f
    residual[v, 0] = r + lazy * (f * (1.0 + keeps[v]) + total)


@njit(nogil=True, cache=True, fastmath=False)
def _pull_one_column(
    indptr: Any,
    indices: Any,
    rows: Any,
    n_rows: int,
    flat: Any,
    flow: Any,
    pushed: Any,
    residual: Any,
    keeps: Any,
    lazy: float,
) -> None:  # pragma: no cover - compiled
    """One seed's row updates, four rows side by side: each row's sum is a chain of dependent
    additions (its order is fixed), so four chains at once keep the adder busy. Each row is
    still summed alone, over its neighbour list in order from 0.0."""
    i = 0
    while i + 4 <= n_rows:
        v0 = rows[i]
        v1 = rows[i + 1]
        v2 = rows[i + 2]
        v3 = rows[i + 3]
        a0 = indptr[v0]
        a1 = indptr[v1]
        a2 = indptr[v2]
        a3 = indptr[v3]
        e0 = indptr[v0 + 1]
        e1 = indptr[v1 + 1]
        e2 = indptr[v2 + 1]
        e3 = indptr[v3 + 1]
        common = min(min(e0 - a0, e1 - a1), min(e2 - a2, e3 - a3))
        t0 = 0.0
        t1 = 0.0
        t2 = 0.0
        t3 = 0.0
        for t in range(common):
            t0 += flat[np.uint64(indices[a0 + t])]
            t1 += flat[np.uint64(indices[a1 + t])]
            t2 += flat[np.uint64(indices[a2 + t])]
            t3 += flat[np.uint64(indices[a3 + t])]
        for jj in range(a0 + common, e0):
            t0 += flat[np.uint64(indices[jj])]
        for jj in range(a1 + common, e1):
            t1 += flat[np.uint64(indices[jj])]
        for jj in range(a2 + common, e2):
            t2 += flat[np.uint64(indices[jj])]
        for jj in range(a3 + common, e3):
            t3 += flat[np.uint64(indices[jj])]
        _update_row(v0, t0, flow, pushed, residual, keeps, lazy)
        _update_row(v1, t1, flow, pushed, residual, keeps, lazy)
        _update_row(v2, t2, flow, pushed, residual, keeps, lazy)
        _update_row(v3, t3, flow, pushed, residual, keeps, lazy)
        i += 4
    while i < n_rows:
        v = rows[i]
        _update_row(v, _row_sum(indptr, indices, flat, v), flow, pushed, residual, keeps, lazy)
        i += 1


@njit(nogil=True, cache=True, fastmath=False)
def _capped_push_rounds(
    indptr: Any,
    indices: Any,
    inv_degree: Any,
    keeps: Any,
    cap: Any,
    seeds: Any,
    personalized: bool,
    lazy: float,
    rounds: int,
    pushed: Any,
    order: Any,
    every_row: bool,
) -> int:  # pragma: no cover - compiled
    """Algorithm 2 for the seeds' columns of ``pushed`` (n x B, zeros on entry): the dense
    rounds of :func:`pushflowcap_dense`, operation for operation, on the rows that can change
    (``every_row``: on every row, every round, as the dense rounds do, in ``order``).

    Returns the number of rounds after which no seed had flow left to push (<= ``rounds``;
    ``rounds`` with ``every_row``)."""
    n, width = pushed.shape
    residual = np.zeros((n, width))
    flow = np.zeros((n, width))
    share = np.zeros((n, width))  # f / d, the operand of the sparse product
    flat = share.reshape(n * width)  # the same memory, as one column when width is 1
    y = np.zeros(width)
    rows = np.empty(n, dtype=np.int64)  # nodes that may hold flow, or receive it
    listed = np.zeros(n, dtype=np.bool_)
    expanded = np.zeros(n, dtype=np.bool_)  # its neighbours are listed
    n_rows = 0
    if every_row:
        for i in range(n):
            rows[i] = order[i]
        listed[:] = True
        expanded[:] = True
        n_rows = n
    for b in range(width):
        s = seeds[b]
        residual[s, b] = 1.0
        if not listed[s]:
            listed[s] = True
            rows[n_rows] = s
            n_rows += 1
    for done in range(rounds):
        # flow f_v = min(r_v, max(cap_v - h_v, 0)) from the round's starting residual; a row
        # not listed has r = 0, hence f = 0
        moving = False
        n_listed = n_rows
        for i in range(n_listed):
            v = rows[i]
            pushes = False
            for b in range(width):
                c = cap[v]
                if personalized and seeds[b] == v:
                    c = np.inf
                room = c - pushed[v, b]
                if room < 0.0:
                    room = 0.0
                r = residual[v, b]
                f = r if r < room else room  # np.minimum: either operand when equal
                flow[v, b] = f
                share[v, b] = f * inv_degree[v]
                if f > 0.0:
                    pushes = True
            if pushes:
                moving = True
                if not expanded[v]:
                    expanded[v] = True
                    for jj in range(indptr[v], indptr[v + 1]):
                        u = indices[jj]
                        if not listed[u]:
                            listed[u] = True
                            rows[n_rows] = u
                            n_rows += 1
        if not moving and not every_row:
            return done  # every later round would change nothing
        if n_rows > n_listed:  # rows in index order: the neighbour lists are read in order
            rows[:n_rows].sort()
        # h += f; r -= f; r += lazy (f (1 + keeps) + A (f / d)), row by row; a row with no
        # pushing neighbour and no flow of its own sums only zeros and stays as it is
        if width == 1:
            _pull_one_column(indptr, indices, rows, n_rows, flat, flow, pushed, residual,
                             keeps, lazy)  # fmt: skip
            continue
        for i in range(n_rows):
            v = rows[i]
            lo = indptr[v]
            hi = indptr[v + 1]
            for b in range(width):
                y[b] = 0.0
            jj = lo
            while jj + 4 <= hi:  # four neighbours per pass, each column summed in order
                a = np.uint64(indices[jj])  # unsigned: no wraparound test on the gather
                c = np.uint64(indices[jj + 1])
                d = np.uint64(indices[jj + 2])
                e = np.uint64(indices[jj + 3])
                for b in range(width):
                    y[b] = (((y[b] + share[a, b]) + share[c, b]) + share[d, b]) + share[e, b]
                jj += 4
            while jj < hi:
                a = np.uint64(indices[jj])
                for b in range(width):
                    y[b] += share[a, b]
                jj += 1
            for b in range(width):
                f = flow[v, b]
                pushed[v, b] += f
                r = residual[v, b] - f
                residual[v, b] = r + lazy * (f * (1.0 + keeps[v]) + y[b])
    return rounds


def pushflowcap_dense(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float = DEFAULT_SIGMA,
    mode: Mode = Mode.PERSONALIZED,
) -> np.ndarray:
    """The reference implementation of :func:`pushflowcap`: Algorithm 2 as numpy and scipy
    operations on whole n-vectors, one sparse product per round. The compiled kernel must
    equal it bit for bit (tests/test_pushflowcap_kernel.py); it is kept for that test."""
    validate_pushflowcap(graph, seed, beta, rounds, sigma)
    mode = Mode(mode)
    alpha = 1.0 - beta
    lazy = (1.0 - alpha) / 2.0
    degrees = graph.degrees.astype(np.float64)
    cap = degrees * edge_threshold(beta, sigma)  # total flow a node may push: d(v) T_v
    if mode is Mode.PERSONALIZED:
        cap[seed] = math.inf
    inv_degree = np.divide(1.0, degrees, out=np.zeros_like(degrees), where=degrees > 0)
    keeps = (degrees == 0).astype(np.float64)  # degree-0 nodes keep the neighbours' share
    adjacency = graph.adjacency
    residual = np.zeros(graph.n)
    residual[seed] = 1.0
    pushed = np.zeros(graph.n)  # h: total flow pushed by each node so far
    for _ in range(rounds):
        flow = np.minimum(residual, np.maximum(cap - pushed, 0.0))
        pushed += flow
        residual -= flow
        residual += lazy * (flow * (1.0 + keeps) + adjacency @ (flow * inv_degree))
    return alpha * pushed


def add_laplace_noise(
    p: np.ndarray, sigma: float, epsilon: float, rng: np.random.Generator | None = None
) -> np.ndarray:
    """p + Lap(sigma / epsilon)^n (Algorithm 3's Laplace step; the SCALE is sigma / epsilon).

    ``rng`` defaults to a generator freshly seeded from the OS entropy source.
    """
    _finite_positive("sigma", sigma)
    _finite_positive("epsilon", epsilon)
    rng = rng if rng is not None else fresh_generator()
    values = np.asarray(p, dtype=np.float64)
    noise = laplace_noise(rng, sigma / epsilon, values.size).reshape(values.shape)
    out: np.ndarray = values + noise
    return out


def dp_pushflowcap(
    graph: Graph,
    seed: int,
    beta: float,
    rounds: int,
    sigma: float,
    epsilon: float,
    mode: Mode = Mode.PERSONALIZED,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """DPPUSHFLOWCAP (Algorithm 3): pure epsilon-DP (joint DP in `personalized` mode).

    ``rng`` defaults to a generator freshly seeded from the OS entropy source; tests may pass
    their own. The privacy cost is :func:`pushflowcap_curve` (epsilon).
    """
    _finite_positive("epsilon", epsilon)
    p = pushflowcap(graph, seed, beta, rounds, sigma, mode)
    return add_laplace_noise(p, sigma, epsilon, rng)


def pushflowcap_curve(epsilon: float) -> RdpCurve:
    """RDP cost of one DP-PushFlowCap release: the Laplace mechanism's curve at epsilon."""
    _finite_positive("epsilon", epsilon)
    return laplace_curve(epsilon)
