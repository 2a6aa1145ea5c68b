"""The free embedding of a stored release: InstantEmbedding of an already released vector.

A noisy PPR vector the service has released (noisy diffusion, or any other released score
vector) is public to whoever may replay it; its InstantEmbedding under the version's hash
functions is post-processing and costs nothing (spec-embeddings.md, "Free alternative"):

1. negatives are clipped to 0 (noise makes many entries negative);
2. with ``normalize``, the clipped vector is scaled to sum 1, so that scores that are not PPR
   probabilities (a `blended` release's standardized scores) get the same ln(n p) scale;
3. w = InstantEmbedding(., k).

A stored release keeps only its top ``PPR_REPLAY_STORE_TOP`` entries (:func:`stored_top`):
every other entry is 0 in the replay, so its free embedding is that of the top entries only.
Since z_v = max(ln(n p_v), 0) is non-zero only for p_v > 1/n, the truncation changes nothing
when every entry beyond the top is <= 1/n; how much it changes otherwise is measured in
docs/notes/2026-11-embedding-findings.md.
"""

from __future__ import annotations

import numpy as np

from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.instant import instant_embedding

__all__ = ["free_embedding", "stored_top"]


def stored_top(released: np.ndarray, top: int) -> np.ndarray:
    """The vector a replay of ``released`` holds: its ``top`` largest entries, 0 elsewhere
    (ties broken by index, as the stored ranking is)."""
    values = np.asarray(released, dtype=np.float64)
    out = np.zeros_like(values)
    if top >= values.shape[0]:
        return values.copy()
    keep = np.argsort(-values, kind="stable")[:top]
    out[keep] = values[keep]
    return out


def free_embedding(
    released: np.ndarray, hashes: EmbeddingHashes, normalize: bool = False
) -> np.ndarray:
    """InstantEmbedding of a released vector, negatives clipped (post-processing: free)."""
    clipped = np.clip(np.asarray(released, dtype=np.float64), 0.0, None)
    if normalize:
        total = float(clipped.sum())
        if total > 0:
            clipped = clipped / total
    return instant_embedding(clipped, hashes)
