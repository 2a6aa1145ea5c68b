"""``make bench``'s report (benchmarks/speed_targets.py): the rows it reads from the tools'
``--json`` reports, and the met / not-met arithmetic. No server or benchmark runs here."""

from __future__ import annotations

import math
from typing import Any

import pytest

from service.loadtest.report import PhaseResult
from tests.script_support import load_benchmark

st = load_benchmark("speed_targets")


def _phase(name: str, requests: int, *, p99: float = 50.0, items: int = 1, **extra: Any) -> Any:
    return PhaseResult(
        phase=name, driver="wrk", concurrency=32, seconds=10.0, requests=requests, errors=0,
        p50_ms=p99 / 3, p90_ms=p99 / 2, p99_ms=p99, items_per_request=items, **extra,
    )  # fmt: skip


def _load_report(**overrides: Any) -> dict[str, Any]:
    """A report shaped as ``loadtest --json`` prints it (the phases' own ``to_dict``)."""
    phases = {
        "healthz": _phase("healthz", 30_000),
        "fresh": _phase("fresh", 5_000, p99=80.0),
        "replay": _phase("replay", 14_000),
        "batch": _phase("batch", 90, items=200, p99=2_000.0),
    }
    phases.update(overrides)
    ref = phases["healthz"].rps
    return {
        "graph": {"nodes": 4039, "edges": 88234, "source": "facebook_combined.txt"},
        "driver": "wrk",
        "prefix_table": "ready",
        "concurrency": 32,
        "duration_s": 10.0,
        "phases": [p.to_dict(ref) for p in phases.values()],
    }


def _bench_report(warm_x: float = 120.0, cold_x: float = 14.0) -> dict[str, Any]:
    """A report shaped as ``bench --json`` prints it (the rows it reads)."""
    naive = 1000.0
    rows = [
        {"mechanism": "noisy_cold", "batch": 1, "p50_ms": 150.0, "speedup_vs_naive": 6.7},
        {"mechanism": "noisy_warm", "batch": 1, "p50_ms": 30.0, "speedup_vs_naive": 33.3},
        {"mechanism": "naive_reference", "batch": 1, "p50_ms": naive, "speedup_vs_naive": 1.0},
        {"mechanism": "noisy_cold", "batch": 32, "p50_ms": naive / cold_x,
         "speedup_vs_naive": cold_x},
        {"mechanism": "noisy_warm", "batch": 32, "p50_ms": naive / warm_x,
         "speedup_vs_naive": warm_x},
    ]  # fmt: skip
    return {"graph": {"nodes": 100_000, "edges": 2_000_000}, "latency": rows}


def _by_key(rows: list[Any]) -> dict[str, Any]:
    return {row.target.key: row for row in rows}


def test_targets_met_at_least_and_at_most_including_the_boundary() -> None:
    assert st.FRESH_SHARE.met(0.15) and not st.FRESH_SHARE.met(0.1499)
    assert st.FRESH_P99.met(100.0) and not st.FRESH_P99.met(100.1)
    assert st.FRESH_ERRORS.met(0) and not st.FRESH_ERRORS.met(1)
    assert st.BATCH_SEEDS.ratio(750.0) == pytest.approx(0.5)
    assert st.FRESH_P99.ratio(250.0) == pytest.approx(2.5)  # at most: > 1 is missed
    assert st.FRESH_ERRORS.ratio(3) is None  # no ratio to a target of 0


def test_the_load_rows_from_a_loadtest_report() -> None:
    rows = _by_key(st.load_rows(_load_report()))
    assert list(rows) == [t.key for t in st.LOAD_TARGETS]
    # batch: 90 calls of 200 seeds in 10 s
    assert rows["batch_seeds_per_s"].figure == pytest.approx(1800.0)
    assert rows["batch_seeds_per_s"].met is True
    assert rows["batch_seeds_per_s"].cells()[1:] == [
        "1,800 seeds/s (90 calls finished, p50 0.7 s a call; 0.600 seeds per /healthz request)",
        "1.20", "yes",
    ]  # fmt: skip
    # fresh: 500 of 3,000 req/s
    fresh = rows["fresh_share_of_healthz"]
    assert fresh.figure == pytest.approx(1 / 6) and fresh.met is True
    assert fresh.cells()[1] == "16.7% (500.0 of 3,000.0 req/s)"
    assert rows["fresh_p99_ms"].cells()[1:] == ["80.0 ms", "0.80", "yes"]
    assert rows["fresh_errors"].cells()[1:] == ["0 of 5,000 requests", "-", "yes"]
    # replays: 1,400 of 3,000 req/s, under half
    replay = rows["replay_share_of_healthz"]
    assert replay.figure == pytest.approx(1400 / 3000) and replay.met is False
    assert replay.cells()[2:] == ["0.93", "no"]


def test_missed_load_targets_and_errors_are_shown() -> None:
    slow = _load_report(
        fresh=_phase("fresh", 2_000, p99=240.0, statuses={"200": 1990, "503": 10}),
        batch=_phase("batch", 0, items=200, p99=math.nan),
    )
    for phase in slow["phases"]:
        if phase["phase"] == "fresh":
            phase["errors"] = 10
    rows = _by_key(st.load_rows(slow))
    assert rows["fresh_share_of_healthz"].met is False
    assert rows["fresh_p99_ms"].cells()[2:] == ["2.40", "no"]
    assert rows["fresh_errors"].figure == 10 and rows["fresh_errors"].met is False
    batch = rows["batch_seeds_per_s"]
    assert batch.figure == 0 and batch.met is False and "longer --duration" in batch.shown


def test_a_reference_other_than_wrk_is_said() -> None:
    report = _load_report()
    report["driver"] = "httpx"
    rows = _by_key(st.load_rows(report))
    assert "measured by httpx, not wrk" in rows["fresh_share_of_healthz"].shown


@pytest.mark.parametrize(
    "spoil",
    [
        lambda r: r["phases"].pop(2),  # no replay phase
        lambda r: r["phases"][1].update(p99_ms=math.nan),  # fresh without a p99
        lambda r: r["phases"][0].update(requests=0, rps=0.0),  # /healthz answered nothing
        lambda r: r.pop("phases"),
    ],
)
def test_a_report_without_a_figure_is_a_failed_measurement(spoil: Any) -> None:
    report = _load_report()
    spoil(report)
    with pytest.raises(st.MeasurementFailed):
        st.load_rows(report)


def test_the_engine_rows_from_a_bench_report() -> None:
    rows = _by_key(st.engine_rows(_bench_report(warm_x=120.0, cold_x=14.0)))
    assert rows["warm_block_x_naive"].cells()[1:] == [
        "120.0x (8.33 against 1,000.0 ms a query)", "1.20", "yes",
    ]  # fmt: skip
    assert rows["cold_block_x_naive"].met is False
    assert rows["cold_block_x_naive"].ratio == pytest.approx(14 / 15)
    without_blocks = _bench_report()
    without_blocks["latency"] = without_blocks["latency"][:3]
    with pytest.raises(st.MeasurementFailed, match="batch 32"):
        st.engine_rows(without_blocks)


def test_the_rows_against_the_papers_code_from_a_bench_report() -> None:
    """Warm blocks of 32 and a lone cold query, each the papers' p50 over the service's."""
    report = _bench_report()
    papers_ms = 240.0
    for row in report["latency"]:
        row["speedup_vs_papers"] = papers_ms / row["p50_ms"]
    report["latency"].append({"mechanism": "papers_code", "batch": 1, "p50_ms": papers_ms,
                              "speedup_vs_papers": 1.0})  # fmt: skip
    rows = _by_key(st.papers_rows(report))
    assert list(rows) == [t.key for t in st.PAPERS_TARGETS]
    # warm: 1,000 / 120 ms a query in blocks of 32; cold: 150 ms alone
    assert rows["papers_warm_block_x"].cells()[1:] == [
        "28.8x (8.33 against 240.0 ms a query)", "0.29", "no",
    ]  # fmt: skip
    assert rows["papers_lone_cold_x"].figure == pytest.approx(1.6)
    assert rows["papers_lone_cold_x"].met is False
    without_papers = _bench_report()
    with pytest.raises(st.MeasurementFailed, match="papers_code row"):
        st.papers_rows(without_papers)


def test_the_table_the_tally_and_the_rows_not_measured() -> None:
    rows = [
        *st.load_rows(_load_report()),
        *st.failed_rows(st.ENGINE_TARGETS, "bench exited with status 2 without a report"),
        *st.not_measured_rows(),
    ]
    text = st.table(rows)
    lines = text.splitlines()
    assert lines[0] == "| target | figure | ratio to target | met? |"
    assert len(lines) == 2 + len(rows)
    papers = [line for line in lines if "papers' code" in line]
    assert len(papers) == 2
    assert all(line.endswith("| - | - |") and "give --papers-code" in line for line in papers)
    assert sum(line.endswith("| FAILED |") for line in lines) == 2
    assert st.tally(rows) == ("4 of 5 measured targets met; 2 not measured; 2 FAILED to measure")
    assert [row.to_dict()["met"] for row in st.not_measured_rows()] == [None, None]
    (failed,) = st.failed_rows([st.WARM_BLOCK], "cannot connect | refused\n(Background: ...)")
    assert failed.shown == "measurement failed: cannot connect / refused"


def test_the_json_report_is_strict() -> None:
    assert st.finite({"a": [1.0, math.nan], "b": math.inf, "c": "x"}) == {
        "a": [1.0, None], "b": None, "c": "x",
    }  # fmt: skip
