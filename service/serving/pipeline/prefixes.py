"""Noise-free prefixes of the diffusion: the part of a query computed before any noise."""

from __future__ import annotations

import numpy as np

from service.cache.caches import PrefixCache
from service.graph.model import Graph
from service.mechanisms.diffusion import noise_free_prefix
from service.privacy.modes import Mode
from service.serving.prefix_tables import SharedPrefixTables


class PrefixProvider:
    """Noise-free prefixes: from the machine-wide table of every seed's prefix when it holds
    these parameters (:mod:`service.serving.prefix_tables`), else memoized per process by
    (graph version, seed, mode, beta, eta, m)."""

    def __init__(
        self, cache: PrefixCache | None = None, tables: SharedPrefixTables | None = None
    ) -> None:
        self._cache = cache
        self.tables = tables

    def lookup(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int
    ) -> np.ndarray | None:
        """The prefix (a read-only array), or None (the engine then computes it with the
        query)."""
        if self.tables is not None:
            row = self.tables.lookup(graph, seed, mode, beta, eta, m)
            if row is not None:
                return row
        if self._cache is None:
            return None
        hit = self._cache.get(graph.version, seed, mode.value, beta, eta, m)
        return hit if hit is not None and hit.shape == (graph.n,) else None

    def remember(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int,
        prefix: np.ndarray,
    ) -> None:  # fmt: skip
        if self._cache is not None:
            self._cache.put(graph.version, seed, mode.value, beta, eta, m, prefix)

    def get(
        self, graph: Graph, seed: int, mode: Mode, beta: float, eta: float, m: int
    ) -> np.ndarray:
        prefix = self.lookup(graph, seed, mode, beta, eta, m)
        if prefix is None:
            prefix = noise_free_prefix(graph, seed, mode, beta, eta, m)
            self.remember(graph, seed, mode, beta, eta, m, prefix)
        return prefix
