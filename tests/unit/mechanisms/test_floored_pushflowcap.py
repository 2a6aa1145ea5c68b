"""PushFlowCap with a floor: the kernel computes the recursion, locally.

The kernel (:func:`floored_pushflowcap`) against the recursion on whole vectors
(:func:`floored_pushflowcap_reference`), on the graphs the Algorithm 2 kernel is tested on;
floor 0 is Algorithm 2; the early stop is exact; the work stays near the seed; bad floors are
refused. The sensitivity bound is searched by brute force in tests/test_embedding_sensitivity.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.embeddings.parameters import EMBEDDING_BETA, EMBEDDING_FLOOR
from service.errors import InvalidParameter
from service.graph.generate import generate_graph
from service.graph.model import Graph
from service.mechanisms.floored_pushflowcap import (
    floor_threshold,
    floored_pushflowcap,
    floored_pushflowcap_reference,
    floored_pushflowcap_traced,
    pushflowcap_with_floor,
    warm_up_floored_kernel,
)
from service.mechanisms.pushflowcap import edge_threshold, pushflowcap, pushflowcap_dense
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges, random_graph

P, E = Mode.PERSONALIZED, Mode.EDGE


def _graphs() -> list[tuple[str, Graph]]:
    rng = np.random.default_rng(3)
    return [
        ("generated 1500/30000", generate_graph(1500, 30000, seed=2)),
        ("sparse random", random_graph(120, 0.02, rng)),
        ("dense random", random_graph(60, 0.5, rng)),
        ("with isolated nodes", graph_from_edges({(0, 1), (1, 2), (2, 0), (3, 4)}, 8)),
        ("path", graph_from_edges({(i, i + 1) for i in range(30)})),
        ("star", graph_from_edges({(0, i) for i in range(1, 40)})),
    ]


GRAPHS = _graphs()


@pytest.mark.parametrize("name,graph", GRAPHS, ids=[name for name, _ in GRAPHS])
@pytest.mark.parametrize("mode", [P, E])
def test_kernel_computes_the_recursion(name: str, graph: Graph, mode: Mode) -> None:
    for sigma in (1e-5, 1e-3, 1e-1, 1e6):
        for floor in (0.0, 0.05, EMBEDDING_FLOOR, 2.0):
            for seed in sorted({0, graph.n // 2, graph.n - 1}):
                for rounds in (1, 3, 100):
                    got = floored_pushflowcap(
                        graph, seed, EMBEDDING_BETA, rounds, sigma, mode, floor
                    )
                    want = floored_pushflowcap_reference(
                        graph, seed, EMBEDDING_BETA, rounds, sigma, mode, floor
                    )
                    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-17)
                    assert np.all(got >= 0)


@pytest.mark.parametrize("mode", [P, E])
def test_floor_zero_is_algorithm_2(mode: Mode) -> None:
    """The recursion at floor 0 is Algorithm 2's rounds (Lemma 4.2), to rounding; and
    ``pushflowcap_with_floor`` at floor 0 IS Algorithm 2's kernel, bit for bit."""
    for _, graph in GRAPHS:
        for sigma in (1e-3, 1e-1):
            for seed in (0, graph.n - 1):
                paper = pushflowcap_dense(graph, seed, EMBEDDING_BETA, 100, sigma, mode)
                recursion = floored_pushflowcap(graph, seed, EMBEDDING_BETA, 100, sigma, mode, 0.0)
                np.testing.assert_allclose(recursion, paper, rtol=1e-12, atol=1e-17)
                served = pushflowcap_with_floor(graph, seed, EMBEDDING_BETA, 100, sigma, mode, 0.0)
                assert np.array_equal(served, paper)
                floored = pushflowcap_with_floor(
                    graph, seed, EMBEDDING_BETA, 100, sigma, mode, EMBEDDING_FLOOR
                )
                assert np.array_equal(
                    floored,
                    floored_pushflowcap(
                        graph, seed, EMBEDDING_BETA, 100, sigma, mode, EMBEDDING_FLOOR
                    ),
                )


def test_the_floor_keeps_tau_and_the_caps_still_bind() -> None:
    """On a path from the seed: the seed pushes 1 - tau (joint mode: no cap), each node keeps
    tau of what it receives, p_v <= alpha d(v) T for every node but the joint seed, and a node
    whose whole inflow stays below tau pushes nothing."""
    graph = graph_from_edges({(i, i + 1) for i in range(10)})
    beta, sigma, floor = 0.5, 1e-1, 0.2
    alpha = 1.0 - beta
    tau = floor_threshold(beta, graph.n, floor)
    assert tau == pytest.approx(floor / (alpha * graph.n))
    one = floored_pushflowcap(graph, 0, beta, 1, sigma, P, floor)
    assert one[0] == pytest.approx(alpha * (1.0 - tau)) and not one[1:].any()
    p, work = floored_pushflowcap_traced(graph, 0, beta, 100, sigma, P, floor)
    cap = alpha * graph.degrees * edge_threshold(beta, sigma)
    assert np.all(p[1:] <= cap[1:] * (1 + 1e-12))
    assert work.pushed_nodes == int(np.count_nonzero(p)) < graph.n  # the far end never pushes
    assert not p[-1]


def test_rounds_stop_only_at_the_fixed_point() -> None:
    """The kernel stops after a round in which no h changed; running exactly that many rounds,
    or any more, gives the same vector."""
    graph = graph_from_edges({(0, 1), (1, 2), (2, 3)}, 6)
    for mode, sigma, floor in ((E, 1e-3, 0.0), (E, 1e-1, 0.5), (P, 1e-3, 3.0)):
        p, work = floored_pushflowcap_traced(graph, 1, 0.5, 100, sigma, mode, floor)
        assert work.rounds < 100
        fewer = floored_pushflowcap(graph, 1, 0.5, max(work.rounds, 1), sigma, mode, floor)
        assert np.array_equal(p, fewer)
        np.testing.assert_allclose(
            p, floored_pushflowcap_reference(graph, 1, 0.5, 100, sigma, mode, floor), rtol=1e-12
        )
    # an edge-mode isolated seed has cap 0: nothing moves, as in Algorithm 2
    isolated = graph_from_edges({(0, 1)}, 3)
    p, work = floored_pushflowcap_traced(isolated, 2, 0.5, 100, 1e-3, E, EMBEDDING_FLOOR)
    assert work.rounds == 0 and not p.any()
    assert np.array_equal(p, pushflowcap(isolated, 2, 0.5, 100, 1e-3, E))


def test_the_work_stays_near_the_seed() -> None:
    """With the default floor the kernel reads a small part of what Algorithm 2 reads (every
    neighbour list in every round), and only a few nodes push; the same seeds at floor 0 read
    about everything."""
    graph = generate_graph(20000, 300000, seed=4)
    every_round = 100 * int(graph.indices.size)
    for seed in (5, 777, 19000):
        _, local = floored_pushflowcap_traced(
            graph, seed, EMBEDDING_BETA, 100, 1e-3, P, EMBEDDING_FLOOR
        )
        assert local.edge_visits < every_round / 10
        assert local.pushed_nodes < graph.n / 10
        _, whole = floored_pushflowcap_traced(graph, seed, EMBEDDING_BETA, 100, 1e-3, P, 0.0)
        assert whole.pushed_nodes == graph.n and whole.edge_visits > every_round / 2


def test_bad_floors_and_arguments_are_refused() -> None:
    graph = graph_from_edges({(0, 1)})
    for floor in (-0.1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(InvalidParameter):
            floored_pushflowcap(graph, 0, 0.5, 10, 1e-3, P, floor)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        floored_pushflowcap(graph, 5, 0.5, 10, 1e-3, P, 0.25)
    with pytest.raises(InvalidParameter):
        floored_pushflowcap(graph, 0, 0.5, 0, 1e-3, P, 0.25)


def test_warm_up_compiles_for_the_graph_dtypes() -> None:
    graph = generate_graph(50, 200, seed=1)
    warm_up_floored_kernel(graph.indptr, graph.indices)
    assert floored_pushflowcap(graph, 0, EMBEDDING_BETA, 5, 1e-3, P, EMBEDDING_FLOOR)[0] > 0
