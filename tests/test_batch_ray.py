"""``batch --engine ray`` on a local Ray instance (num_cpus=2), started once for this module
(``address="local"``: a fresh instance of its own, never another test's or helper's) and shut
down after it. A task killed mid-block, a rerun, a task that Ray retries: every user ends with
exactly one charge for the run, and the ledger verifies."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from service.batch import FailureInjection, run_batch
from service.batch.shared_graph import SharedGraph
from service.graph.loader import load_edge_list
from tests.batch_support import (
    answered_or_replayed,
    assert_exactly_once,
    degree_charge_count,
    facebook_graph,
    migrated,
    options,
    run_charges,
    seeds_file,
)

ray = pytest.importorskip("ray")

# one local Ray instance for the module (local_ray): its tests run on one xdist worker
pytestmark = pytest.mark.xdist_group("test_batch_ray")

#: Six blocks of 40: the long test kills a worker in block 4, with blocks before and after it.
SEEDS = 240


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


def test_the_graph_is_shared_without_copies(local_ray: None) -> None:
    graph = load_edge_list(facebook_graph())
    ref = ray.put(SharedGraph.of(graph))

    @ray.remote
    def inspect(shared: SharedGraph) -> tuple[bool, bool, str, int]:
        rebuilt = shared.graph()
        return (
            bool(shared.indices.flags.writeable),
            bool(rebuilt.indices is shared.indices),  # the Graph uses the store's array
            rebuilt.version,
            int(rebuilt.index_of("4038")),
        )

    writeable, same, version, index = ray.get(inspect.remote(ref))
    assert not writeable  # a read-only view of the object store, not a copy
    assert same and version == graph.version and index == graph.index_of("4038")


@pytest.mark.postgres
def test_a_task_ray_retries_after_its_worker_died_charges_nobody_twice(
    local_ray: None, postgres_url: str, tmp_path: Path
) -> None:
    """The short one, always run: 60 seeds, one worker killed mid-block, retried by Ray."""
    url = migrated(postgres_url)
    seeds = seeds_file(tmp_path, 60)
    kill = FailureInjection(block=1, after=3, kill=True, marker=str(tmp_path / "fired"))
    summary = run_batch(
        options(url, facebook_graph(), seeds, tmp_path / "r.parquet", run_id="ray-short",
                engine="ray", failure=kill, retries=1, block_size=20)
    )  # fmt: skip
    assert (summary.answered, summary.failed, summary.reconciled) == (60, 0, 1)
    charges = assert_exactly_once(url, "ray-short", [str(i) for i in range(60)])
    assert sum(1 for c in charges if c[1] == "refunded") == 1


@pytest.mark.postgres
def test_embeddings_on_ray_a_retried_task_charges_nobody_twice(
    local_ray: None, postgres_url: str, tmp_path: Path
) -> None:
    """``--output embeddings`` on Ray: a worker killed after storing 3 embeddings, the task
    retried; every seed one charge, the Parquet column a fixed-size list of its releases."""
    import pyarrow as pa

    url = migrated(postgres_url)
    seeds = seeds_file(tmp_path, 20)
    kill = FailureInjection(block=1, after=3, kill=True, marker=str(tmp_path / "fired"))
    base = options(url, facebook_graph(), seeds, tmp_path / "e.parquet", run_id="ray-emb",
                   engine="ray", failure=kill, retries=1, block_size=10)  # fmt: skip
    summary = run_batch(replace(base, output="embeddings", k=8))
    assert (summary.answered, summary.failed, summary.reconciled) == (20, 0, 1)
    assert summary.mechanism == "dp_instant_embedding"
    charges = assert_exactly_once(url, "ray-emb", [str(i) for i in range(20)])
    assert sum(1 for c in charges if c[1] == "refunded") == 1
    table = pq.read_table(tmp_path / "e.parquet")
    assert table.schema.field("embedding").type == pa.list_(pa.float64(), 8)
    assert sorted(table.column("user").to_pylist(), key=int) == [str(i) for i in range(20)]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_killed_task_a_rerun_and_a_retried_task_charge_every_user_exactly_once(
    local_ray: None, postgres_url: str, tmp_path: Path
) -> None:
    url = migrated(postgres_url)
    graph = facebook_graph()
    seeds = seeds_file(tmp_path, SEEDS)
    nodes = [str(i) for i in range(SEEDS)]
    out = tmp_path / "recs.parquet"

    # Run 1: block 4's worker dies on its 8th seed (charge admitted, release not stored); no
    # retries, so the block fails and the run refunds what it left admitted.
    kill = FailureInjection(block=4, after=7, kill=True, marker=str(tmp_path / "first"))
    # blended: each seed's first answer also pays the graph version's degree release
    first = run_batch(
        options(url, graph, seeds, out, run_id="ray-1", engine="ray", failure=kill,
                mechanism="blended")
    )  # fmt: skip
    assert first.failed == 40 and first.answered == SEEDS - 40
    assert first.reconciled == 1
    charges = run_charges(url, "ray-1")
    assert not [c for c in charges if c[1] == "admitted"]
    assert sum(1 for c in charges if c[1] == "released") == first.answered + 7

    # Run 2, the rerun: block 4 again, and its worker dies again, after 20 more releases; Ray
    # retries the task, whose new attempt refunds the dead charge and replays what was stored.
    again = FailureInjection(block=4, after=20, kill=True, marker=str(tmp_path / "second"))
    second = run_batch(
        options(url, graph, seeds, out, run_id="ray-1", engine="ray", failure=again, retries=2,
                mechanism="blended")
    )  # fmt: skip
    assert second.failed == 0 and answered_or_replayed(second) == SEEDS
    # The 20 the dead attempt stored are replayed by the retry but were charged by this run.
    assert (second.answered, second.replayed, second.reconciled) == (40 - 7, SEEDS - 33, 1)
    # Each seed also paid the degree release (the run asks for blended) exactly once,
    # with its first admitted charge; the summary counts it where this run paid it.
    assert degree_charge_count(url) == SEEDS
    assert 0.1 * 33 < second.epsilon_charged <= 0.1 * 33 * 2 + 1e-9
    assert_exactly_once(url, "ray-1", nodes)
    table = pq.read_table(out)
    assert sorted(table.column("user").to_pylist()) == sorted(nodes)
    assert all(len(r) == 10 for r in table.column("recommendations").to_pylist())

    # Run 3: nothing left to charge.
    third = run_batch(options(url, graph, seeds, tmp_path / "3.parquet", run_id="ray-1",
                              engine="ray", mechanism="blended"))  # fmt: skip
    assert (third.answered, third.replayed, third.epsilon_charged) == (0, SEEDS, 0.0)
    assert_exactly_once(url, "ray-1", nodes)
