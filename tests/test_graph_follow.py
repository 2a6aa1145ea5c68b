"""A graph reload reaches every worker: the ledger database records the version to serve."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from tests.api_support import GRAPH_EDGES, GRAPH_NODES, Backend, bearer, open_ledger, uvicorn_server
from tests.connection_support import new_connection_each


@pytest.mark.postgres
@pytest.mark.slow
def test_a_reload_on_one_worker_reaches_the_other(postgres_url: str, tmp_path: Path) -> None:
    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    upgrade(postgres_url)
    with open_ledger(postgres_url) as ledger:
        admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
        admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
    backend = Backend("postgres", postgres_url, None, graph_path)
    env = {"PPR_GRAPH_VERSION_CHECK_MS": "200"}

    def versions(server_url: str, count: int = 40) -> set[str]:
        def ask(_: int) -> str:  # a new connection each
            return str(fresh.get("/v1/admin/graph", headers=bearer(admin_key)).json()["version"])

        with new_connection_each(server_url, timeout=30) as fresh, ThreadPoolExecutor(16) as pool:
            return set(pool.map(ask, range(count)))

    with uvicorn_server(backend, workers=2, extra_env=env, forked=True) as server:
        before = versions(server.base_url)
        assert len(before) == 1
        with open_ledger(postgres_url) as ledger:
            assert ledger.graph_versions.current_graph_version() == next(iter(before))

        write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            reloaded = http.post("/v1/admin/graph/reload", headers=bearer(admin_key))
        assert reloaded.status_code == 200
        new = reloaded.json()["version"]
        assert {new} != before
        with open_ledger(postgres_url) as ledger:
            assert ledger.graph_versions.current_graph_version() == new

        deadline = time.monotonic() + 60  # the other worker follows within a check interval
        while versions(server.base_url) != {new} and time.monotonic() < deadline:
            time.sleep(0.2)  # plus its own load time (a busy machine may be slow)
        start = len(server.log_lines())
        after = versions(server.base_url, count=60)
        log = server.log_lines()[start:]
    assert after == {new}, "every worker serves the reloaded version"
    served_by = {line["pid"] for line in log if line.get("route") == "/v1/admin/graph"}
    assert len(served_by) == 2, "both worker processes answered after the reload"


def test_a_holder_follows_a_file_chosen_elsewhere(tmp_path: Path) -> None:
    """Two holders on one ledger stand for two workers: one loads an admin-chosen file, the
    other follows the recorded version from the recorded file, not its own configured one."""
    from service.serving.graph_holder import GraphHolder

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    first, chosen = tmp_path / "first.txt", tmp_path / "chosen.txt"
    write_generated_edge_list(first, GRAPH_NODES, GRAPH_EDGES, seed=7)
    write_generated_edge_list(chosen, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
    with open_ledger(url) as ledger:
        here = GraphHolder(first, versions=ledger.graph_versions, check_seconds=0.0)
        there = GraphHolder(first, versions=ledger.graph_versions, check_seconds=0.0)
        here.load()
        there.load(publish=False)
        assert here.current.version == there.current.version
        new = here.load(chosen).graph.version
        assert ledger.graph_versions.current_graph_path() == str(chosen)
        assert there.current.version == new and there.source == str(chosen)
        broken = tmp_path / "broken.txt"
        broken.write_text("1 2\n3\n")  # a line with one id
        with pytest.raises(Exception):  # noqa: B017 - the loader's own error
            here.load(broken)
        assert here.current.version == new and here.source == str(chosen)


def test_a_restarted_worker_keeps_an_admins_choice_and_starts_without_the_database(
    tmp_path: Path,
) -> None:
    """A worker restarted after a crash serves the file an admin reloaded to, not its
    configured one; a changed configuration publishes its own file; a worker that starts while
    the database is down serves its configured file instead of failing."""
    from service.ledger import Ledger
    from service.ledger.database import make_engine
    from service.serving.graph_holder import GraphHolder

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    first, chosen, other = tmp_path / "first.txt", tmp_path / "chosen.txt", tmp_path / "other.txt"
    write_generated_edge_list(first, GRAPH_NODES, GRAPH_EDGES, seed=7)
    write_generated_edge_list(chosen, GRAPH_NODES, GRAPH_EDGES + 10, seed=8)
    write_generated_edge_list(other, GRAPH_NODES, GRAPH_EDGES + 20, seed=9)
    with open_ledger(url) as ledger:
        GraphHolder(first, versions=ledger.graph_versions).start()
        admin_choice = GraphHolder(first, versions=ledger.graph_versions).load(chosen).graph.version
        restarted = GraphHolder(first, versions=ledger.graph_versions)
        assert restarted.start().graph.version == admin_choice
        assert ledger.graph_versions.current_graph_version() == admin_choice
        reconfigured = GraphHolder(other, versions=ledger.graph_versions).start().graph.version
        assert ledger.graph_versions.current_graph_version() == reconfigured != admin_choice
    down = Ledger(make_engine(f"sqlite:///{tmp_path / 'missing' / 'ledger.db'}"))
    try:
        started = GraphHolder(first, versions=down.graph_versions).start()
    finally:
        down.dispose()
    assert started.source == str(first)
