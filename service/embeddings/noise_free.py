"""The noise-free part of DP-IE, w = InstantEmbedding(PushFlowCap(G, s), k), kept per graph.

Everything in a DP-IE answer before the Laplace step is a deterministic function of the graph
version, the seed and the public parameters (mode, sigma, beta, R, the floor, k and the
version's salt): :class:`NoiseFreeEmbeddings` computes it (:func:`capped_vectors`: PushFlowCap
with the floor, :mod:`service.mechanisms.floored_pushflowcap`, then
:func:`service.embeddings.instant.instant_embedding`) and keeps the last ones in memory, so
that asking again for the same node costs only the noise. What it keeps is an exact function of
the edges, like the graph it was computed from, in the same process; it is never released:
every answer adds its own fresh noise to it and is charged as before (docs/embeddings.md, "How
fast").

With the floor, a seed's PushFlowCap reads only the nodes the flow reaches above the floor, so
how long it takes depends on the edges near the seed; response timing is outside the bounds of
docs/privacy.md (section 2), as for the count rankings' lazy paths. At floor 0 (the paper's
Algorithm 2) a group computes its missing vectors together, up to ``block`` seeds per pass over
the graph, every row in every round.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from service.embeddings.hashing import EmbeddingHashes
from service.embeddings.instant import instant_embedding
from service.embeddings.parameters import EMBEDDING_FLOOR
from service.graph.model import Graph
from service.mechanisms.floored_pushflowcap import pushflowcap_with_floor
from service.mechanisms.pushflowcap import pushflowcap_block
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_BYTES",
    "NoiseFreeEmbeddings",
    "capped_vectors",
    "default_threads",
    "noise_free_embeddings",
]

#: What the kept vectors may take in one process: 8,192 vectors at k 256.
DEFAULT_BYTES = 16 * 1024 * 1024
#: Seeds per pass over the graph: per seed, a block of 16 costs a fraction of one seed alone
#: (docs/embeddings.md, "How fast"); its state is 5 x 8 x 16 bytes per node (64 MB at 100,000
#: nodes) per thread.
DEFAULT_BLOCK = 16

Progress = Callable[[int, int], None]


def default_threads() -> int:
    """The cores this process may run on (``taskset`` limits them)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - not Linux


def capped_vectors(
    graph: Graph,
    seeds: np.ndarray,
    sigma: float,
    mode: Mode,
    *,
    beta: float,
    rounds: int,
    floor: float,
    skip_idle: bool = False,
) -> Iterator[np.ndarray]:
    """DP-IE's PushFlowCap vector of each seed, in order: with a floor (> 0),
    :func:`service.mechanisms.floored_pushflowcap.floored_pushflowcap` of each seed, which
    reads only where the flow goes; at floor 0, the paper's Algorithm 2 for all the seeds in
    one pass (:func:`service.mechanisms.pushflowcap.pushflowcap_block`, every row in every
    round unless ``skip_idle``), column by column."""
    if floor == 0:
        block = pushflowcap_block(graph, seeds, beta, rounds, sigma, mode, skip_idle=skip_idle)
        for column in range(seeds.size):
            yield block[:, column]
        return
    for seed in seeds:
        yield pushflowcap_with_floor(graph, int(seed), beta, rounds, sigma, mode, floor)


def noise_free_embeddings(
    graph: Graph,
    hashes: EmbeddingHashes,
    seeds: np.ndarray,
    sigma: float,
    mode: Mode,
    *,
    beta: float,
    rounds: int,
    floor: float = EMBEDDING_FLOOR,
    block: int = DEFAULT_BLOCK,
    threads: int | None = None,
    skip_idle: bool = True,
    progress: Progress | None = None,
    inspect: Callable[[int, np.ndarray], None] | None = None,
) -> np.ndarray:
    """Row i: ``instant_embedding(p, hashes)`` of seeds[i]'s PushFlowCap vector p
    (:func:`capped_vectors`) bit for bit, for offline runs (the all-node release, the
    evaluation): ``block`` seeds per task, tasks on ``threads`` threads (the kernels release
    the GIL); at floor 0 rows skipped while the flow has not reached them (``skip_idle``).
    ``inspect(i, p)`` sees each PushFlowCap vector (under a lock) before it is dropped. No
    argument checks here."""
    seeds = np.asarray(seeds, dtype=np.int64)
    threads = default_threads() if threads is None else threads
    out = np.zeros((seeds.size, hashes.k), dtype=np.float64)
    starts = range(0, seeds.size, block)
    lock = threading.Lock()
    done = 0

    def one_block(start: int) -> None:
        nonlocal done
        part = seeds[start : start + block]
        capped = capped_vectors(
            graph, part, sigma, mode, beta=beta, rounds=rounds, floor=floor, skip_idle=skip_idle
        )
        for column, p in enumerate(capped):
            out[start + column] = instant_embedding(p, hashes)
            if inspect is not None:
                with lock:
                    inspect(start + column, p)
        with lock:
            done += part.size
            if progress is not None:
                progress(done, seeds.size)

    if threads == 1 or len(starts) <= 1:
        for start in starts:
            one_block(start)
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(starts))) as pool:
            for finished in [pool.submit(one_block, start) for start in starts]:
                finished.result()
    return out


_Key = tuple[str, str, int, str, float, float, int, float, bytes, int]


class NoiseFreeEmbeddings:
    """The noise-free DP-IE vectors last computed in this process, at most ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES, block: int = DEFAULT_BLOCK) -> None:
        self._max_bytes = max_bytes
        self._block = block
        self._lock = threading.Lock()
        self._kept: OrderedDict[_Key, np.ndarray] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(
        graph: Graph, seed: int, hashes: EmbeddingHashes, sigma: float, mode: Mode,
        beta: float, rounds: int, floor: float,
    ) -> _Key:  # fmt: skip
        return (
            graph.fingerprint, graph.version, int(seed), Mode(mode).value, float(sigma),
            float(beta), int(rounds), float(floor), hashes.salt, hashes.k,
        )  # fmt: skip

    def vector(
        self, graph: Graph, seed: int, hashes: EmbeddingHashes, sigma: float, mode: Mode,
        beta: float, rounds: int, floor: float = EMBEDDING_FLOOR,
    ) -> np.ndarray:  # fmt: skip
        """w of one seed (read-only float64, k entries)."""
        return self.vectors(graph, [seed], hashes, sigma, mode, beta, rounds, floor)[0]

    def vectors(
        self, graph: Graph, seeds: Sequence[int], hashes: EmbeddingHashes, sigma: float,
        mode: Mode, beta: float, rounds: int, floor: float = EMBEDDING_FLOOR,
    ) -> list[np.ndarray]:  # fmt: skip
        """w of each seed, in order; the missing ones computed together."""
        keys = [self._key(graph, s, hashes, sigma, mode, beta, rounds, floor) for s in seeds]
        found: dict[_Key, np.ndarray] = {}
        with self._lock:
            for key in keys:
                hit = self._kept.get(key)
                if hit is not None:
                    self._kept.move_to_end(key)
                    found[key] = hit
            self.hits += len(found)
        missing = list(dict.fromkeys(key for key in keys if key not in found))
        for start in range(0, len(missing), self._block):
            part = missing[start : start + self._block]
            capped = capped_vectors(
                graph, np.array([key[2] for key in part], dtype=np.int64), sigma, mode,
                beta=beta, rounds=rounds, floor=floor,
            )  # fmt: skip
            for key, p in zip(part, capped, strict=True):
                w = instant_embedding(p, hashes)
                w.setflags(write=False)
                found[key] = w
                self._keep(key, w)
        return [found[key] for key in keys]

    def _keep(self, key: _Key, w: np.ndarray) -> None:
        with self._lock:
            self.misses += 1
            if w.nbytes > self._max_bytes:
                return
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._kept[key] = w
            self._bytes += w.nbytes
            while self._bytes > self._max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes
