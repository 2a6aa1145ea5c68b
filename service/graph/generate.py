"""Deterministic synthetic social graphs, and writing edge lists to files.

The model (all vectorised, seeded with ``np.random.default_rng(seed)``; this is test and
benchmark data, not the privacy path):

* Communities: ``communities`` contiguous blocks of node indices with sizes falling off as
  ``1/sqrt(rank)`` (a few big groups, many small ones). By default their average size is
  ``max(32, 3 * mean degree)``: small, dense groups like circles of friends.
* Power-law degrees (Chung-Lu): node ``i`` has weight ``sqrt(n / (r_i + 1))`` for a random
  rank ``r_i``, i.e. a degree tail with exponent about 3, like preferential attachment.
* Every node first gets one edge (when ``edges >= nodes``), so no node is isolated.
* Then edges pick an endpoint in proportion to weight and the other endpoint in proportion to
  weight, within the first one's community with probability ``1 - mixing`` (a degree-corrected
  stochastic block model), and
* a share ``closure`` of the edges close triangles (Holme-Kim style): ``u`` weighted, ``w`` a
  random neighbour of ``u``, ``v`` a random neighbour of ``w``, edge ``u-v``. This gives the
  clustering that makes friend-of-friend recommendations meaningful.

Candidates are drawn in batches; self-loops and repeats are discarded and batches are kept in
drawing order, the last one only in part (a uniform random subset), so the graph has exactly
``edges`` edges. Batches that still miss edges use the same model, later uniform pairs; for
small near-complete graphs the missing edges are picked among all absent pairs. Only
``Generator.random`` and correctly rounded float operations (``+ * / sqrt``, sequential
``cumsum``) feed the choices, so a seed gives the same graph, and the same ``version``, on
every platform. Node ids are ``"0" .. str(nodes - 1)``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
from pathlib import Path

import numpy as np

from service.graph.build import (
    assemble_graph,
    csr_from_keys,
    sorted_unique,
)
from service.graph.model import Graph
from service.graph.node_ids import is_canonical_int

_OVERSAMPLE = 1.08
_MAX_ROUNDS = 40
_ENUMERABLE_PAIRS = 5_000_000  # below this many node pairs, fill up from the absent pairs
_COMMUNITY_SIZE = 32  # smallest average community size
_COMMUNITY_PER_DEGREE = 3.0  # average community size per unit of mean degree


class _Model:
    """Weights, communities and samplers of one generator run."""

    def __init__(
        self, nodes: int, communities: int, mixing: float, rng: np.random.Generator
    ) -> None:
        self.n = nodes
        self.mixing = mixing
        self.rng = rng
        rank = np.argsort(rng.random(nodes), kind="stable")
        weight = np.sqrt(nodes / (rank + 1.0))
        self.cumw = np.cumsum(weight)
        self.total = float(self.cumw[-1])
        share = np.cumsum(1.0 / np.sqrt(np.arange(1, communities + 1, dtype=np.float64)))
        bounds = np.floor(share / share[-1] * nodes).astype(np.int64)
        bounds = np.maximum(bounds, np.arange(1, communities + 1))  # no empty block
        self.block_end = np.minimum(bounds, nodes)
        self.block_start = np.concatenate(([0], self.block_end[:-1]))
        self.community = np.repeat(
            np.arange(communities, dtype=np.int64), self.block_end - self.block_start
        )
        below = np.concatenate(([0.0], self.cumw))
        self.block_low = below[self.block_start]
        self.block_weight = below[self.block_end] - self.block_low

    def weighted(self, count: int) -> np.ndarray:
        """``count`` nodes drawn in proportion to weight, in increasing order (sorting the
        i.i.d. draws changes nothing but makes the search cache-friendly)."""
        target = np.sort(self.rng.random(count)) * self.total
        return np.minimum(np.searchsorted(self.cumw, target, side="right"), self.n - 1)

    def partners(self, u: np.ndarray) -> np.ndarray:
        """A weighted partner for each ``u``: in its community w.p. ``1 - mixing``."""
        c = self.community[u]
        inside = self.rng.random(u.size) >= self.mixing
        x = self.rng.random(u.size)
        target = np.where(inside, self.block_low[c] + x * self.block_weight[c], x * self.total)
        v = np.searchsorted(self.cumw, target, side="right")
        top = np.where(inside, self.block_end[c], self.n) - 1
        low = np.where(inside, self.block_start[c], 0)
        return np.clip(v, low, top)

    def chung_lu(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        u = self.weighted(count)
        return u, self.partners(u)

    def closures(self, keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Triangle-closing candidates u - (w) - v on the graph of ``keys``."""
        indptr, indices, degrees = csr_from_keys(keys, self.n)
        u = self.weighted(count)
        u = u[degrees[u] > 0]
        w = indices[indptr[u] + self._below(degrees[u])].astype(np.int64)
        v = indices[indptr[w] + self._below(degrees[w])].astype(np.int64)
        return u, v

    def _below(self, bound: np.ndarray) -> np.ndarray:
        """Uniform integers in [0, bound) (bound >= 1)."""
        pick = np.floor(self.rng.random(bound.size) * bound).astype(np.int64)
        capped: np.ndarray = np.minimum(pick, bound - 1)
        return capped

    def uniform(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        u = np.floor(self.rng.random(count) * self.n).astype(np.int64)
        v = np.floor(self.rng.random(count) * self.n).astype(np.int64)
        return np.minimum(u, self.n - 1), np.minimum(v, self.n - 1)


class _Collector:
    """Distinct edge keys: all of them sorted, and each batch's new ones."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.batches: list[np.ndarray] = []  # the keys each batch added, in batch order
        self.sorted = np.empty(0, dtype=np.int64)

    @property
    def size(self) -> int:
        return int(self.sorted.size)

    def add(self, u: np.ndarray, v: np.ndarray) -> None:
        lo = np.minimum(u, v).astype(np.int64)
        hi = np.maximum(u, v).astype(np.int64)
        proper = lo != hi
        batch = lo[proper] * self.n
        batch += hi[proper]
        unique = sorted_unique(batch)
        at = np.searchsorted(self.sorted, unique)
        seen = at < self.sorted.size
        seen[seen] = self.sorted[at[seen]] == unique[seen]
        fresh = ~seen
        self.batches.append(unique[fresh])
        self.sorted = np.insert(self.sorted, at[fresh], unique[fresh])

    def first(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` distinct keys, sorted: whole batches in drawing order, then a uniform
        random part of the batch that overshoots."""
        kept: list[np.ndarray] = []
        need = count
        for batch in self.batches:
            if batch.size <= need:
                kept.append(batch)
                need -= batch.size
            else:
                if need:
                    priority = rng.random(batch.size)
                    kept.append(batch[np.argpartition(priority, need - 1)[:need]])
                break
        return np.sort(np.concatenate(kept)) if kept else np.empty(0, dtype=np.int64)


def _absent_pairs(
    present: np.ndarray, n: int, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uniformly chosen node pairs whose keys are not in ``present`` (sorted)."""
    lo, hi = np.triu_indices(n, k=1)
    keys = lo.astype(np.int64) * n + hi
    absent = keys[~np.isin(keys, present, assume_unique=True)]
    chosen = absent[np.argpartition(rng.random(absent.size), count - 1)[:count]]
    return chosen // n, chosen % n


def generate_edge_keys(
    nodes: int,
    edges: int,
    seed: int = 0,
    *,
    communities: int | None = None,
    mixing: float = 0.1,
    closure: float = 0.3,
) -> np.ndarray:
    """Sorted canonical keys ``lo * nodes + hi`` of exactly ``edges`` distinct edges."""
    if nodes < 2:
        raise ValueError("nodes must be at least 2")
    if not 0 <= edges <= nodes * (nodes - 1) // 2:
        raise ValueError(f"edges must lie in [0, {nodes * (nodes - 1) // 2}] for {nodes} nodes")
    if not 0.0 <= mixing <= 1.0 or not 0.0 <= closure < 1.0:
        raise ValueError("mixing must lie in [0, 1] and closure in [0, 1)")
    if communities is None:
        mean_degree = 2.0 * edges / nodes
        communities = int(nodes // max(_COMMUNITY_SIZE, _COMMUNITY_PER_DEGREE * mean_degree))
    k = max(1, min(int(communities), nodes))
    model = _Model(nodes, k, mixing, np.random.default_rng(seed))
    found = _Collector(nodes)
    if edges == 0:
        return found.sorted
    if edges >= nodes:
        u = np.arange(nodes, dtype=np.int64)
        found.add(u, model.partners(u))
    want_closure = round(closure * edges) if nodes >= 3 else 0
    want_base = edges - want_closure
    if found.size < want_base:
        found.add(*model.chung_lu(int((want_base - found.size) * _OVERSAMPLE) + 16))
    if want_closure and found.size < edges:
        count = int((edges - found.size) * _OVERSAMPLE) + 16
        found.add(*model.closures(found.sorted, count))
    for round_no in range(_MAX_ROUNDS):
        missing = edges - found.size
        if missing <= 0:
            break
        count = int(missing * 1.5) + 64
        if round_no < 4:
            found.add(*model.chung_lu(count))
        elif nodes * (nodes - 1) // 2 <= _ENUMERABLE_PAIRS:
            found.add(*_absent_pairs(found.sorted, nodes, missing, model.rng))
        else:
            found.add(*model.uniform(count))
    else:  # pragma: no cover - only for huge near-complete graphs
        raise ValueError(f"could not draw {edges} distinct edges on {nodes} nodes")
    return found.first(edges, model.rng)


def generate_graph(
    nodes: int,
    edges: int,
    seed: int = 0,
    *,
    communities: int | None = None,
    mixing: float = 0.1,
    closure: float = 0.3,
    source: str | None = None,
) -> Graph:
    """A deterministic social-network-like graph with exactly ``nodes`` nodes (ids ``"0"`` ..
    ``str(nodes - 1)``) and ``edges`` edges; see the module docstring for the model and the
    options. 100k nodes / 2M edges take about a second, 1M / 10M about six."""
    keys = generate_edge_keys(
        nodes, edges, seed, communities=communities, mixing=mixing, closure=closure
    )
    if source is None:
        source = f"generated:nodes={nodes},edges={edges},seed={seed}"
    return assemble_graph(keys, [str(i) for i in range(nodes)], source=source)


# --------------------------------------------------------------------------- writing

_LINES_PER_BLOCK = 1 << 20
_POWERS = 10 ** np.arange(1, 19, dtype=np.int64)


def write_edge_list(
    path: str | os.PathLike[str],
    graph: Graph,
    *,
    separator: str = " ",
    compression: str | None = None,
    shuffle_seed: int | None = None,
) -> Path:
    """Write each undirected edge of ``graph`` once, ``u<separator>v`` per line, using the
    external ids. ``compression`` is ``"gzip"``, ``"bz2"``, ``"xz"`` or None (default: from the
    suffix ``.gz``/``.bz2``/``.xz``). ``shuffle_seed`` shuffles line order and flips directions
    at random. Loading the file gives back the same graph (same ``version``). Vectorised when
    the ids are integers (as for generated graphs); string ids go through Python strings."""
    target = Path(path)
    if compression is None:
        compression = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz"}.get(target.suffix)
    u, v = graph.edge_arrays()
    u = u.astype(np.int64)
    v = v.astype(np.int64)
    if shuffle_seed is not None:
        rng = np.random.default_rng(shuffle_seed)
        order = np.argsort(rng.random(u.size), kind="stable")
        flip = rng.random(u.size) < 0.5
        u, v = u[order], v[order]
        u, v = np.where(flip, v, u), np.where(flip, u, v)
    ids = [str(x) for x in graph.node_ids.tolist()]
    with _open_for_writing(target, compression) as out:
        if all(is_canonical_int(s) for s in ids):
            values = np.array([int(s) for s in ids], dtype=np.int64)
            sep = separator.encode("utf-8")
            for start in range(0, u.size, _LINES_PER_BLOCK):
                stop = start + _LINES_PER_BLOCK
                out.write(_format_int_pairs(values[u[start:stop]], values[v[start:stop]], sep))
        else:
            for start in range(0, u.size, _LINES_PER_BLOCK):
                stop = start + _LINES_PER_BLOCK
                pairs = zip(u[start:stop].tolist(), v[start:stop].tolist(), strict=True)
                out.write("".join(f"{ids[a]}{separator}{ids[b]}\n" for a, b in pairs).encode())
    return target


def write_generated_edge_list(
    path: str | os.PathLike[str],
    nodes: int,
    edges: int,
    seed: int = 0,
    *,
    separator: str = " ",
    compression: str | None = None,
) -> Graph:
    """Generate a graph, write it (lines shuffled) to ``path``; return the graph."""
    graph = generate_graph(nodes, edges, seed)
    write_edge_list(
        path, graph, separator=separator, compression=compression, shuffle_seed=seed + 1
    )
    return graph


def _open_for_writing(path: Path, compression: str | None) -> io.BufferedIOBase:
    if compression is None:
        return open(path, "wb")
    if compression == "gzip":
        return gzip.open(path, "wb", compresslevel=1)
    if compression == "bz2":
        return bz2.open(path, "wb")
    if compression == "xz":
        return lzma.open(path, "wb")
    raise ValueError(f"unknown compression {compression!r}")


def _format_int_pairs(a: np.ndarray, b: np.ndarray, sep: bytes) -> bytes:
    """``b"{a}{sep}{b}\\n"`` for each pair of non-negative integers, vectorised."""
    if a.size == 0:
        return b""
    la = np.searchsorted(_POWERS, a, side="right") + 1
    lb = np.searchsorted(_POWERS, b, side="right") + 1
    width = la + lb + (len(sep) + 1)
    ends = np.cumsum(width)
    starts = ends - width
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    _put_digits(out, starts + la - 1, a, la)
    for j, byte in enumerate(sep):
        out[starts + la + j] = byte
    _put_digits(out, starts + la + len(sep) + lb - 1, b, lb)
    out[ends - 1] = ord("\n")
    return out.tobytes()


def _put_digits(out: np.ndarray, last: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
    x = values.copy()
    for k in range(int(lengths.max())):
        more = lengths > k
        out[last[more] - k] = (x[more] % 10 + ord("0")).astype(np.uint8)
        x //= 10
