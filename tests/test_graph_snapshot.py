"""One copy of the graph per machine: the memory-mapped CSR snapshot and the forked workers."""

from __future__ import annotations

import os
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.cache.caches import build_caches
from service.config import Settings
from service.graph.configured import load_configured_graph
from service.graph.generate import write_generated_edge_list
from service.graph.loader import load_edge_list
from service.graph.model import COMPACT_INDEX_NODES, Graph
from service.graph.node_ids import PackedIds
from service.graph.snapshot import (
    SnapshotInvalid,
    file_fingerprint,
    load_with_snapshot,
    mapped_snapshots,
    open_snapshot,
    snapshot_path,
    write_snapshot,
)
from service.ledger import upgrade
from service.mechanisms.common_neighbours import common_neighbour_counts
from service.mechanisms.operator import WalkOperator
from service.serving.graph_holder import GraphHolder
from tests.api_support import GRAPH_EDGES, GRAPH_NODES, Backend, bearer, open_ledger, uvicorn_server
from tests.connection_support import new_connection_each


class CountingParser:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path, raw: bytes | None) -> Graph:
        self.calls += 1
        return load_edge_list(path, raw=raw)


def assert_same_graph(a: Graph, b: Graph) -> None:
    assert a.version == b.version and a.stats == b.stats
    for name in ("indptr", "indices", "degrees"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.node_ids.tolist() == b.node_ids.tolist()


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, 300, 1500, seed=3)
    return path


def test_a_snapshot_serves_the_parsed_graph_from_a_read_only_mapping(
    graph_file: Path, tmp_path: Path
) -> None:
    parse = CountingParser()
    first = load_with_snapshot(graph_file, tmp_path / "snap", parse)
    second = load_with_snapshot(graph_file, tmp_path / "snap", parse)
    assert parse.calls == 1, "the second load maps the snapshot without parsing"
    reference = load_edge_list(graph_file)
    assert_same_graph(first, reference)
    assert_same_graph(second, reference)
    path = snapshot_path(tmp_path / "snap", file_fingerprint(graph_file))
    assert str(path) in mapped_snapshots()
    assert isinstance(second.ids, PackedIds)
    for array in (second.indptr, second.indices, second.degrees):
        assert not array.flags.writeable and not array.flags.owndata
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "snap").stat().st_mode) == 0o700
    for node in ("0", "17", "299"):
        assert second.index_of(node) == reference.index_of(node)
    for absent in ("300", "-1", "017", "x", ""):
        assert not second.has_node(absent)
    picks = np.array([5, 0, 299, 42])
    assert second.external_ids(picks) == reference.external_ids(picks)


def test_the_kernels_read_the_mapped_arrays_without_copying(
    graph_file: Path, tmp_path: Path
) -> None:
    mapped = load_with_snapshot(graph_file, tmp_path / "snap", CountingParser())
    reference = load_edge_list(graph_file)
    op = WalkOperator(mapped, threads=2)
    assert np.shares_memory(op._indptr, mapped.indptr)
    assert mapped.n <= COMPACT_INDEX_NODES  # the kernels read the mapped 16-bit indices
    assert op._indices is mapped.derived["compact_indices"] is mapped.compact_indices
    assert op._indices.dtype == np.uint16 and not op._indices.flags.owndata
    assert np.array_equal(op._indices, mapped.indices)
    assert np.shares_memory(WalkOperator(mapped, compact=False)._indices, mapped.indices)
    assert op.degrees is mapped.derived["float_degrees"]
    assert op.inv_degree is mapped.derived["inverse_degrees"]
    assert not op.inv_degree.flags.owndata and not op.inv_degree.flags.writeable
    assert np.array_equal(op.inv_degree, WalkOperator(reference, threads=1).inv_degree)
    y = np.random.default_rng(1).random((mapped.n, 3))
    assert np.array_equal(op.apply(y), WalkOperator(reference, threads=2).apply(y))


def test_common_neighbour_counts_need_no_per_process_adjacency_copy(
    graph_file: Path, tmp_path: Path
) -> None:
    mapped = load_with_snapshot(graph_file, tmp_path / "snap", CountingParser())
    reference = load_edge_list(graph_file)
    for seed in (0, 7, 150):
        indicator = np.zeros(reference.n)
        indicator[reference.neighbors(seed)] = 1.0
        expected = reference.adjacency @ indicator
        assert np.array_equal(common_neighbour_counts(mapped, seed), expected)
    assert "adjacency" not in mapped.__dict__, "no float64 data array (8 bytes per entry) built"


def test_string_ids_are_found_by_binary_search(tmp_path: Path) -> None:
    path = tmp_path / "names.txt"
    path.write_text("alice bob\nbob carol\nzoë Émile\nalice zoë\n007 7\n7 alice\n")
    graph = load_with_snapshot(path, tmp_path / "snap", CountingParser())
    reference = load_edge_list(path)
    assert_same_graph(graph, reference)
    for node in reference.node_ids.tolist():
        assert graph.index_of(node) == reference.index_of(node)
    for absent in ("al", "alicf", "zz", "0", "Emile"):
        assert not graph.has_node(absent)


def test_a_corrupt_or_truncated_snapshot_is_rebuilt_and_never_served(
    graph_file: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "snap"
    parse = CountingParser()
    load_with_snapshot(graph_file, directory, parse)  # writes the snapshot damaged below
    # parsed, not mapped: rewriting the file in place below would change a mapping of it
    reference = load_edge_list(graph_file)
    path = snapshot_path(directory, file_fingerprint(graph_file))
    good = path.read_bytes()
    corrupt = bytearray(good)
    corrupt[-100] ^= 0xFF  # one flipped byte in the node ids
    damaged = {"corrupt": bytes(corrupt), "truncated": good[: len(good) // 2],
               "empty": b"", "not a snapshot": b"x" * len(good)}  # fmt: skip
    for what, content in damaged.items():
        path.write_bytes(content)
        if content:
            with pytest.raises(SnapshotInvalid):
                open_snapshot(path, file_fingerprint(graph_file))
        calls = parse.calls
        served = load_with_snapshot(graph_file, directory, parse)
        assert parse.calls == calls + 1, f"{what}: parsed again"
        assert_same_graph(served, reference)
        assert path.read_bytes() == good, f"{what}: rewritten"


def test_a_stale_snapshot_of_another_file_is_rebuilt(graph_file: Path, tmp_path: Path) -> None:
    directory = tmp_path / "snap"
    other = tmp_path / "other.txt"
    write_generated_edge_list(other, 300, 1600, seed=4)
    path = snapshot_path(directory, file_fingerprint(graph_file))
    directory.mkdir(mode=0o700)
    # the other file's graph under this file's name, its header naming the other fingerprint
    write_snapshot(load_edge_list(other), path, file_fingerprint(other))
    with pytest.raises(SnapshotInvalid, match="stale"):
        open_snapshot(path, file_fingerprint(graph_file))
    parse = CountingParser()
    served = load_with_snapshot(graph_file, directory, parse)
    assert parse.calls == 1
    assert_same_graph(served, load_edge_list(graph_file))
    # a changed file gets a snapshot of its own
    changed = load_with_snapshot(other, directory, parse)
    assert_same_graph(changed, load_edge_list(other))
    assert snapshot_path(directory, file_fingerprint(other)).is_file()


def test_workers_starting_together_parse_the_file_once(graph_file: Path, tmp_path: Path) -> None:
    class SlowParser(CountingParser):
        def __call__(self, path: Path, raw: bytes | None) -> Graph:
            time.sleep(0.3)  # long enough for every other loader to reach the lock
            return super().__call__(path, raw)

    parse = SlowParser()
    with ThreadPoolExecutor(max_workers=4) as pool:
        graphs = list(
            pool.map(lambda _: load_with_snapshot(graph_file, tmp_path / "snap", parse), range(4))
        )
    assert parse.calls == 1
    assert len({g.version for g in graphs}) == 1


def test_snapshots_unused_for_a_week_are_removed_when_one_is_written(
    graph_file: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "snap"
    other = tmp_path / "other.txt"
    write_generated_edge_list(other, 300, 1600, seed=4)
    load_with_snapshot(other, directory, CountingParser())
    old = snapshot_path(directory, file_fingerprint(other))
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    load_with_snapshot(graph_file, directory, CountingParser())
    assert not old.exists()
    assert snapshot_path(directory, file_fingerprint(graph_file)).is_file()


def test_a_directory_others_may_write_is_not_used(graph_file: Path, tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o777)
    graph = load_configured_graph(graph_file, directory)
    assert_same_graph(graph, load_edge_list(graph_file))
    assert list(directory.iterdir()) == [], "no snapshot where others could replace it"


def test_a_holder_reload_maps_the_new_snapshot_and_drops_the_old(
    graph_file: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "snap"
    holder = GraphHolder(graph_file, loader=lambda p: load_configured_graph(p, directory))
    holder.start()
    old = str(snapshot_path(directory, file_fingerprint(graph_file)))
    assert old in mapped_snapshots()
    write_generated_edge_list(graph_file, 300, 1500, seed=5)
    holder.load()
    new = str(snapshot_path(directory, file_fingerprint(graph_file)))
    assert new != old
    assert new in mapped_snapshots() and old not in mapped_snapshots()


def test_the_prefix_cache_bound_is_per_machine() -> None:
    one = Settings(prefix_cache_bytes=120 * 2**20, workers=1)
    three = Settings(prefix_cache_bytes=120 * 2**20, workers=3)
    assert one.prefix_cache_bytes_per_worker == 120 * 2**20
    assert three.prefix_cache_bytes_per_worker == 40 * 2**20
    caches = build_caches(three, namespace="t")
    prefix = np.ones(2**20, dtype=np.float64)  # 8 MiB each: 5 fit in a worker's 40 MiB
    for seed in range(12):
        caches.prefixes.put("v", seed, "edge", 0.8, 1e-7, 10, prefix)
    kept = sum(caches.prefixes.get("v", s, "edge", 0.8, 1e-7, 10) is not None for s in range(12))
    assert 1 <= kept <= 5


# --------------------------------------------------------------------------- processes


def _worker_pids(server_log: list[dict[str, object]]) -> set[int]:
    return {int(str(line["pid"])) for line in server_log if line.get("route") == "/healthz"}


def _mapping(pid: int, path: Path) -> dict[str, int]:
    """Sizes (kB) of the mapping of ``path`` in process ``pid`` (summed over its ranges)."""
    total: dict[str, int] = {}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) > 5 and fields[5] == str(path) and len(fields) == 6
            if inside:
                total["inode"] = int(fields[4])
        elif inside and len(fields) >= 2 and fields[0].endswith(":") and fields[1].isdigit():
            total[fields[0][:-1]] = total.get(fields[0][:-1], 0) + int(fields[1])
    return total


def _ask_all(base_url: str, path: str, key: str, count: int = 40) -> list[httpx.Response]:
    def ask(_: int) -> httpx.Response:  # a new connection each
        return fresh.get(path, headers=bearer(key))

    with new_connection_each(base_url, timeout=30) as fresh, ThreadPoolExecutor(8) as pool:
        return list(pool.map(ask, range(count)))


@pytest.mark.postgres
@pytest.mark.slow
def test_workers_share_one_mapping_follow_a_reload_and_a_restarted_worker_maps_it_too(
    postgres_url: str, tmp_path: Path
) -> None:
    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES * 10, GRAPH_EDGES * 10, seed=7)
    upgrade(postgres_url)
    with open_ledger(postgres_url) as ledger:
        admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
        admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
    directory = tmp_path / "graph-snapshots"
    backend = Backend("postgres", postgres_url, None, graph_path)
    env = {"PPR_GRAPH_VERSION_CHECK_MS": "200", "PPR_GRAPH_SNAPSHOT_DIR": str(directory)}
    with uvicorn_server(backend, workers=2, extra_env=env, forked=True) as server:
        first = snapshot_path(directory, file_fingerprint(graph_path))
        workers = _worker_pids(server.log_lines())
        assert len(workers) == 2
        for pid in workers:
            mapping = _mapping(pid, first)
            assert mapping.get("inode") == first.stat().st_ino, f"worker {pid} maps the snapshot"
            assert mapping.get("Private_Dirty", 0) == 0 and mapping.get("Anonymous", 0) == 0
        assert sorted(os.listdir(directory)) == sorted([first.name, f".{first.stem}.lock"])

        # a reload writes the new file's snapshot; every worker maps it and drops the old one
        write_generated_edge_list(graph_path, GRAPH_NODES * 10, GRAPH_EDGES * 10 + 50, seed=8)
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            reloaded = http.post("/v1/admin/graph/reload", headers=bearer(admin_key))
        assert reloaded.status_code == 200
        new_version = reloaded.json()["version"]
        second = snapshot_path(directory, file_fingerprint(graph_path))
        assert second != first and second.is_file()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            answers = _ask_all(server.base_url, "/v1/admin/graph", admin_key)
            versions = {r.json()["version"] for r in answers}
            if versions == {new_version} and all(
                _mapping(pid, second) and not _mapping(pid, first) for pid in workers
            ):
                break
            time.sleep(0.3)
        for pid in workers:
            assert _mapping(pid, second).get("inode") == second.stat().st_ino
            assert not _mapping(pid, first), f"worker {pid} dropped the old mapping"

        # a worker killed with SIGKILL is replaced by one that maps the same snapshot
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        start = len(server.log_lines())
        deadline = time.monotonic() + 60
        replacement: set[int] = set()
        while not replacement and time.monotonic() < deadline:
            _ask_all(server.base_url, "/healthz", admin_key, count=8)
            replacement = _worker_pids(server.log_lines()[start:]) - workers
            time.sleep(0.2)
        assert replacement, "the supervisor started a new worker"
        for pid in replacement:
            assert _mapping(pid, second).get("inode") == second.stat().st_ino
        answers = _ask_all(server.base_url, "/v1/admin/graph", admin_key)
        assert {r.json()["version"] for r in answers} == {new_version}


def test_forking_workers_falls_back_to_spawning_when_uvicorn_has_no_hook(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from uvicorn.supervisors import multiprocess

    from service.api.forked_workers import fork_workers

    original = multiprocess.get_subprocess  # type: ignore[attr-defined]
    # restored after the test, whatever fork_workers does to it
    monkeypatch.setattr(multiprocess, "get_subprocess", original)
    assert fork_workers() is True
    assert multiprocess.get_subprocess is not original  # type: ignore[attr-defined]

    monkeypatch.delattr(multiprocess, "get_subprocess")
    with caplog.at_level("WARNING", logger="service.api.forked_workers"):
        assert fork_workers() is False
    assert not hasattr(multiprocess, "get_subprocess")
    assert "workers are spawned" in caplog.text
