"""The hash functions of an embedding space: h_k : V -> {0..k-1} and h_sgn : V -> {-1, +1}.

InstantEmbedding (Algorithm 4) needs two uniform hash functions drawn ONCE per embedding space
and shared by every node's embedding, so that embeddings are comparable across workers,
restarts and replicas. They must not depend on the edges (spec-embeddings.md, Pitfalls): here
they are keyed BLAKE2b of the node's external id under a random per-graph-version ``salt``
(16 bytes from the OS entropy source, drawn when the version is first served and recorded with
it). The salt is not privacy noise and may be public; what it buys is that the functions are
fixed, uniform-looking and graph-independent. Bucket = the first 8 digest bytes as an unsigned
integer modulo k (bias at most k / 2^64), sign = the low bit of the 9th byte.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from service.errors import InvalidParameter

__all__ = ["SALT_BYTES", "EmbeddingHashes", "embedding_hashes", "new_salt"]

#: Length of a per-version salt.
SALT_BYTES = 16


def new_salt() -> bytes:
    """A fresh salt from the OS entropy source (drawn once per graph version, then recorded)."""
    return secrets.token_bytes(SALT_BYTES)


@dataclass(frozen=True, eq=False)
class EmbeddingHashes:
    """h_k and h_sgn evaluated on every node of a graph (internal index order)."""

    salt: bytes
    k: int
    buckets: np.ndarray  # int64, in [0, k)
    signs: np.ndarray  # float64, +1.0 or -1.0

    @property
    def salt_hex(self) -> str:
        return self.salt.hex()


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidParameter("k", f"must be an integer >= 1, got {k!r}")
    return k


def embedding_hashes(node_ids: Iterable[str], salt: bytes, k: int) -> EmbeddingHashes:
    """h_k and h_sgn of each external node id, in the order given (a graph's internal order).

    Depends on the ids, ``salt`` and ``k`` only - never on the edges.
    """
    k = _check_k(k)
    if not isinstance(salt, bytes) or not 1 <= len(salt) <= 64:
        raise InvalidParameter("salt", "must be 1 to 64 bytes")
    buckets: list[int] = []
    sign_bits: list[int] = []
    for node in node_ids:
        digest = hashlib.blake2b(str(node).encode("utf-8"), digest_size=16, key=salt).digest()
        buckets.append(int.from_bytes(digest[:8], "little") % k)
        sign_bits.append(digest[8] & 1)
    signs = 1.0 - 2.0 * np.asarray(sign_bits, dtype=np.float64)
    return EmbeddingHashes(salt, k, np.asarray(buckets, dtype=np.int64), signs)
