"""An embedding release as the service stores and states it: the release key, the stored
form and the ``mechanism`` block of a DP-IE answer, and the free embedding of a stored
ranking. Pure functions; the serving path is :mod:`service.serving.embedding_query`.

**Stored form.** A DP-IE release is stored as a ranking release is (:class:`StoredRelease`,
the ledger's ``releases`` row and the replay cache), so admission, twins, Idempotency-Keys,
replays and reconciliation treat it exactly as any other answer: entry ``j`` of the stored
results is coordinate ``j``, named ``"j"``, its float64 value kept bit for bit. The release
key's mechanism names the parameters that make two requests the same release:
``dp_instant_embedding(k=256,sigma=0.001)``; the charge's mechanism is ``dp_instant_embedding``
with k and sigma in its parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from service.embeddings.free import free_embedding
from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.parameters import EMBEDDING_FLOOR
from service.graph.model import Graph
from service.ledger.release_format import StoredResults
from service.mechanisms.postprocess import RankedNode, score_grid
from service.privacy.laplace import LaplacePlan
from service.privacy.modes import Mode
from service.privacy.sampler import vector_release_delta

__all__ = [
    "DP_IE",
    "FREE_EMBEDDING",
    "embedding_key_mechanism",
    "free_embedding_of",
    "is_embedding_release",
    "mechanism_block",
    "released_vector",
    "stored_embedding",
    "stored_values",
]

#: The mechanism name of a DP-IE answer, its charge and its stored release.
DP_IE = "dp_instant_embedding"
#: The name of the free embedding of a stored release (no charge, no release of its own).
FREE_EMBEDDING = "instant_embedding_of_release"


def embedding_key_mechanism(k: int, sigma: float) -> str:
    """The release key's mechanism: DP-IE at these parameters (a different k or sigma is a
    different release; repr keeps sigma exact)."""
    return f"{DP_IE}(k={int(k)},sigma={float(sigma)!r})"


def is_embedding_release(key_mechanism: str) -> bool:
    return key_mechanism == DP_IE or key_mechanism.startswith(f"{DP_IE}(")


def stored_embedding(values: np.ndarray) -> StoredResults:
    """The stored form of a released embedding: coordinate j as the entry named ``"j"``."""
    values = np.asarray(values, dtype=np.float64)
    return StoredResults.of_lists([str(j) for j in range(values.shape[0])], values)


def stored_values(results: Sequence[RankedNode]) -> list[float]:
    """The coordinates of a stored embedding, in order."""
    out = [0.0] * len(results)
    for entry in results:
        out[int(entry.node)] = float(entry.score)
    return out


def mechanism_block(
    plan: LaplacePlan,
    mode: Mode,
    sigma: float,
    k: int,
    beta: float,
    rounds: int,
    salt_hex: str,
    floor: float = EMBEDDING_FLOOR,
) -> dict[str, Any]:
    """What a DP-IE answer states (and its charge records): epsilon, the sampler's stated
    delta (one edge may move all k coordinates), sigma, k, the sensitivity sigma n and the
    Laplace scale, the grid, the PushFlowCap parameters and the salt of the version's hash
    functions (public: drawn at random, never from the edges)."""
    return {
        "name": DP_IE,
        "mode": mode.value,
        "epsilon": plan.epsilon,
        "delta": vector_release_delta(plan.epsilon, k),
        "sigma": sigma,
        "dimension": k,
        "sensitivity": plan.sensitivity,
        "noise_scale": plan.scale,
        "score_grid": score_grid(plan.scale),
        "alpha": 1.0 - beta,
        "rounds": rounds,
        "floor": floor,
        "hash_salt": salt_hex,
    }


def released_vector(graph: Graph, results: Sequence[RankedNode], seed: int) -> np.ndarray:
    """A stored ranking release as a vector over the graph's nodes: its stored entries (the
    top ``PPR_REPLAY_STORE_TOP``, seed excluded), 0 elsewhere."""
    vector = np.zeros(graph.n, dtype=np.float64)
    if isinstance(results, StoredResults):
        _, _, scores = results.columns()
        names = [r.node for r in results]
    else:
        names = [r.node for r in results]
        scores = np.asarray([r.score for r in results], dtype=np.float64)
    if names:
        index = np.asarray([graph.index_of(name) for name in names], dtype=np.int64)
        vector[index] = scores
    vector[seed] = 0.0
    return vector


def free_embedding_of(
    graph: Graph, results: Sequence[RankedNode], seed: int, hashes: EmbeddingHashes,
    normalize: bool,
) -> np.ndarray:  # fmt: skip
    """The InstantEmbedding of a stored ranking release (negatives clipped; ``normalize``
    for scores that are not PPR mass): post-processing of what the caller may replay."""
    return free_embedding(released_vector(graph, results, seed), hashes, normalize=normalize)
