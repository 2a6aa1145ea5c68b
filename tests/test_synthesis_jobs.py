"""Synthesis runs as jobs (SQLite and PostgreSQL): the job's record in the ledger, the
heartbeat that keeps a long run's charge alive against the reconciler, a dead process's run
failed and refunded, and one worker's job slots."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from service.config import Settings
from service.graph.loader import load_edge_list
from service.ledger import Ledger
from service.ledger.tables import GraphRelease, SynthesisJob
from service.serving.reconciler import Reconciler
from service.synthetic.jobs import SynthesisBusy, SynthesisRunner
from service.synthetic.privdpr import PrivdprParams
from service.synthetic.release import Request, plan_request, start_job, synthesize_release
from service.synthetic.sampling import erdos_renyi

# it mostly waits (10.7 s, 3.6 CPU-s in a run of the suite): scheduled apart, conftest.py
pytestmark = pytest.mark.waits

_TINY = PrivdprParams(embedding_dim=8, hidden_dim=4, start_nodes=8, walks=1, walk_length=4,
                      epochs=1, score_rounds=2)  # fmt: skip


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(6)
    u, v = erdos_renyi(60, 240, rng)
    path = tmp_path / "graph.txt"
    path.write_text("".join(f"n{a} n{b}\n" for a, b in zip(u, v, strict=True)))
    return path


def _utc(moment: datetime | None) -> datetime:
    assert moment is not None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _rows(ledger: Ledger, job_id: str) -> tuple[SynthesisJob, GraphRelease]:
    from sqlalchemy.orm import Session

    with Session(ledger.engine) as session:
        job = session.get(SynthesisJob, job_id)
        assert job is not None
        release = session.get(GraphRelease, job.release_id)
        assert release is not None
        return job, release


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(2000):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def _degrees_after(
    gate: threading.Event, graph_degrees: np.ndarray
) -> Callable[[], tuple[np.ndarray, str]]:
    def degrees() -> tuple[np.ndarray, str]:
        assert gate.wait(60), "the test never opened the gate"
        return graph_degrees.astype(float) + 0.5, "popular_degrees:test"

    return degrees


@pytest.mark.parametrize("beats", [True, False], ids=["heartbeat", "control-no-heartbeat"])
def test_reconciler_spares_a_beating_run_and_refunds_a_silent_one(
    ledger: Ledger, graph_file: Path, tmp_path: Path, beats: bool
) -> None:
    """A run still drawing after the reconciler's limit keeps its charge while it beats; the
    control (no heartbeat, as every release was before) is refunded by the same pass, and its
    draw is then never released."""
    graph = load_edge_list(graph_file)
    gate = threading.Event()
    out = tmp_path / "synthetic.txt"
    failures: list[BaseException] = []

    def run() -> None:
        try:
            synthesize_release(
                ledger, graph, Request("chung_lu", 1.0), out, cap=None,
                degrees=_degrees_after(gate, graph.degrees),
                rng_factory=np.random.default_rng, heartbeat_seconds=0.05 if beats else 0.0,
            )  # fmt: skip
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        _wait_for(lambda: ledger.synthesis.synthesis_jobs()[1] == 1, "the job")
        job_id = ledger.synthesis.synthesis_jobs()[0][0].job_id
        started = _utc(_rows(ledger, job_id)[1].created_at)
        if beats:  # a beat well after the start: the run is older than the cutoff below
            _wait_for(
                lambda: (
                    (_utc(_rows(ledger, job_id)[1].heartbeat_at) - started).total_seconds() > 1.0
                ),
                "a heartbeat",
            )
        else:
            threading.Event().wait(1.2)
        # cutoff = start + 0.5 s: older than the run's start, younger than its last beat
        age = (datetime.now(UTC) - started).total_seconds()
        refunded_before = ledger.reports.exposure(delta=1e-5).graph_releases
        Reconciler(ledger, older_than_seconds=age - 0.5, interval_seconds=0).run_once()
        job, release = _rows(ledger, job_id)
        if beats:
            assert (job.state, release.state) == ("running", "admitted")
        else:
            assert (job.state, release.state) == ("failed", "refunded")
            assert job.error_code == "worker_lost"
        assert refunded_before == 1
    finally:
        gate.set()
        thread.join()
    job, release = _rows(ledger, job_id)
    if beats:
        assert not failures and out.exists()
        assert (job.state, job.progress, release.state) == ("done", 1.0, "released")
    else:
        assert failures and getattr(failures[0], "code", "") == "charge_settled"
        assert not out.exists() and not list(tmp_path.glob(".synthetic-*"))
        assert ledger.reports.exposure(delta=1e-5).graph_releases == 0
    assert ledger.reports.verify().ok


_STARTER = """
import sys, threading
import numpy as np
from service.graph.loader import load_edge_list
from service.ledger import Ledger
from service.ledger.graph_releases import Heartbeat
from service.synthetic.release import Request, plan_request, start_job

ledger = Ledger.from_url(sys.argv[1])
graph = load_edge_list(sys.argv[2])
request = Request("communities", 1.0)
plan = plan_request(request, graph)
job = start_job(ledger, graph, request, plan, cap=None, source="cli")
with Heartbeat(lambda: ledger.synthesis.beat_synthesis(job.job_id, 0.25), 0.05):
    print(job.job_id, flush=True)
    threading.Event().wait()
"""


def test_a_run_whose_process_died_is_failed_and_refunded(
    ledger: Ledger, ledger_url: str, graph_file: Path
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _STARTER, ledger_url, str(graph_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        job_id = process.stdout.readline().strip()
        assert len(job_id) == 32, job_id
        _wait_for(lambda: ledger.synthesis.synthesis_job(job_id).progress == 0.25, "a beat")
        assert ledger.reports.exposure(delta=1e-5).epsilon > 0.5
        # alive and beating: a pass with a limit longer than its beat interval spares it
        assert Reconciler(ledger, older_than_seconds=1.0, interval_seconds=0).run_once() == []
        assert ledger.synthesis.synthesis_job(job_id).state == "running"
    finally:
        process.kill()
        process.wait()
    last = _utc(_rows(ledger, job_id)[0].heartbeat_at)
    _wait_for(lambda: (datetime.now(UTC) - last).total_seconds() > 0.6, "the limit")
    Reconciler(ledger, older_than_seconds=0.5, interval_seconds=0).run_once()
    job = ledger.synthesis.synthesis_job(job_id)
    assert (job.state, job.release_state, job.error_code) == ("failed", "refunded", "worker_lost")
    report = ledger.reports.exposure(delta=1e-5)
    assert (report.epsilon, report.graph_releases) == (0.0, 0)
    assert ledger.synthesis.synthesis_payload(job_id) is None
    assert ledger.reports.verify().ok


def test_one_worker_runs_its_limit_of_jobs_and_refuses_more_uncharged(
    ledger: Ledger, ledger_url: str, graph_file: Path
) -> None:
    graph = load_edge_list(graph_file)
    gate = threading.Event()
    settings = Settings(database_url=ledger_url, synthesis_jobs_per_worker=1)
    held = _degrees_after(gate, graph.degrees)
    runner = SynthesisRunner(ledger, settings, lambda g, cap: held(), np.random.default_rng)
    first = runner.start(graph, Request("chung_lu", 1.0), actor_account_id=None)
    try:
        with pytest.raises(SynthesisBusy) as busy:
            runner.start(graph, Request("communities", 1.0), actor_account_id=None)
        assert busy.value.status == 429
        assert ledger.synthesis.synthesis_jobs()[1] == 1  # the refused one left nothing
        assert ledger.reports.exposure(delta=1e-5).epsilon == 0.0  # chung_lu is free
    finally:
        gate.set()
    _wait_for(lambda: ledger.synthesis.synthesis_job(first.job_id).state == "done", "the first job")
    started: list[object] = []

    def start_again() -> bool:
        try:
            started.append(runner.start(graph, Request("communities", 1.0), actor_account_id=None))
        except SynthesisBusy:  # the first job's thread has not yet given its slot back
            return False
        return True

    _wait_for(start_again, "a free slot")
    runner.close()
    assert ledger.reports.verify().ok


def test_plan_and_start_check_before_charging(ledger: Ledger, graph_file: Path) -> None:
    from service.errors import InvalidParameter
    from service.ledger import GraphBudgetExhausted, GraphCap
    from service.synthetic.communities import CommunityParams

    graph = load_edge_list(graph_file)
    with pytest.raises(InvalidParameter):
        plan_request(Request("communities", 1.0, communities=CommunityParams(groups=1)), graph)
    request = Request("communities", 1.0)
    with pytest.raises(GraphBudgetExhausted):
        start_job(ledger, graph, request, plan_request(request, graph),
                  cap=GraphCap(0.5, 1e-5, max_charge=None), source="api")  # fmt: skip
    assert ledger.synthesis.synthesis_jobs() == ([], 0)
    assert ledger.reports.exposure(delta=1e-5).graph_releases == 0


def test_verify_flags_a_job_whose_release_disagrees(ledger: Ledger, graph_file: Path) -> None:
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    graph = load_edge_list(graph_file)
    request = Request("communities", 1.0)
    job = start_job(ledger, graph, request, plan_request(request, graph), cap=None, source="cli")
    assert ledger.reports.verify().ok  # running, its release admitted
    with Session(ledger.engine) as session, session.begin():
        session.execute(
            update(SynthesisJob).where(SynthesisJob.id == job.job_id).values(state="done")
        )
    report = ledger.reports.verify()
    assert not report.ok
    assert report.mismatches[0]["kind"] == "synthesis"
    assert report.mismatches[0]["job_id"] == job.job_id


def test_runs_made_before_the_jobs_table_are_backfilled(
    ledger: Ledger, ledger_url: str, graph_file: Path, tmp_path: Path
) -> None:
    """A ledger written before revision 0007 (its synthesis runs only graph releases) gets a
    job per run on upgrade, from the payload's header, and still verifies."""
    from alembic import command

    from service.ledger import upgrade
    from service.ledger.database import alembic_config

    graph = load_edge_list(graph_file)
    done = synthesize_release(ledger, graph, Request("communities", 1.0), tmp_path / "a.txt",
                              cap=None, rng_factory=np.random.default_rng)  # fmt: skip

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny = Request("privdpr", 1.0, privdpr=_TINY)
        synthesize_release(ledger, graph, tiny, tmp_path / "b.txt", cap=None, progress=interrupt,
                           rng_factory=np.random.default_rng)  # fmt: skip
    before = {j.job_id: j for j in ledger.synthesis.synthesis_jobs()[0]}
    ledger.dispose()
    command.downgrade(alembic_config(ledger_url), "0006_idempotency_binding")  # main's schema
    upgrade(ledger_url)
    after = Ledger.from_url(ledger_url)
    try:
        jobs = {j.job_id: j for j in after.synthesis.synthesis_jobs()[0]}
        assert set(jobs) == set(before)
        ran = jobs[done.release_name.rsplit(":", 1)[1]]
        assert (ran.state, ran.privacy_unit, ran.sha256, ran.edges) == (
            "done", "edge", done.sha256, done.edges)  # fmt: skip
        assert ran.epsilon == done.epsilon and ran.source == "cli"
        failed = next(j for j in jobs.values() if j.method == "privdpr")
        assert (failed.state, failed.release_state, failed.privacy_unit) == (
            "failed", "refunded", "node")  # fmt: skip
        assert after.synthesis.synthetic_release_by_sha256(done.sha256) is not None
        assert after.reports.verify().ok
    finally:
        after.dispose()


def test_a_stopping_worker_fails_and_refunds_its_running_job(
    ledger: Ledger, ledger_url: str, graph_file: Path
) -> None:
    graph = load_edge_list(graph_file)
    gate = threading.Event()
    held = _degrees_after(gate, graph.degrees)
    settings = Settings(database_url=ledger_url, release_heartbeat_seconds=0.05)
    runner = SynthesisRunner(ledger, settings, lambda g, cap: held(), np.random.default_rng)
    job = runner.start(graph, Request("chung_lu", 1.0), actor_account_id=None)
    try:
        runner.close(wait_seconds=0.1)  # the draw is still held: the job is failed under it
        stopped = ledger.synthesis.synthesis_job(job.job_id)
        assert (stopped.state, stopped.error_code) == ("failed", "worker_stopped")
    finally:
        gate.set()  # the draw ends, finds its job settled and releases nothing
    _wait_for(lambda: not runner._running, "the job's thread")
    final = ledger.synthesis.synthesis_job(job.job_id)
    assert (final.state, final.release_state, final.error_code) == (
        "failed", "refunded", "worker_stopped")  # fmt: skip
    assert ledger.synthesis.synthesis_payload(job.job_id) is None
    assert ledger.reports.verify().ok
