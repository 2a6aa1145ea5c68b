"""Helpers of the batch tests: the graph, the options, and the ledger checks of a run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from service.batch import BatchOptions, BatchSummary, FailureInjection
from service.config import Settings
from service.ledger import Ledger, upgrade
from service.privacy.modes import Mode
from tests.shared_data import shared_file

#: Fewer diffusion steps than the default keep the tests quick; the path is the same.
STEPS = 20

#: The mark of the modules that run the local engine in the test process (test_batch,
#: test_batch_embeddings): one xdist worker runs them all, so the multiprocessing fork server
#: their pools are forked from (started once a process, importing the engine) is started once,
#: not on every worker their tests land on.
LOCAL_POOL_GROUP = pytest.mark.xdist_group("batch_local_pool")


def facebook_graph() -> Path:
    return shared_file("facebook_combined.txt")


def seeds_file(tmp_path: Path, count: int, *, start: int = 0) -> Path:
    path = tmp_path / "seeds.txt"
    path.write_text("# users to precompute\n" + "".join(f"{i}\n" for i in range(start, count)))
    return path


def options(
    url: str,
    graph: Path | None,
    seeds: Path,
    out: Path | str,
    *,
    run_id: str,
    engine: str = "local",
    failure: FailureInjection | None = None,
    retries: int = 0,
    mode: Mode = Mode.PERSONALIZED,
    service_account_id: int | None = None,
    create: bool = True,
    block_size: int = 40,
    k: int = 10,
    workers: int = 2,
    mechanism: str | None = None,
) -> BatchOptions:
    return BatchOptions(
        sink=str(out),
        mode=mode,
        epsilon=0.1,
        k=k,
        mechanism=mechanism,
        accounts_file=seeds,
        graph_path=graph,
        run_id=run_id,
        service_account_id=service_account_id,
        create_missing_accounts=create,
        engine=engine,
        workers=workers,
        block_size=block_size,
        retries=retries,
        settings=Settings(database_url=url, steps=STEPS, redis_url=None),
        progress=False,
        failure=failure,
    )


def migrated(url: str) -> str:
    upgrade(url)
    return url


def run_charges(url: str, run_id: str) -> list[tuple[str, str, int, str]]:
    """(seed, state, principal, idempotency key) of every per-seed charge the run made."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT seed, state, principal_account_id, idempotency_key FROM charges "
                    # a seed's degree-release charge (once per graph version) is not one of
                    # the run's per-seed charges
                    "WHERE request_id LIKE :prefix AND mechanism <> 'degree_release' ORDER BY id"
                ),
                {"prefix": f"batch:{run_id}:%"},
            ).all()
    finally:
        engine.dispose()
    return [(str(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]


def degree_charge_count(url: str) -> int:
    """How many accounts have paid the graph version's degree release (live charges)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            count = conn.execute(
                text(
                    "SELECT count(*) FROM charges WHERE mechanism = 'degree_release' "
                    "AND state <> 'refunded'"
                )
            ).scalar()
    finally:
        engine.dispose()
    return int(count or 0)


def assert_exactly_once(url: str, run_id: str, nodes: list[str]) -> list[tuple[str, str, int, str]]:
    """Every node has exactly one live charge for the run, and it is released; nothing of the
    run is left admitted; the ledger verifies."""
    charges = run_charges(url, run_id)
    live = Counter(seed for seed, state, _, _ in charges if state != "refunded")
    assert set(live) == set(nodes), "every user answered, no one else"
    twice = {seed for seed, count in live.items() if count > 1}
    assert not twice, (
        "exactly one live charge per user for the run; more for: "
        f"{[c for c in charges if c[0] in twice]}"
    )
    assert all(state in ("released", "refunded") for _, state, _, _ in charges)
    ledger = Ledger.from_url(url)
    try:
        report = ledger.reports.verify()
    finally:
        ledger.dispose()
    assert report.ok, report.mismatches
    assert report.admitted_without_release.get("count", 0) == 0
    return charges


def answered_or_replayed(summary: BatchSummary) -> int:
    return summary.answered + summary.replayed
