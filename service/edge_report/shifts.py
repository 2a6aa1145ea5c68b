"""The exact prefix quantities of one edge (w, lam, h) for many seeds, with the served kernel.

G' is G with the edge toggled (removed if present, added if absent). Both prefixes run the
service's own thresholded step (:func:`service.mechanisms.engine.thresholded_step`) for all the
seeds of one parameter set at once, one column per seed, so the values are those of the
float64 prefixes the mechanism serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from service.graph.model import Graph
from service.mechanisms.engine import thresholded_step
from service.mechanisms.operator import WalkOperator
from service.privacy.modes import Mode
from service.privacy.per_edge import PrefixShifts

#: Seeds computed together in one block (n x this many float64 values per block).
BLOCK_COLUMNS = 128


def has_edge(graph: Graph, u: int, v: int) -> bool:
    row = graph.neighbors(u)
    i = int(np.searchsorted(row, v))
    return i < row.shape[0] and int(row[i]) == v


def toggled_graph(graph: Graph, u: int, v: int) -> Graph:
    """G with the edge {u, v} removed if present, else added (same nodes, same order)."""
    if u == v or not (0 <= u < graph.n and 0 <= v < graph.n):
        raise ValueError("an edge joins two distinct nodes of the graph")
    present = has_edge(graph, u, v)
    indptr = graph.indptr.astype(np.int64)
    indices = np.asarray(graph.indices)
    degrees = graph.degrees.astype(np.int64).copy()
    # positions in the flat neighbour array, in decreasing order so edits do not shift them
    edits = sorted(
        (
            (a, b, int(indptr[a] + np.searchsorted(graph.neighbors(a), b)))
            for a, b in ((u, v), (v, u))
        ),
        key=lambda t: t[2],
        reverse=True,
    )
    for a, b, pos in edits:
        if present:
            indices = np.delete(indices, pos)
            degrees[a] -= 1
        else:
            indices = np.insert(indices, pos, b)
            degrees[a] += 1
    new_indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(indptr.dtype)
    return Graph(
        indptr=new_indptr.astype(graph.indptr.dtype),
        indices=indices.astype(graph.indices.dtype),
        degrees=degrees,
        ids=graph.ids,
        version=graph.version + "+toggled",
        stats=replace(graph.stats, edges=graph.stats.edges + (-1 if present else 1)),
        fingerprint=graph.fingerprint + "+toggled",
        degree_bound=graph.degree_bound,
    )


class _Stepper:
    """F(x) = phi(f(x)) on one graph for a block of seeds with one parameter set."""

    def __init__(self, graph: Graph, seeds: np.ndarray, mode: Mode, beta: float, eta: float):
        self.op = WalkOperator(graph, 1)
        width = seeds.shape[0]
        self.seeds = seeds
        self.betas = np.full(width, beta)
        self.etas = np.full(width, eta)
        self.personalized = np.full(width, mode is Mode.PERSONALIZED)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = thresholded_step(
            self.op, x, seeds=self.seeds, betas=self.betas, etas=self.etas,
            personalized=self.personalized,
        )  # fmt: skip
        return np.array(out, dtype=np.float64)


def prefix_shifts(
    graph: Graph,
    toggled: Graph,
    seeds: Sequence[int],
    *,
    mode: Mode,
    beta: float,
    eta: float,
    noise_free_steps: int,
) -> list[PrefixShifts]:
    """w, lam and both h vectors of the edge toggled between ``graph`` and ``toggled``, for
    each seed (internal indices), after ``noise_free_steps`` = m thresholded steps."""
    out: list[PrefixShifts] = []
    for lo in range(0, len(seeds), BLOCK_COLUMNS):
        block = np.asarray(seeds[lo : lo + BLOCK_COLUMNS], dtype=np.int64)
        on_g = _Stepper(graph, block, mode, beta, eta)
        on_t = _Stepper(toggled, block, mode, beta, eta)
        x = np.zeros((graph.n, block.shape[0]))
        x[block, np.arange(block.shape[0])] = 1.0
        xt = x.copy()
        for _ in range(noise_free_steps):
            x, xt = on_g(x), on_t(xt)
        g_x, t_xt, g_xt, t_x = on_g(x), on_t(xt), on_g(xt), on_t(x)
        w = np.abs(x - xt).sum(axis=0)
        lam = np.abs(g_x - t_xt).sum(axis=0)
        forward = np.abs(t_xt - g_xt)
        reverse = np.abs(g_x - t_x)
        for j in range(block.shape[0]):
            out.append(
                PrefixShifts(
                    w=float(w[j]),
                    lam=float(lam[j]),
                    h_forward=forward[forward[:, j] > 0, j],
                    h_reverse=reverse[reverse[:, j] > 0, j],
                )
            )
    return out
