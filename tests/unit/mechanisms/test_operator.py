"""The walk operator's passes over the rows (``service/mechanisms/operator.py``): small passes run
on the calling thread, large ones are split over the threads, and the values are the same bit
for bit either way, for the fused block step (with noise), the product and the column gather."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from service.graph.generate import write_generated_edge_list
from service.graph.loader import load_edge_list
from service.graph.model import COMPACT_INDEX_NODES, Graph
from service.mechanisms import operator as operator_module
from service.mechanisms.operator import SPLIT_WORK, StepWorkspace, WalkOperator
from tests.graph_helpers import graph_from_edges, random_graph


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    path: Path = tmp_path_factory.mktemp("operator") / "graph.txt"
    write_generated_edge_list(path, 3_000, 40_000, seed=5)
    return load_edge_list(path)


def _step(op: WalkOperator, x: np.ndarray, noise: np.ndarray) -> np.ndarray:
    width = x.shape[1]
    slots = np.where(np.arange(width) % 2 == 0, np.arange(width) // 2, -1)
    out = op.fused_step(
        x,
        seeds=np.arange(width) * 7 % op.n,
        betas=np.full(width, 0.8),
        etas=np.full(width, 1e-4),
        personalized=np.arange(width) % 3 == 0,
        workspace=StepWorkspace(),
        noise=noise,
        slots=slots,
        grids=np.full(width, 2.0**-30),
        limits=np.full(width, 2**40, dtype=np.int64),
    )
    assert out is not None
    return out.copy()


@pytest.mark.parametrize("width", [1, 4, 8, 64, 256])
def test_one_thread_and_two_give_the_same_values(graph: Graph, width: int) -> None:
    single, split = WalkOperator(graph, threads=1), WalkOperator(graph, threads=2)
    entries = int(graph.indptr[-1])
    assert split.splits(width) == (entries * width >= SPLIT_WORK)
    assert split.splits(width, per_row=True) == (graph.n * width >= SPLIT_WORK)
    assert not single.splits(width) and not single.splits(width, per_row=True)
    rng = np.random.default_rng(width)  # a test's inputs, not a serving path
    x = rng.random((graph.n, width)) * 1e-3
    noise = rng.integers(-50, 50, size=((width + 1) // 2, graph.n), dtype=np.int64)
    assert np.array_equal(_step(single, x, noise), _step(split, x, noise))
    assert np.array_equal(single.adjacency_product(x), split.adjacency_product(x))
    columns = list(range(0, width, 3))
    for a, b in zip(single.columns(x, columns), split.columns(x, columns), strict=True):
        assert np.array_equal(a, b)


def test_both_paths_are_taken_on_this_graph(graph: Graph) -> None:
    """The widths above cover a pass on the calling thread and a split one, for the passes
    over the stored entries and for those over the rows' own values."""
    op = WalkOperator(graph, threads=2)
    assert not op.splits(1) and op.splits(64)
    assert not op.splits(64, per_row=True) and op.splits(256, per_row=True)


def test_a_pass_over_the_rows_reads_only_its_own_values(graph: Graph) -> None:
    """The clip pass and the column gather cost rows times columns, not entries times
    columns: a width at which the product splits leaves them on the calling thread."""
    op = WalkOperator(graph, threads=2)
    width = 8
    assert op.splits(width) and not op.splits(width, per_row=True)


def test_a_split_pass_runs_its_last_block_here_and_waits_for_the_others(graph: Graph) -> None:
    """One block runs on the calling thread; when it fails, the error comes only after the
    pool's blocks have finished (they write into the same buffers)."""
    op = WalkOperator(graph, threads=2)
    caller = threading.get_ident()
    ran: list[tuple[int, int, int]] = []
    release = threading.Event()

    def kernel(lo: int, hi: int) -> None:
        if threading.get_ident() == caller:
            ran.append((lo, hi, caller))
            raise RuntimeError("the calling thread's block failed")
        release.wait(5.0)
        ran.append((lo, hi, threading.get_ident()))

    threading.Timer(0.05, release.set).start()
    with pytest.raises(RuntimeError, match="calling thread"):
        op._on_rows(kernel, width=64)
    assert sorted((lo, hi) for lo, hi, _ in ran) == op.row_blocks
    assert ran[-1][2] != caller  # the pool's block finished before the error was raised
    assert [hi for _, hi, who in ran if who == caller] == [graph.n]


def test_a_small_graph_never_splits(tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    write_generated_edge_list(path, 140, 700, seed=3)
    op = WalkOperator(load_edge_list(path), threads=2)
    assert not any(op.splits(width) for width in (1, 8, 64, 256))


@pytest.mark.parametrize("width", [1, 3, 8, 64])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_product_is_scipy_s_bit_for_bit(graph: Graph, width: int, threads: int) -> None:
    """Each row's sum runs over its CSR list in order from 0.0, as scipy's CSR product does
    (docs/privacy.md, "Floating point and the sensitivity bound"): the kernels' gathers (an
    unsigned index, a 16-bit copy of the indices, four neighbours a pass, prefetch hints)
    change no rounding."""
    import scipy.sparse as sp

    op = WalkOperator(graph, threads=threads)
    adjacency = sp.csr_matrix(
        (np.ones(graph.indices.shape[0]), graph.indices, graph.indptr), shape=(graph.n, graph.n)
    )
    rng = np.random.default_rng(width)  # a test's inputs, not a serving path
    z = rng.random((graph.n, width)) * 10.0 ** rng.integers(-12, 0, size=(graph.n, 1))
    expected = adjacency @ (z[:, 0] if width == 1 else z)
    got = op.adjacency_product(z[:, 0] if width == 1 else z)
    assert np.array_equal(got, expected)


def test_a_failed_pool_block_is_raised_after_every_block_has_finished(graph: Graph) -> None:
    """With three threads, two blocks run on the pool: the first fails at once, the second is
    still writing; the error comes only after the second has finished."""
    op = WalkOperator(graph, threads=3)
    (first, _), (second, _), _ = op.row_blocks
    finished: list[int] = []

    def kernel(lo: int, hi: int) -> None:
        if lo == first:
            raise RuntimeError("the pool's first block failed")
        if lo == second:
            time.sleep(0.2)
        finished.append(lo)

    with pytest.raises(RuntimeError, match="first block failed"):
        op._on_rows(kernel, width=64)
    assert sorted(finished) == sorted(lo for lo, _ in op.row_blocks[1:])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_one_column_step_is_its_column_of_a_block_bit_for_bit(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block of one column takes the one-column walk pass (1-D arrays, scalar parameters);
    it gives each column of a wider block bit for bit: personalized and edge seeds, an
    isolated seed and isolated rows, noisy and noise-free columns, values past the input clamp
    and noise past the limit."""
    base = random_graph(400, 0.02, np.random.default_rng(11))
    edges = [(u, v) for u in range(base.n) for v in base.neighbors(u).tolist() if u < v < 380]
    graph = graph_from_edges(edges, n=base.n)  # rows 380.. (and any others) are isolated
    isolated = np.flatnonzero(graph.degrees == 0)
    assert isolated.size >= 20
    op = WalkOperator(graph, threads=threads)
    if threads == 2:  # split at width 1 on this small graph too
        monkeypatch.setattr(operator_module, "SPLIT_WORK", 1)
        assert op.splits(1)
    width = 12
    rng = np.random.default_rng(12)  # a test's inputs, not a serving path
    x = np.abs(rng.normal(size=(graph.n, width))) * 1e-3
    x[:30] = 9.0  # past INPUT_CLAMP after the step with the large thresholds below
    x[::7] *= -1.0
    seeds = np.array([int(isolated[0]) if k == 3 else 5 * k + 1 for k in range(width)])
    betas = np.linspace(0.5, 0.9, width)
    etas = np.where(np.arange(width) % 4 == 1, 50.0, 1e-3)
    personalized = np.arange(width) % 3 == 0
    slots = np.array([-1 if k in (0, 5) else k % 3 for k in range(width)], dtype=np.int64)
    grids = 2.0 ** -np.arange(20, 20 + width, dtype=np.float64)
    limits = (2.0 / grids).astype(np.int64)
    limits[7] = 3
    noise = rng.integers(-(2**61), 2**61, size=(3, graph.n), dtype=np.int64)
    noise[:, ::2] //= 2**40
    block = op.fused_step(x, seeds=seeds, betas=betas, etas=etas, personalized=personalized,
                          noise=noise, slots=slots, grids=grids, limits=limits)  # fmt: skip
    assert block is not None
    block = block.copy()
    for k in range(width):
        one = slice(k, k + 1)
        alone = op.fused_step(
            np.ascontiguousarray(x[:, one]), seeds=seeds[one], betas=betas[one],
            etas=etas[one], personalized=personalized[one], workspace=StepWorkspace(),
            noise=noise[slots[k]][None, :] if slots[k] >= 0 else None,
            slots=np.zeros(1, np.int64) if slots[k] >= 0 else None,
            grids=grids[one], limits=limits[one],
        )  # fmt: skip
        assert alone is not None
        np.testing.assert_array_equal(alone[:, 0], block[:, k])


def test_graphs_up_to_65536_nodes_are_walked_through_16_bit_indices() -> None:
    """The kernels read the graph's read-only uint16 copy of its indices up to
    COMPACT_INDEX_NODES nodes (the same values), and the graph's own int32 array above."""
    assert COMPACT_INDEX_NODES == 65_536
    for n, dtype in ((COMPACT_INDEX_NODES, np.uint16), (COMPACT_INDEX_NODES + 1, np.int32)):
        graph = graph_from_edges([(0, n - 1), (1, n - 2), (0, 1)], n=n)
        indices = graph.compact_indices
        assert indices.dtype == dtype and not indices.flags.writeable
        assert np.array_equal(indices.astype(np.int64), graph.indices.astype(np.int64))
        if dtype == np.int32:
            assert indices is graph.indices
        op = WalkOperator(graph, threads=1)
        assert np.shares_memory(op._indices, indices)  # the graph's, not a copy of its own
        z = np.arange(n, dtype=np.float64)
        expected = np.zeros(n)
        expected[[0, n - 1, 1, n - 2]] = [n - 1 + 1, 0, n - 2 + 0, 1]
        assert np.array_equal(op.adjacency_product(z), expected)


@pytest.mark.parametrize("personalized", [True, False])
def test_a_one_column_walk_pass_writes_the_next_steps_clip_pass(
    graph: Graph, personalized: bool
) -> None:
    """Steps chained through one workspace (each walk pass writes the next step's clipped / d)
    give what steps with a clip pass of their own give, bit for bit, noisy steps included; a
    result that is not the last one returned, or another seed or eta, gets its own clip pass."""
    rng = np.random.default_rng(21)  # a test's inputs, not a serving path
    op = WalkOperator(graph, threads=2)
    args = {"seeds": np.array([17]), "betas": np.array([0.8]), "etas": np.array([1e-4]),
            "personalized": np.array([personalized])}  # fmt: skip
    noise = rng.integers(-(2**20), 2**20, size=(1, graph.n), dtype=np.int64)
    noisy = {"noise": noise, "slots": np.zeros(1, np.int64), "grids": np.array([2.0**-30]),
             "limits": np.array([2**40], dtype=np.int64)}  # fmt: skip
    x = np.zeros((graph.n, 1))
    x[17] = 1.0
    chained, fresh = StepWorkspace(), x.copy()
    for step in range(8):
        extra = noisy if step >= 5 else {}
        out = op.fused_step(x, **args, workspace=chained, **extra)
        expected = op.fused_step(fresh, **args, workspace=StepWorkspace(), **extra)
        assert out is not None and expected is not None
        assert np.array_equal(out, expected)
        fresh = expected.copy()
        before, x = x, out
        chained.swap(before)  # as the engine does: the spent input is the next result buffer
        assert chained.holds_clipped(out, (17, 1e-4, personalized))
    copy = x.copy()  # the same values in another array: a clip pass of its own
    assert not chained.holds_clipped(copy, (17, 1e-4, personalized))
    assert not chained.holds_clipped(x, (17, 2e-4, personalized))
    other = {**args, "etas": np.array([2e-4])}
    a = op.fused_step(x, **other, workspace=chained)
    b = op.fused_step(copy, **other, workspace=StepWorkspace())
    assert a is not None and b is not None
    assert np.array_equal(a, b)
