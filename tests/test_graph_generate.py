"""The deterministic generator, edge-list writing, and the built-in demo graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.graph.build import build_graph
from service.graph.demo import DEMO_EDGES, DEMO_NODES, demo_graph
from service.graph.generate import (
    _format_int_pairs,
    generate_edge_keys,
    generate_graph,
    write_edge_list,
)
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from tests.unit.graph.test_loader import assert_csr_invariants

# Pinned so a change to the generator (or to numpy's random stream) is noticed: the demo graph
# is the embedded default, and its version keys caches and released answers.
DEMO_VERSION = "a52e090a66ac2af865a5"


def average_clustering(graph: Graph) -> float:
    a = graph.adjacency
    triangles = np.asarray((a @ a).multiply(a).sum(axis=1)).ravel() / 2
    d = graph.degrees.astype(np.float64)
    pairs = d * (d - 1) / 2
    local = np.divide(triangles, pairs, out=np.zeros_like(triangles), where=pairs > 0)
    return float(local.mean())


# --------------------------------------------------------------------------- generator


@pytest.mark.parametrize(
    ("nodes", "edges"),
    [(2, 1), (3, 2), (10, 45), (50, 40), (300, 2000), (200, 19900), (200, 19000), (5000, 40000)],
)
def test_exact_sizes_and_invariants(nodes: int, edges: int) -> None:
    graph = generate_graph(nodes, edges, seed=3)
    assert (graph.n, graph.m) == (nodes, edges)
    assert graph.node_ids.tolist() == [str(i) for i in range(nodes)]
    assert_csr_invariants(graph)
    if edges >= nodes:
        assert graph.stats.isolated_nodes == 0


def test_deterministic_per_seed() -> None:
    a = generate_graph(2000, 15000, seed=11)
    b = generate_graph(2000, 15000, seed=11)
    c = generate_graph(2000, 15000, seed=12)
    assert a.version == b.version and np.array_equal(a.indices, b.indices)
    assert c.version != a.version


def test_empty_and_invalid() -> None:
    empty = generate_graph(5, 0)
    assert (empty.n, empty.m) == (5, 0)
    for nodes, edges in [(1, 0), (4, 7), (10, -1)]:
        with pytest.raises(ValueError):
            generate_graph(nodes, edges)
    with pytest.raises(ValueError):
        generate_graph(10, 5, mixing=1.5)


def test_social_shape() -> None:
    graph = generate_graph(20_000, 200_000, seed=1)
    degrees = graph.degrees
    assert degrees.max() > 8 * np.median(degrees)  # heavy tail
    assert average_clustering(graph) > 0.15  # friends of friends are friends


def test_keys_agree_with_build_graph() -> None:
    keys = generate_edge_keys(500, 3000, seed=2)
    assert np.all(np.diff(keys) > 0)
    built = build_graph(keys // 500, keys % 500, num_nodes=500)
    assert built.version == generate_graph(500, 3000, seed=2).version


def test_medium_graph_builds() -> None:
    graph = generate_graph(100_000, 1_000_000, seed=0)
    assert (graph.n, graph.m) == (100_000, 1_000_000)
    assert graph.indices.dtype == np.int32


# --------------------------------------------------------------------------- writing


@pytest.mark.parametrize("name", ["g.txt", "g.txt.gz", "g.bz2", "g.xz"])
@pytest.mark.parametrize("separator", [" ", "\t", ","])
def test_written_file_loads_back_to_the_same_graph(
    tmp_path: Path, name: str, separator: str
) -> None:
    graph = generate_graph(400, 2500, seed=5)
    path = write_edge_list(tmp_path / name, graph, separator=separator, shuffle_seed=1)
    loaded = load_edge_list(path)
    assert loaded.version == graph.version
    assert np.array_equal(loaded.indices, graph.indices)


def test_string_ids_round_trip(tmp_path: Path) -> None:
    ids = [f"user-{i}" for i in range(6)]
    graph = build_graph(np.array([0, 1, 2, 3, 4]), np.array([1, 2, 3, 4, 5]), ids)
    path = write_edge_list(tmp_path / "s.csv", graph, separator=",", shuffle_seed=3)
    assert load_edge_list(path).version == graph.version


def test_integer_formatting() -> None:
    a = np.array([0, 9, 10, 99, 100, 123456789, 10**17 + 5], dtype=np.int64)
    b = np.array([1, 10, 0, 1000, 7, 5, 999999999999999999], dtype=np.int64)
    expected = "".join(f"{x}\t{y}\n" for x, y in zip(a.tolist(), b.tolist(), strict=True))
    assert _format_int_pairs(a, b, b"\t").decode() == expected
    assert _format_int_pairs(a[:0], b[:0], b" ") == b""


# --------------------------------------------------------------------------- demo graph


def test_demo_graph() -> None:
    graph = demo_graph()
    assert graph is demo_graph()  # cached per process
    assert (graph.n, graph.m) == (DEMO_NODES, DEMO_EDGES)
    assert 5_000 <= graph.n <= 20_000
    assert graph.stats.source == "demo" and graph.stats.isolated_nodes == 0
    assert graph.has_node("0") and graph.has_node(str(DEMO_NODES - 1))
    assert_csr_invariants(graph)
    assert average_clustering(graph) > 0.15
    assert graph.stats.degree_max > 8 * np.median(graph.degrees)


def test_demo_graph_is_deterministic() -> None:
    cached = demo_graph()
    demo_graph.cache_clear()
    try:
        fresh = demo_graph()
        assert fresh is not cached
        assert fresh.version == cached.version == DEMO_VERSION
        assert np.array_equal(fresh.indices, cached.indices)
    finally:
        demo_graph.cache_clear()
