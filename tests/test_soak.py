"""``python -m service soak`` end to end, shortened to seconds: it starts ``serve`` with two
workers, measures, loads, samples each worker's memory and verifies the ledger (the figures
themselves are never asserted on)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from service.graph.generate import write_generated_edge_list
from service.loadtest.soak import rss_bytes, worker_pids
from tests.api_support import free_port
from tests.cli_runner_support import run_cli


def test_rss_and_workers_of_a_missing_process_are_empty() -> None:
    assert rss_bytes(os.getpid()) is not None and rss_bytes(os.getpid()) > 0  # type: ignore[operator]
    assert rss_bytes(2**22 + 12345) is None
    assert worker_pids(2**22 + 12345) == []


@pytest.mark.slow
def test_a_short_soak_reports_errors_memory_per_worker_and_verifies(tmp_path: Path) -> None:
    graph = tmp_path / "graph.txt"
    write_generated_edge_list(graph, 300, 1500, seed=3)
    command = [
        "soak", "--minutes", "0.05", "--interval", "1",
        "--warmup", "0.5", "--measure-seconds", "1", "--load-fraction", "0.25",
        "--concurrency", "4", "--workers", "2",
        "--port", str(free_port()), "--graph", str(graph),
        "--database-url", f"sqlite:///{tmp_path / 'ledger.db'}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPR_")}
    # forked from the command runner (tests/cli_runner_support.py); the server it starts and
    # measures is a new interpreter, as soak starts it
    done = run_cli(command, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^requests: [\d,]+ in 3 s .* errors: 0 ", out, re.M), out
    workers = re.findall(r"^\| (\d+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \|$", out, re.M)
    assert len(workers) == 2, out
    assert "mismatches 0, admitted without release 0: ledger OK" in out


def test_the_summary_says_what_the_errors_were() -> None:
    from service.loadtest.soak import run_soak, summary
    from service.loadtest.workload import Workload

    # Nothing listens on this port: every request fails without an answer.
    workload = Workload(name="mixed", kind="path", path="/healthz")
    result = run_soak(
        f"http://127.0.0.1:{free_port()}", workload, rate=20, seconds=0.5, interval_s=10,
        timeout_s=5,
    )  # fmt: skip
    assert result.errors == result.requests > 0
    text = summary(result)
    assert f"the errors were: {result.errors} x no answer: ConnectError" in text
