"""``batch`` on the local engine (a process pool): every seed answered exactly once per run, on
the API's own admission, charge and stored-release path, across worker deaths and reruns; the
sinks; the principal's scopes and quota; bad input as one-line errors with exit status 2."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from sqlalchemy import create_engine, text

from service.batch import FailureInjection, run_batch, seed_idempotency_key
from service.cli import main
from service.graph.loader import load_edge_list
from service.ledger import Ledger
from service.privacy.modes import Mode
from service.serving.planner import DiffusionPlanner
from tests.batch_support import (
    LOCAL_POOL_GROUP,
    STEPS,
    answered_or_replayed,
    assert_exactly_once,
    degree_charge_count,
    facebook_graph,
    migrated,
    options,
    run_charges,
    seeds_file,
)
from tests.ledger_support import admit_and_charge, count_charges
from tests.test_cache import REDIS_URL

pytestmark = LOCAL_POOL_GROUP

#: Eight blocks of 40: block 3's worker is killed with at most blocks 0-6 submitted (two workers
#: keep four blocks in flight), so the run has blocks answered before the kill, the blocks in
#: flight that fail with the pool, and at least one block answered by a fresh pool after it.
SEEDS = 320


@pytest.mark.slow
@pytest.mark.postgres
def test_a_worker_killed_mid_run_then_a_rerun_charges_every_user_exactly_once(
    postgres_url: str, tmp_path: Path
) -> None:
    url = migrated(postgres_url)
    graph = facebook_graph()
    seeds = seeds_file(tmp_path, SEEDS)
    nodes = [str(i) for i in range(SEEDS)]
    out = tmp_path / "recs.parquet"
    # Block 3's worker process dies after storing 5 releases, on the 6th seed: charge admitted,
    # noise drawn, release not stored. The pool breaks; with no retries every block in flight
    # fails, and the run refunds what they left admitted.
    kill = FailureInjection(block=3, after=5, kill=True, marker=str(tmp_path / "fired"))
    # blended: each seed's first answer also pays the graph version's degree release
    first = run_batch(
        options(url, graph, seeds, out, run_id="nightly", failure=kill, mechanism="blended")
    )
    assert first.failed >= 40 and first.failures == {"block_failed": first.failed}
    assert first.answered + first.failed == SEEDS
    assert first.reconciled >= 1  # at least the killed seed's admitted charge
    charges = run_charges(url, "nightly")
    assert not [c for c in charges if c[1] == "admitted"], "nothing of the run left admitted"
    refunded = [c for c in charges if c[1] == "refunded"]
    assert len(refunded) == first.reconciled
    stored_in_failed_blocks = sum(1 for c in charges if c[1] == "released") - first.answered
    assert stored_in_failed_blocks >= 5
    paid_release = degree_charge_count(url)  # every seed admitted so far

    second = run_batch(options(url, graph, seeds, out, run_id="nightly", mechanism="blended"))
    assert second.failed == 0 and answered_or_replayed(second) == SEEDS
    assert second.replayed == first.answered + stored_in_failed_blocks  # free, not recharged
    assert second.answered == first.failed - stored_in_failed_blocks
    # each newly answered seed pays its query, and the degree release unless it paid it with a
    # charge of the first run (the killed seed's stays paid: it is never refunded)
    assert degree_charge_count(url) == SEEDS
    assert second.epsilon_charged == pytest.approx(
        0.1 * second.answered + 0.1 * (SEEDS - paid_release), rel=1e-4
    )
    assert_exactly_once(url, "nightly", nodes)

    table = pq.read_table(out)
    assert sorted(table.column("user").to_pylist()) == sorted(nodes)
    assert all(len(recs) == 10 for recs in table.column("recommendations").to_pylist())
    assert set(table.column("run_id").to_pylist()) == {"nightly"}


@pytest.mark.slow
def test_a_retried_block_replays_its_stored_seeds_and_refunds_the_dead_charge(
    sqlite_url: str, tmp_path: Path
) -> None:
    url = migrated(sqlite_url)
    graph = facebook_graph()
    count = 80
    seeds = seeds_file(tmp_path, count)
    kill = FailureInjection(block=1, after=4, kill=True, marker=str(tmp_path / "fired"))
    summary = run_batch(
        options(
            url,
            graph,
            seeds,
            tmp_path / "r.parquet",
            run_id="retry",
            failure=kill,
            retries=2,
            block_size=20,
            mechanism="blended",
        )
    )
    assert summary.failed == 0 and summary.reconciled >= 1
    # Seeds a lost attempt had stored are replayed by the retry, not charged again; the
    # summary still counts them as charged by this run.
    assert (summary.answered, summary.replayed) == (count, 0)
    # every seed paid the degree release exactly once; the summary counts it for the seeds
    # answered fresh by the attempt that returned (a lost attempt's are not in its answers)
    assert degree_charge_count(url) == count
    assert 0.1 * count < summary.epsilon_charged <= 0.1 * count + 0.1 * count + 1e-9
    charges = assert_exactly_once(url, "retry", [str(i) for i in range(count)])
    assert sum(1 for c in charges if c[1] == "refunded") == summary.reconciled


def test_a_charge_left_admitted_by_a_killed_run_is_refunded_by_the_rerun(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The whole run died (no driver left to clean up): the rerun takes the seed over."""
    url = migrated(sqlite_url)
    graph_path = facebook_graph()
    graph = load_edge_list(graph_path)
    ledger = Ledger.from_url(url)
    node = "7"
    account = ledger.accounts.create_account("user", node_id=node, cap_epsilon=1.0, delta=1e-6)
    plan = DiffusionPlanner().plan(0.1, 1e-6, STEPS, 0.8, 1e-7, Mode.PERSONALIZED)
    version = ledger.graph_versions.public_graph_version(
        graph.fingerprint
    )  # the id the run will serve under
    key = seed_idempotency_key("crashed", version, node, Mode.PERSONALIZED, 0.1)
    dead = admit_and_charge(
        ledger,
        charged_account_id=account.account_id, principal_account_id=account.account_id,
        seed=node, mechanism="noisy_diffusion", mode="personalized", params={},
        query_curve=plan.curve, query_epsilon=0.1, graph_version=version,
        request_id=f"batch:crashed:{node}", idempotency_key=key,
    )  # fmt: skip
    ledger.dispose()
    seeds = tmp_path / "one.txt"
    seeds.write_text(f"{node}\n8\n")
    summary = run_batch(
        options(url, graph_path, seeds, tmp_path / "o.parquet", run_id="crashed", workers=1)
    )
    assert (summary.answered, summary.reconciled, summary.failed) == (2, 1, 0)
    charges = assert_exactly_once(url, "crashed", [node, "8"])
    assert [c for c in charges if c[1] == "refunded"] == [
        (node, "refunded", account.account_id, key)
    ]
    ledger = Ledger.from_url(url)
    assert ledger.settlement.charge_state(dead.charge_id) == "refunded"
    audit = [row for row in ledger.reports.list_audit(50) if row["action"] == "charge.refund"]
    assert "earlier attempt" in audit[0]["details"]["reason"]
    ledger.dispose()


def test_users_without_budget_or_account_are_skipped_and_counted(
    sqlite_url: str, tmp_path: Path
) -> None:
    url = migrated(sqlite_url)
    graph = facebook_graph()
    ledger = Ledger.from_url(url)
    ledger.accounts.create_account("user", node_id="1", cap_epsilon=1.0, delta=1e-6)
    ledger.accounts.create_account(
        "user", node_id="2", cap_epsilon=0.05, delta=1e-6
    )  # below one query
    ledger.dispose()
    seeds = tmp_path / "s.txt"
    seeds.write_text("1\n2\n3\n")
    summary = run_batch(
        options(url, graph, seeds, tmp_path / "s.parquet", run_id="budget", create=False, workers=1)
    )
    assert (summary.answered, summary.skipped_budget, summary.skipped_no_account) == (1, 1, 1)
    assert summary.failed == 0
    assert summary.skipped == {"budget_exhausted": 1, "unknown_account": 1}
    assert [c[0] for c in run_charges(url, "budget")] == ["1"]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_service_account_is_the_principal_within_its_modes_and_quota(
    postgres_url: str, tmp_path: Path
) -> None:
    url = migrated(postgres_url)
    graph = facebook_graph()
    ledger = Ledger.from_url(url)
    backend = ledger.accounts.create_account(
        "service", cap_epsilon=10.0, delta=1e-6, modes=("edge", "personalized"),
        may_create_seed_accounts=True, quota_epsilon=0.65,
    )  # fmt: skip
    ledger.dispose()
    seeds = seeds_file(tmp_path, 5)
    # Personalized: each seed user's account is charged, within the backend's 24-hour quota
    # (0.2 per seed: a blended answer at 0.1 and the seed's degree release at 0.1).
    summary = run_batch(
        options(url, graph, seeds, f"{url}?table=recs", run_id="svc",
                service_account_id=backend.account_id, block_size=2, mechanism="blended")
    )  # fmt: skip
    assert (summary.answered, summary.skipped_budget) == (3, 2)
    assert summary.skipped == {"service_quota_exhausted": 2}
    charges = run_charges(url, "svc")
    assert {c[2] for c in charges} == {backend.account_id}  # the backend asked for each
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT user_node, k, results FROM recs ORDER BY user_node"))
        stored = {r[0]: (r[1], r[2]) for r in rows}
    engine.dispose()
    # Which three fit in the quota depends on which worker admits first.
    assert sorted(stored) == sorted(c[0] for c in charges if c[1] == "released")
    assert len(stored) == 3
    assert all(k == 10 and len(results) == 10 for k, results in stored.values())

    # Edge mode: the backend itself is charged.
    summary = run_batch(
        options(url, graph, seeds, tmp_path / "edge.parquet", run_id="svc-edge",
                mode=Mode.EDGE, service_account_id=backend.account_id, create=False,
                workers=1)
    )  # fmt: skip
    assert (summary.answered, summary.failed) == (5, 0)
    ledger = Ledger.from_url(url)
    assert ledger.budgets.budget(backend.account_id).charges == 5
    ledger.dispose()


@pytest.mark.slow
@pytest.mark.redis
def test_the_redis_sink_holds_a_hash_per_user(sqlite_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {REDIS_URL} does not answer: {exc}")
    prefix = f"test:recs:{uuid.uuid4().hex}:"  # unique: other runs share the server
    url = migrated(sqlite_url)
    seeds = seeds_file(tmp_path, 3)
    summary = run_batch(
        options(url, facebook_graph(), seeds, f"{REDIS_URL}?prefix={prefix}&ttl=600",
                run_id="redis", workers=1)
    )  # fmt: skip
    assert summary.answered == 3
    try:
        for node in ("0", "1", "2"):
            fields = client.hgetall(f"{prefix}{node}")
            assert fields[b"run_id"] == b"redis" and fields[b"mode"] == b"personalized"
            assert len(json.loads(fields[b"results"])) == 10
            assert 0 < client.ttl(f"{prefix}{node}") <= 600
    finally:
        client.delete(*[f"{prefix}{n}" for n in ("0", "1", "2")])
        client.close()


# -- the command line ---------------------------------------------------------------------------


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.fixture
def cli_ledger(sqlite_url: str) -> str:
    url = migrated(sqlite_url)
    ledger = Ledger.from_url(url)
    ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
    ledger.dispose()
    return url


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--accounts", "{tmp}/missing.txt"], "error [invalid_parameter]: --accounts: no such"),
        (["--accounts", "{tmp}/bad.txt"], "error [unknown_node]: node 'no-such-node' is not"),
        (["--service-account", "99"], "error [unknown_account]: --service-account: account 99"),
        (
            ["--service-account", "1"],
            "--service-account: account 1 is of type 'admin', not a service",
        ),
        (["--mode", "edge"], "--service-account: edge mode charges a service account"),
        (["--out", "ftp://x/y"], "error [invalid_parameter]: --out: unsupported sink 'ftp://'"),
        (["--out", "recs.csv"], "error [invalid_parameter]: --out: not a sink: 'recs.csv'"),
        (["--out", "{tmp}/nodir/r.parquet"], "error [sink_unavailable]: --out: the directory"),
        (["--out", "redis://127.0.0.1:1/0"], "error [sink_unavailable]: --out: cannot reach"),
        (["--run-id", "a b"], "error [invalid_parameter]: --run-id: must be 1-64"),
        (["--epsilon", "5"], "error [invalid_parameter]: epsilon: must be in [0.01, 2.0]"),
        (["--graph", "{tmp}/nograph.txt"], "error [invalid_parameter]: --graph: "),
        (["--address", "auto"], "--address: joins a Ray cluster: use it with --engine ray"),
        (["--refresh", "weekly"], "error [invalid_parameter]: --refresh: must be on_new_version"),
        (["--refresh", "max_age:1d", "--output", "embeddings"], "--refresh: max_age applies"),
        (["--accounts", "{tmp}/empty.txt"], "error [invalid_parameter]: --accounts: '"),
        (
            ["--mode", "edge", "--mechanism", "blended"],
            "error [invalid_parameter]: --mechanism: blended is offered in personalized mode only",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str],
    expected: str,
    cli_ledger: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "good.txt").write_text("1\n2\n")
    (tmp_path / "bad.txt").write_text("1\nno-such-node\n")
    (tmp_path / "empty.txt").write_text("# no one yet\n\n")
    base = {"--accounts": "{tmp}/good.txt", "--out": "{tmp}/r.parquet"}
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    merged = {**base, **flags}
    full = ["batch", "--database-url", cli_ledger, "--no-progress"]
    for flag, value in merged.items():
        full += [flag, value.replace("{tmp}", str(tmp_path))]
    line = _fails(full, capsys)
    assert line.startswith("error ") and expected in line
    ledger = Ledger.from_url(cli_ledger)
    assert count_charges(ledger) == 0  # nothing charged
    ledger.dispose()


def test_the_command_prints_a_summary(
    cli_ledger: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seeds = tmp_path / "s.txt"
    seeds.write_text("10\n11\n")
    argv = ["batch", "--accounts", str(seeds), "--out", str(tmp_path / "r.parquet"),
            "--database-url", cli_ledger, "--create-missing-accounts", "--run-id", "cli",
            "--k", "5", "--epsilon", "0.2", "--workers", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["answered"], summary["failed"], summary["run_id"]) == (2, 0, "cli")
    # the default ranking (friends_of_friends) at 0.2 per seed, and no degree release
    assert summary["epsilon_charged"] == pytest.approx(0.4, rel=1e-4)
    assert summary["seeds_per_second"] > 0
    ledger = Ledger.from_url(cli_ledger)
    actions = [row["action"] for row in ledger.reports.list_audit(20)]
    ledger.dispose()
    assert actions[0] == "batch.finish" and "batch.start" in actions
    assert actions.count("account.create") == 3  # the admin and the two users


@pytest.mark.parametrize(
    ("flag", "expected"),
    [([], "friends_of_friends"), (["noisy_diffusion"], None), (["blended"], None)],
)
def test_batch_charges_the_mechanism_it_names(
    flag: list[str],
    expected: str | None,
    cli_ledger: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --mechanism a run gets what a GET without one gets (the served default:
    friends_of_friends); with it, what it names. The summary names it, and so does every charge."""
    mechanism = expected or flag[0]
    seeds = tmp_path / "s.txt"
    seeds.write_text("10\n11\n")
    argv = ["batch", "--accounts", str(seeds), "--out", str(tmp_path / "r.parquet"),
            "--database-url", cli_ledger, "--create-missing-accounts", "--run-id", "m",
            "--k", "5", "--workers", "1", "--no-progress"]  # fmt: skip
    if flag:
        argv += ["--mechanism", *flag]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f"(local engine, {mechanism} in personalized mode, epsilon" in first
    engine = create_engine(cli_ledger)
    try:
        with engine.connect() as conn:
            used = conn.execute(text("SELECT DISTINCT mechanism FROM charges")).scalars().all()
    finally:
        engine.dispose()
    # a blended answer's first charge on a graph version also pays for the degree release
    degree = ["degree_release"] if mechanism in ("blended", "popular") else []
    assert sorted(used) == sorted([mechanism, *degree])


def test_a_nightly_run_under_max_age_charges_only_the_answers_that_are_due(
    cli_ledger: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each night a new run id asks for every user; replays are free, and ``--refresh max_age``
    draws anew only where the stored answer is old enough (here: seed 10's, not seed 11's)."""

    def run(run_id: str, *seeds: str, refresh: str | None = None) -> dict[str, object]:
        listed = tmp_path / f"{run_id}.txt"
        listed.write_text("".join(f"{seed}\n" for seed in seeds))
        argv = ["batch", "--accounts", str(listed), "--out", str(tmp_path / f"{run_id}.parquet"),
                "--database-url", cli_ledger, "--create-missing-accounts", "--run-id", run_id,
                "--k", "5", "--workers", "1", "--no-progress", "--json",
                "--mechanism", "friends_of_friends"]  # fmt: skip
        if refresh is not None:
            argv += ["--refresh", refresh]
        assert main(argv) == 0
        summary: dict[str, object] = json.loads(capsys.readouterr().out)
        return summary

    def charges() -> int:
        engine = create_engine(cli_ledger)
        try:
            with engine.connect() as conn:
                return int(conn.execute(text("SELECT COUNT(*) FROM charges")).scalar_one())
        finally:
            engine.dispose()

    run("night-1", "10", "11")
    assert charges() == 2
    engine = create_engine(cli_ledger)  # seed 10's answer was made eight days ago
    try:
        with engine.begin() as conn:
            old = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=8)
            conn.execute(
                text("UPDATE releases SET created_at = :old WHERE node = '10'"),
                {"old": old.strftime("%Y-%m-%d %H:%M:%S.%f")},
            )
    finally:
        engine.dispose()
    again = run("night-2", "10", "11")  # the default policy: both replayed
    assert charges() == 2 and again["replayed"] == 2
    due = run("night-3", "10", "11", refresh="max_age:7d")  # 10's answer is due, 11's is young
    assert due["refresh"] == "max_age:1w"
    assert charges() == 3 and due["answered"] == 1 and due["replayed"] == 1
