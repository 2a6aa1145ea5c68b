"""The hash functions of the embeddings, per graph version and dimension, keyed by the
version's salt as the ledger records it."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from service.embeddings.hashing import EmbeddingHashes, embedding_hashes, new_salt
from service.graph.model import Graph
from service.ledger.ledger import Ledger

__all__ = ["EmbeddingSpaces"]


class EmbeddingSpaces:
    """The hash functions h_k, h_sgn of each (graph version, k), keyed by the version's salt
    as the ledger records it (drawn once per version, the same on every worker), kept for the
    last ``capacity`` pairs in this process."""

    def __init__(self, ledger: Ledger, capacity: int = 8) -> None:
        self._ledger = ledger
        self._capacity = capacity
        self._lock = threading.Lock()
        self._salts: dict[str, bytes] = {}
        self._spaces: OrderedDict[tuple[str, int], EmbeddingHashes] = OrderedDict()

    def salt(self, graph_version: str) -> bytes:
        """The version's salt (recorded once, never changed: safe to keep)."""
        hit = self._salts.get(graph_version)
        if hit is None:
            hit = self._ledger.embedding_salts.embedding_salt(graph_version, new_salt)
            with self._lock:
                if len(self._salts) > 64:
                    self._salts.clear()
                self._salts[graph_version] = hit
        return hit

    def hashes(self, graph: Graph, k: int) -> EmbeddingHashes:
        key = (graph.version, k)
        with self._lock:
            hit = self._spaces.get(key)
            if hit is not None:
                self._spaces.move_to_end(key)
                return hit
        ids = graph.external_ids(np.arange(graph.n, dtype=np.int64))
        made = embedding_hashes(ids, self.salt(graph.version), k)
        with self._lock:
            self._spaces[key] = made
            while len(self._spaces) > self._capacity:
                self._spaces.popitem(last=False)
        return made
