"""The compiled PushFlowCap kernel equals the dense reference bit for bit.

:func:`service.mechanisms.pushflowcap.pushflowcap` (one seed) and :func:`pushflowcap_block`
(many seeds per pass) run Algorithm 2 in a numba kernel that visits only the rows that can
change and stops when no seed has flow left. Theorem 4.3's bound is for the algorithm as the
dense :func:`pushflowcap_dense` computes it, so the kernel must return the SAME float64 vector:
``np.array_equal``, no tolerance, on generated graphs, a real one, graphs with isolated nodes,
every sigma regime (caps binding everywhere, nowhere, in between), both modes, several R; and
at floor 0 (the paper's Algorithm 2) the DP-IE release built on it equals the one built on the
dense vector for the same noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.embeddings.dp import EMBEDDING_BETA, dp_instant_embedding
from service.embeddings.hashing import embedding_hashes
from service.embeddings.instant import instant_embedding
from service.embeddings.noise_free import NoiseFreeEmbeddings
from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.mechanisms.floored_pushflowcap import floored_pushflowcap
from service.mechanisms.pushflowcap import (
    _capped_push_rounds,
    edge_threshold,
    node_arrays,
    pushflowcap,
    pushflowcap_block,
    pushflowcap_dense,
)
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges, random_graph
from tests.shared_data import shared_file

P, E = Mode.PERSONALIZED, Mode.EDGE
SIGMAS = (1e-7, 1e-5, 1e-3, 1e-1, 1.0, 1e6)


def _graphs() -> list[tuple[str, Graph]]:
    rng = np.random.default_rng(7)
    isolated = graph_from_edges({(0, 1), (1, 2), (2, 0), (3, 4)}, 8)  # 5, 6, 7 isolated
    return [
        ("generated 400/3000", generate_graph(400, 3000, seed=1)),
        ("generated 1500/30000", generate_graph(1500, 30000, seed=2)),
        ("sparse random", random_graph(120, 0.02, rng)),
        ("dense random", random_graph(60, 0.5, rng)),
        ("with isolated nodes", isolated),
        ("path", graph_from_edges({(i, i + 1) for i in range(30)})),
        ("star", graph_from_edges({(0, i) for i in range(1, 40)})),
    ]


GRAPHS = _graphs()


def _seeds(graph: Graph, count: int, salt: int) -> list[int]:
    rng = np.random.default_rng(salt)
    picked = rng.choice(graph.n, size=min(count, graph.n), replace=False).tolist()
    return sorted({0, graph.n - 1, *picked})


@pytest.mark.parametrize("name,graph", GRAPHS, ids=[name for name, _ in GRAPHS])
@pytest.mark.parametrize("mode", [P, E])
def test_kernel_equals_dense_bit_for_bit(name: str, graph: Graph, mode: Mode) -> None:
    for k, sigma in enumerate(SIGMAS):
        for beta in (EMBEDDING_BETA, 0.5):
            for rounds in (1, 3, 100):
                seeds = _seeds(graph, 4, k)
                block = pushflowcap_block(graph, np.array(seeds), beta, rounds, sigma, mode)
                skipping = pushflowcap_block(
                    graph, np.array(seeds), beta, rounds, sigma, mode, skip_idle=True
                )
                for column, seed in enumerate(seeds):
                    want = pushflowcap_dense(graph, seed, beta, rounds, sigma, mode)
                    got = pushflowcap(graph, seed, beta, rounds, sigma, mode)
                    alone = pushflowcap_block(
                        graph, np.array([seed]), beta, rounds, sigma, mode, skip_idle=True
                    )
                    where = (name, mode, sigma, beta, rounds, seed)
                    assert np.array_equal(got, want), where
                    assert np.array_equal(block[:, column], want), where
                    assert np.array_equal(skipping[:, column], want), where
                    assert np.array_equal(alone[:, 0], want), where
                    assert got.dtype == np.float64 and got.shape == (graph.n,)


def test_kernel_equals_dense_on_email_eu_core() -> None:
    """A real graph (1,005 nodes, 16,064 edges) at the embedding's default sigma."""
    graph = load_edge_list(shared_file("email-Eu-core.txt"))
    seeds = _seeds(graph, 24, 3)
    for mode in (P, E):
        for sigma in (1e-3, 1e-6):
            for skip_idle in (False, True):
                block = pushflowcap_block(
                    graph, np.array(seeds), EMBEDDING_BETA, 100, sigma, mode, skip_idle=skip_idle
                )
                for column, seed in enumerate(seeds):
                    want = pushflowcap_dense(graph, seed, EMBEDDING_BETA, 100, sigma, mode)
                    assert np.array_equal(block[:, column], want), (mode, sigma, seed)


def test_repeated_and_unsorted_seeds_in_one_block() -> None:
    graph = generate_graph(300, 2000, seed=5)
    seeds = np.array([17, 3, 17, 250, 0, 3])
    for skip_idle in (False, True):
        block = pushflowcap_block(graph, seeds, EMBEDDING_BETA, 40, 1e-3, P, skip_idle=skip_idle)
        for column, seed in enumerate(seeds.tolist()):
            want = pushflowcap_dense(graph, seed, EMBEDDING_BETA, 40, 1e-3, P)
            assert np.array_equal(block[:, column], want)


def test_rounds_stop_only_when_nothing_can_push() -> None:
    """The early stop (offline runs only): an edge-mode isolated seed (cap 0) pushes nothing,
    so no round runs and p = 0 as in the dense rounds; a seed that can push runs every round
    (the lazy walk keeps part of each push, so a pushing node has residual, hence flow, in the
    next round)."""
    graph = graph_from_edges({(0, 1), (1, 2)}, 4)  # node 3 isolated
    beta = 0.5

    def rounds_run(
        seed: int, sigma: float, mode: Mode, rounds: int, every_row: bool = False
    ) -> int:
        inv_degree, keeps, degrees, order = node_arrays(graph)
        cap = degrees * edge_threshold(beta, sigma)
        pushed = np.zeros((graph.n, 1))
        done = _capped_push_rounds(
            graph.indptr, graph.indices, inv_degree, keeps, cap, np.array([seed]),
            mode is P, (1.0 - (1.0 - beta)) / 2.0, rounds, pushed, order, every_row,
        )  # fmt: skip
        return int(done)

    assert rounds_run(3, 1e-3, E, 100) == 0
    assert rounds_run(3, 1e-3, E, 100, every_row=True) == 100  # served answers: every round
    assert np.array_equal(pushflowcap(graph, 3, beta, 100, 1e-3, E), np.zeros(4))
    assert np.array_equal(pushflowcap_dense(graph, 3, beta, 100, 1e-3, E), np.zeros(4))
    assert rounds_run(3, 1e-3, P, 100) == 100  # cap infinity: the seed keeps pushing
    assert rounds_run(0, 1e-12, E, 100) == 100


@pytest.mark.parametrize("mode", [P, E])
def test_dp_ie_release_is_the_same_for_the_same_noise(mode: Mode) -> None:
    """At floor 0 (the paper's Algorithm 2) the noise-free part (p, then w) and the released
    vector, for one noise seed, are the same whether p comes from the kernel or from the dense
    reference."""
    graph = generate_graph(800, 9000, seed=3)
    hashes = embedding_hashes(graph.node_ids, b"salt-for-a-test!", 64)
    for seed in _seeds(graph, 5, 11):
        dense = pushflowcap_dense(graph, seed, EMBEDDING_BETA, 100, 1e-3, mode)
        fast = pushflowcap(graph, seed, EMBEDDING_BETA, 100, 1e-3, mode)
        assert np.array_equal(instant_embedding(fast, hashes), instant_embedding(dense, hashes))
        a = dp_instant_embedding(
            graph, seed, hashes, 1.0, 1e-3, mode, rng=np.random.default_rng(seed), capped=dense
        )
        b = dp_instant_embedding(
            graph, seed, hashes, 1.0, 1e-3, mode, rng=np.random.default_rng(seed), floor=0.0
        )
        assert np.array_equal(a.values, b.values) and a.grid == b.grid


def test_noise_free_vectors_are_the_dense_pipeline_and_kept_within_their_bytes() -> None:
    """The kept noise-free DP-IE vectors at floor 0: bit for bit InstantEmbedding of the dense
    vector, one by one or as a group (repeats included), computed once while kept, evicted past
    the byte budget, and keyed by everything they depend on (another sigma, mode or floor is
    computed)."""
    graph = generate_graph(500, 4000, seed=9)
    hashes = embedding_hashes(graph.node_ids, b"another-salt!!!!", 32)
    cache = NoiseFreeEmbeddings(max_bytes=3 * 32 * 8, block=2)

    def dense(seed: int, sigma: float, mode: Mode) -> np.ndarray:
        p = pushflowcap_dense(graph, seed, EMBEDDING_BETA, 100, sigma, mode)
        return instant_embedding(p, hashes)

    seeds = [4, 90, 4, 311, 7]
    got = cache.vectors(graph, seeds, hashes, 1e-3, E, EMBEDDING_BETA, 100, 0.0)
    for seed, w in zip(seeds, got, strict=True):
        assert np.array_equal(w, dense(seed, 1e-3, E))
        assert not w.flags.writeable
    assert cache.misses == 4 and cache.hits == 0  # 4 distinct seeds; 3 fit the budget
    again = cache.vector(graph, 7, hashes, 1e-3, E, EMBEDDING_BETA, 100, 0.0)
    assert again is got[4] and cache.hits == 1
    cache.vector(graph, 4, hashes, 1e-3, E, EMBEDDING_BETA, 100, 0.0)  # evicted: computed again
    assert cache.misses == 5
    other = cache.vector(graph, 7, hashes, 1e-3, P, EMBEDDING_BETA, 100, 0.0)
    assert np.array_equal(other, dense(7, 1e-3, P)) and cache.misses == 6
    assert np.array_equal(
        cache.vector(graph, 7, hashes, 1e-2, E, EMBEDDING_BETA, 100, 0.0), dense(7, 1e-2, E)
    )
    floored = cache.vector(graph, 7, hashes, 1e-3, P, EMBEDDING_BETA, 100, 0.25)
    assert cache.misses == 8
    assert np.array_equal(
        floored,
        instant_embedding(
            floored_pushflowcap(graph, 7, EMBEDDING_BETA, 100, 1e-3, P, 0.25), hashes
        ),
    )
    assert not np.array_equal(floored, other)
    # a DP-IE release from the kept vector is the release from the dense vector, same noise
    a = dp_instant_embedding(
        graph, 7, hashes, 0.5, 1e-3, E, rng=np.random.default_rng(1), embedded=got[4]
    )
    b = dp_instant_embedding(
        graph, 7, hashes, 0.5, 1e-3, E, rng=np.random.default_rng(1),
        capped=pushflowcap_dense(graph, 7, EMBEDDING_BETA, 100, 1e-3, E),
    )  # fmt: skip
    assert np.array_equal(a.values, b.values)
    # and with the floor (the served default), the release from the kept vector
    c = dp_instant_embedding(
        graph, 7, hashes, 0.5, 1e-3, P, rng=np.random.default_rng(1), embedded=floored
    )
    d = dp_instant_embedding(graph, 7, hashes, 0.5, 1e-3, P, rng=np.random.default_rng(1))
    assert np.array_equal(c.values, d.values)
