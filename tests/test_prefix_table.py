"""The machine-wide prefix table: every seed's noise-free prefix, mapped by every worker."""

from __future__ import annotations

import os
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.cache.prefix_table_file import (
    TableInvalid,
    TableSpec,
    build_tables,
    graph_fingerprint,
    mapped_tables,
    open_table,
    write_table,
)
from service.config import MechanismSettings, Settings
from service.graph.configured import load_configured_graph
from service.graph.demo import demo_graph
from service.graph.generate import write_generated_edge_list
from service.graph.model import Graph
from service.ledger import upgrade
from service.mechanisms.diffusion import noise_free_prefix
from service.mechanisms.prefix_table import prefix_table
from service.privacy.modes import Mode
from service.serving import prefix_tables
from service.serving.graph_identity import as_served
from service.serving.prefix_tables import SharedPrefixTables, planned_specs
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    bearer,
    ledger_of,
    open_ledger,
    running_app,
    uvicorn_server,
    wait_for,
)
from tests.connection_support import new_connection_each

MODES = (Mode.EDGE, Mode.PERSONALIZED)


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, 300, 1500, seed=3)
    return path


@pytest.fixture
def graph(graph_file: Path, tmp_path: Path) -> Graph:
    return load_configured_graph(graph_file, tmp_path / "snap")


def spec_of(graph: Graph, mode: Mode = Mode.EDGE, m: int = 94) -> TableSpec:
    return TableSpec(graph.version, graph_fingerprint(graph), graph.n, mode.value, 0.8, 1e-7, m)


# --------------------------------------------------------------------------- the rows


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_row_is_the_noise_free_prefix_bit_for_bit(mode: Mode, tmp_path: Path) -> None:
    """On a graph of 140 nodes: two whole blocks of 64 seeds and a partial one, the cases the
    table's block loop has (the 300-node graph of the other tests had four whole blocks and a
    partial one, and took 3.1-3.2 CPU-s per mode, nearly all in the 300 one-seed references;
    140 nodes take 1.4-1.6)."""
    path = tmp_path / "graph.txt"
    write_generated_edge_list(path, 140, 700, seed=3)
    graph = load_configured_graph(path, tmp_path / "snap")
    assert graph.n == 140 and graph.n // 64 == 2 and graph.n % 64 > 0
    table = prefix_table(graph, mode, 0.8, 1e-7, 94)
    assert table.shape == (graph.n, graph.n)
    for seed in range(graph.n):
        assert np.array_equal(table[seed], noise_free_prefix(graph, seed, mode, 0.8, 1e-7, 94))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_rows_of_the_demo_graph_are_the_noise_free_prefix_bit_for_bit(mode: Mode) -> None:
    graph = demo_graph()
    seeds = range(graph.n - 70, graph.n)  # a whole block of 64 and a partial one
    rows = prefix_table(graph, mode, 0.8, 1e-7, 40, seeds)
    for row, seed in zip(rows, seeds, strict=True):
        assert np.array_equal(row, noise_free_prefix(graph, seed, mode, 0.8, 1e-7, 40)), seed


# --------------------------------------------------------------------------- the file


def test_a_table_file_maps_read_only_and_holds_the_rows(graph: Graph, tmp_path: Path) -> None:
    spec = spec_of(graph, Mode.PERSONALIZED, 20)
    path = spec.path(tmp_path / "snap")
    write_table(graph, spec, path)
    rows = open_table(path, spec)
    assert np.array_equal(rows, prefix_table(graph, Mode.PERSONALIZED, 0.8, 1e-7, 20))
    assert not rows.flags.writeable and not rows.flags.owndata
    assert not rows[7].flags.writeable and np.shares_memory(rows[7], rows)
    assert rows[7].flags.c_contiguous  # a seed's prefix is one contiguous row
    assert str(path) in mapped_tables()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".tmp"] == []


def test_a_corrupt_truncated_or_stale_table_is_never_served_and_is_rebuilt(
    graph: Graph, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "snap"
    spec = spec_of(graph, m=10)
    path = spec.path(directory)
    build_tables(graph, [spec], directory)
    good = path.read_bytes()

    corrupt = bytearray(good)
    corrupt[-8 * graph.n + 5] ^= 0x40  # one bit of the last row
    path.write_bytes(bytes(corrupt))
    with pytest.raises(TableInvalid, match="checksum"):
        open_table(path, spec)
    path.write_bytes(good[:-4096])
    with pytest.raises(TableInvalid, match="bytes, expected"):
        open_table(path, spec)
    path.write_bytes(good[:10])
    with pytest.raises(TableInvalid, match="truncated"):
        open_table(path, spec)
    path.write_bytes(b"x" * len(good))
    with pytest.raises(TableInvalid, match="not a prefix table"):
        open_table(path, spec)
    # another graph's or other parameters' table under this name (stale): refused too
    path.write_bytes(good)
    for other in (spec_of(graph, m=11), spec_of(graph, Mode.PERSONALIZED, 10)):
        assert other.path(directory) != path
        with pytest.raises(TableInvalid, match="another graph or parameters"):
            open_table(path, other)

    path.write_bytes(bytes(corrupt))
    with caplog.at_level("WARNING"):
        build_tables(graph, [spec], directory)
    assert "prefix table rejected" in caplog.text
    assert path.read_bytes() == good  # rebuilt, identical


def test_tables_unused_for_a_week_are_removed_when_one_is_written(
    graph: Graph, tmp_path: Path
) -> None:
    directory = tmp_path / "snap"
    old, recent = spec_of(graph, m=3), spec_of(graph, m=4)
    build_tables(graph, [old, recent], directory)
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(old.path(directory), (week_ago, week_ago))
    leftovers = [directory / ".old.prefix-build.lock", directory / ".prefixes-killed.tmp"]
    for path in [*leftovers, directory / ".new.prefix-build.lock"]:
        path.touch()
    for path in leftovers:
        os.utime(path, (week_ago, week_ago))
    build_tables(graph, [spec_of(graph, m=5)], directory)
    assert not old.path(directory).exists()
    assert not any(path.exists() for path in leftovers)
    assert (directory / ".new.prefix-build.lock").exists()
    assert recent.path(directory).exists() and spec_of(graph, m=5).path(directory).exists()
    assert list(directory.glob("graph-*.csr")), "the graph's snapshot stays"


# --------------------------------------------------------------------------- the bound


def test_a_graph_whose_tables_exceed_the_bound_gets_none_or_the_edge_mode_first(
    graph: Graph, tmp_path: Path
) -> None:
    one = graph.n * graph.n * 8
    mechanism = MechanismSettings()
    fingerprint = graph_fingerprint(graph)
    both, _ = planned_specs(graph, fingerprint, mechanism, 2 * one)
    assert [s.mode for s in both] == ["edge", "personalized"]
    assert {s.m for s in both} == {94}  # K - L, L = 6 at the default settings
    edge_only, left_out = planned_specs(graph, fingerprint, mechanism, 2 * one - 1)
    assert [s.mode for s in edge_only] == ["edge"] and [s.mode for s in left_out] == [
        "personalized"
    ]
    none, left_out = planned_specs(graph, fingerprint, mechanism, one - 1)
    assert none == [] and len(left_out) == 2

    tables = SharedPrefixTables(tmp_path / "snap", one - 1, mechanism, lambda: graph)
    tables.follow(now=True, wait=True)
    assert tables.lookup(graph, 0, Mode.EDGE, 0.8, 1e-7, 94) is None
    state = tables.state()
    assert state["status"] == "absent" and state["bytes"] == 0
    assert {t["status"] for t in state["tables"]} == {"over_bound"}
    assert not list((tmp_path / "snap").glob("prefixes-*")), "nothing built"
    off = SharedPrefixTables(tmp_path / "snap", 0, mechanism, lambda: graph)
    assert off.state()["status"] == "off" and off.lookup(graph, 0, Mode.EDGE, 0.8, 1e-7, 94) is None
    assert Settings(graph_snapshots=False).snapshot_directory is None  # then no table either


def test_a_directory_others_may_write_gets_no_table(graph: Graph, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    tables = SharedPrefixTables(shared, 2**30, MechanismSettings(), lambda: graph)
    tables.follow(now=True, wait=True)
    assert tables.state()["status"] == "absent"
    assert tables.lookup(graph, 0, Mode.EDGE, 0.8, 1e-7, 94) is None
    assert list(shared.iterdir()) == [], "no lock, no builder, no table"


def test_no_table_is_built_on_a_disk_without_room_for_it_and_the_headroom(
    graph: Graph, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole file system's size: more than can ever be free. Its free space at one moment
    # would not do, since other processes free space between that reading and the build's check.
    monkeypatch.setattr(prefix_tables, "DISK_HEADROOM_BYTES", shutil.disk_usage(tmp_path).total)
    tables = SharedPrefixTables(tmp_path / "snap", 2**30, MechanismSettings(), lambda: graph)
    tables.follow(now=True, wait=True)
    assert tables.lookup(graph, 0, Mode.EDGE, 0.8, 1e-7, 94) is None
    assert tables.state()["status"] == "absent"
    assert not list((tmp_path / "snap").glob("prefixes-*")), "nothing built"
    tables.close()


# --------------------------------------------------------------------------- serving


def test_a_reload_switches_tables_and_drops_the_old_one(graph_file: Path, tmp_path: Path) -> None:
    directory = tmp_path / "snap"
    served: list[Graph] = [load_configured_graph(graph_file, directory)]
    tables = SharedPrefixTables(
        directory, 2**30, MechanismSettings(steps=30), lambda: served[-1], check_seconds=0.0
    )
    try:
        wait_for(lambda: tables.state()["status"] == "ready", "the first graph's tables")
        first = served[-1]
        (edge_spec, _), _ = planned_specs(first, graph_fingerprint(first), tables.mechanism, 2**30)
        row = tables.lookup(first, 5, Mode.EDGE, 0.8, 1e-7, edge_spec.m)
        assert row is not None and not row.flags.writeable
        assert np.array_equal(row, noise_free_prefix(first, 5, Mode.EDGE, 0.8, 1e-7, edge_spec.m))
        assert tables.lookup(first, 5, Mode.EDGE, 0.8, 1e-7, edge_spec.m - 1) is None  # other m
        first_paths = [s.path(directory) for s in planned_specs(
            first, graph_fingerprint(first), tables.mechanism, 2**30)[0]]  # fmt: skip
        assert set(map(str, first_paths)) <= set(mapped_tables())
        del row

        write_generated_edge_list(graph_file, 300, 1550, seed=4)
        served.append(load_configured_graph(graph_file, directory))
        second = served[-1]
        assert second.version != first.version
        wait_for(
            lambda: (
                tables.state()["status"] == "ready"
                and tables.state()["graph_version"] == second.version
            ),
            "the reloaded graph's tables",
        )
        row = tables.lookup(second, 5, Mode.EDGE, 0.8, 1e-7, edge_spec.m)
        assert row is not None
        assert np.array_equal(row, noise_free_prefix(second, 5, Mode.EDGE, 0.8, 1e-7, edge_spec.m))
        assert tables.lookup(first, 5, Mode.EDGE, 0.8, 1e-7, edge_spec.m) is None
        assert not set(map(str, first_paths)) & set(mapped_tables()), "the old one is dropped"
    finally:
        tables.close()


def test_a_stopped_builder_leaves_no_file_behind(tmp_path: Path) -> None:
    path = tmp_path / "bigger.txt"
    write_generated_edge_list(path, 3000, 15000, seed=6)  # 72 MB per table: seconds to build
    directory = tmp_path / "snap"
    graph = load_configured_graph(path, directory)
    tables = SharedPrefixTables(directory, 2**30, MechanismSettings(), lambda: graph)
    tables.follow(now=True, wait=True)
    builder = tables._tables.builder if tables._tables is not None else None
    assert builder is not None and tables.state()["status"] == "building"
    wait_for(lambda: bool(list(directory.glob(".prefixes-*.tmp"))), "the builder writes")
    tables.close()  # as a worker that stops
    assert builder.returncode == 128 + 15  # SIGTERM, raised as SystemExit: the file removed
    assert not list(directory.glob(".prefixes-*.tmp")) and not list(directory.glob("prefixes-*"))


def _answer(client: Any, key: str, node: str) -> Any:
    response = client.get(
        f"/v1/ppr/{node}", params={"mode": "edge", "epsilon": 0.5, "fresh": "true", "k": 50},
        headers=bearer(key),
    )  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def test_a_served_query_starts_from_the_table_and_releases_the_same_vector(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=11)
    releases = {}
    for label, table_bytes in (("table", 2**30), ("no table", 0)):
        url = f"{sqlite_url}-{label.replace(' ', '-')}"
        upgrade(url)
        backend = Backend("sqlite", url, None, graph_path)
        settings = {"prefix_table_bytes": table_bytes, "graph_snapshot_dir": tmp_path / "snap"}
        with running_app(backend, **settings) as client:
            runtime = client.app.state.runtime  # type: ignore[attr-defined]
            ledger = ledger_of(client)
            admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
            admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
            service = ledger.accounts.create_account("service", cap_epsilon=100.0, delta=1e-6)
            key, _ = ledger.api_keys.create_api_key(service.account_id)

            def table_status(admin_key: str = admin_key) -> str:
                body = client.get("/readyz", headers=bearer(admin_key)).json()
                return str(body["checks"]["prefix_table"]["status"])

            if table_bytes:
                wait_for(lambda: table_status() == "ready", "the table")
                assert client.get("/readyz", headers=bearer(admin_key)).json()["checks"][
                    "prefix_table"]["bytes"] == 2 * GRAPH_NODES * GRAPH_NODES * 8  # fmt: skip
            else:
                assert table_status() == "off"
            # test only: the same generator for the query in both runs
            monkeypatch.setattr(
                "service.serving.pipeline.draw.fresh_generator", lambda: np.random.default_rng(7)
            )
            before = runtime.queries.engine.stats()["column_steps"]
            body = _answer(client, key, "17")
            steps = runtime.queries.engine.stats()["column_steps"] - before
            monkeypatch.undo()
            noisy = body["mechanism"]["noisy_steps"]
            assert steps == (noisy if table_bytes else body["mechanism"]["steps"]), label
            assert runtime.queries.prefixes.tables.hits == (1 if table_bytes else 0)
            releases[label] = body["results"]
    assert releases["table"] == releases["no table"]


#: Seconds between two looks at what the server's workers map.
LOOK_SECONDS = 1.0


def _worker_pids(lines: list[dict[str, Any]]) -> set[int]:
    return {int(str(line["pid"])) for line in lines if line.get("route") == "/readyz"}


@pytest.mark.postgres
@pytest.mark.slow
def test_two_workers_map_one_table_file_built_by_one_process(
    postgres_url: str, tmp_path: Path
) -> None:
    from tests.test_graph_snapshot import _mapping

    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES * 2, GRAPH_EDGES * 2, seed=5)
    upgrade(postgres_url)
    with open_ledger(postgres_url) as ledger:
        admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
        admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
    directory = tmp_path / "graph-snapshots"
    backend = Backend("postgres", postgres_url, None, graph_path)
    env = {"PPR_PREFIX_TABLE_BYTES": str(2**30), "PPR_GRAPH_SNAPSHOT_DIR": str(directory)}

    def served() -> Graph:  # as the workers serve it: with the public id the ledger records
        with open_ledger(postgres_url) as ledger:
            return as_served(
                load_configured_graph(graph_path, directory),
                ledger.graph_versions,
                max_degree_bound=10_000,
            )

    with (
        uvicorn_server(backend, workers=2, extra_env=env, forked=True) as server,
        new_connection_each(server.base_url, timeout=30) as fresh,
    ):
        graph = served()
        specs, _ = planned_specs(graph, graph_fingerprint(graph), Settings(steps=30), 2**30)
        paths = [spec.path(directory) for spec in specs]
        assert len(paths) == 2

        def ask(_: int) -> dict[str, Any]:  # a new connection each
            body: dict[str, Any] = fresh.get("/readyz", headers=bearer(admin_key)).json()
            return body

        def both_map_both() -> bool:
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(ask, range(8)))
            workers = _worker_pids(server.log_lines())
            return len(workers) == 2 and all(
                _mapping(pid, path) for pid in workers for path in paths
            )

        # each look is a dozen requests and reads of both workers' smaps: look less often, so
        # that the looking does not slow the build it waits for
        wait_for(both_map_both, "both workers map both tables", every=LOOK_SECONDS)
        for pid in _worker_pids(server.log_lines()):
            for path in paths:
                mapping = _mapping(pid, path)
                assert mapping.get("inode") == path.stat().st_ino
                assert mapping.get("Private_Dirty", 0) == 0 and mapping.get("Anonymous", 0) == 0
        assert ask(0)["checks"]["prefix_table"]["status"] == "ready"
        lines = server.log_lines()
        started = [line for line in lines if line.get("message") == "prefix table builder started"]
        written = [line for line in lines if line.get("message") == "prefix table written"]
        assert len(started) == 1, "one builder per machine"
        assert sorted(line["mode"] for line in written) == ["edge", "personalized"]
        assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in paths)

        # a reload gets its own tables; both workers map them and drop the old ones
        write_generated_edge_list(graph_path, GRAPH_NODES * 2, GRAPH_EDGES * 2 + 40, seed=6)
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            assert http.post("/v1/admin/graph/reload", headers=bearer(admin_key)).is_success
        graph = served()
        specs, _ = planned_specs(graph, graph_fingerprint(graph), Settings(steps=30), 2**30)
        old_paths, paths = paths, [spec.path(directory) for spec in specs]
        assert not set(paths) & set(old_paths)

        def both_switched() -> bool:
            if not both_map_both():
                return False
            workers = _worker_pids(server.log_lines())
            return not any(_mapping(pid, path) for pid in workers for path in old_paths)

        wait_for(
            both_switched, "both workers map the new tables and not the old ones",
            every=LOOK_SECONDS,
        )  # fmt: skip
        assert ask(0)["checks"]["prefix_table"]["graph_version"] == graph.version
