"""``batch --output embeddings``: every seed gets a DP-IE embedding on the embedding endpoint's
own charged path (one charge per seed and run, replayed free by a rerun), written as a Parquet
column of fixed-size lists, a Redis hash field and a PostgreSQL ``float8[]`` column that hold the
same vectors as the ledger's stored releases; a refused seed is charged nothing; bad input is
one line, exit status 2, nothing charged. Runs on the local engine (a process pool), on
PostgreSQL and Redis."""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from sqlalchemy import create_engine, text

from service.batch import BatchOptions, run_batch
from service.cli import main
from service.embeddings.release import stored_values
from service.ledger import Ledger
from service.privacy.modes import Mode
from tests.batch_support import (
    LOCAL_POOL_GROUP,
    assert_exactly_once,
    facebook_graph,
    migrated,
    options,
    run_charges,
    seeds_file,
)
from tests.ledger_support import count_charges
from tests.test_cache import REDIS_URL

pytestmark = LOCAL_POOL_GROUP

K = 16
SEEDS = 6


def embedding_options(url: str, seeds: Path, out: Path | str, **fields: Any) -> BatchOptions:
    base = options(url, facebook_graph(), seeds, out, run_id="emb", block_size=3, workers=1)
    return replace(base, **{"output": "embeddings", "k": K, "epsilon": 0.5, **fields})


def released_vectors(url: str, run_id: str) -> dict[str, list[float]]:
    """Each seed's embedding as the ledger stored it (the release the run charged)."""
    ledger = Ledger.from_url(url)
    try:
        out: dict[str, list[float]] = {}
        for seed, state, principal, key in run_charges(url, run_id):
            assert state == "released", (seed, state)
            charge = next(
                c
                for c in ledger.reports.list_charges(None, limit=1000)
                if c.idempotency_key == key and c.principal_account_id == principal
            )
            stored = ledger.stored_releases.release_for_charge(charge.charge_id)
            assert stored is not None and charge.mechanism == "dp_instant_embedding"
            out[seed] = stored_values(stored.results)
        return out
    finally:
        ledger.dispose()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_embeddings_are_charged_once_and_every_sink_holds_the_released_vectors(
    postgres_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {REDIS_URL} does not answer: {exc}")
    url = migrated(postgres_url)
    seeds = seeds_file(tmp_path, SEEDS)
    nodes = [str(i) for i in range(SEEDS)]
    out = tmp_path / "emb.parquet"
    progress = io.StringIO()
    first = run_batch(replace(embedding_options(url, seeds, out), progress=True), stream=progress)
    assert (first.answered, first.replayed, first.failed) == (SEEDS, 0, 0)
    assert first.mechanism == "dp_instant_embedding" and first.output == "embeddings"
    assert first.epsilon_charged == pytest.approx(0.5 * SEEDS, rel=1e-4)
    assert f"{SEEDS}/{SEEDS}" in progress.getvalue()  # the progress bar, as for rankings
    assert_exactly_once(url, "emb", nodes)
    released = released_vectors(url, "emb")

    table = pq.read_table(out)
    assert table.schema.field("embedding").type == pa.list_(pa.float64(), K)
    assert pa.types.is_fixed_size_list(table.schema.field("embedding").type)
    assert str(table.schema.field("embedding").type).startswith("fixed_size_list<")
    rows = {row["user"]: row for row in table.to_pylist()}
    assert sorted(rows) == sorted(nodes)
    for node, row in rows.items():
        assert row["embedding"] == released[node]  # round-trips exactly
        assert (row["run_id"], row["mode"], row["epsilon"], row["k"]) == (
            "emb",
            "personalized",
            0.5,
            K,
        )
        assert row["mechanism"] == "dp_instant_embedding" and row["sigma"] == 1e-3
        assert len(row["hash_salt"]) == 32 and row["score_grid"] > 0
        assert row["graph_version"] == first.graph_version
        assert all(x / row["score_grid"] == round(x / row["score_grid"]) for x in row["embedding"])

    # The same run id into Redis and PostgreSQL: every seed's stored release is replayed, free.
    prefix = f"test:emb:{uuid.uuid4().hex}:"  # unique: other runs share the server
    to_redis = run_batch(embedding_options(url, seeds, f"{REDIS_URL}?prefix={prefix}"))
    to_table = run_batch(embedding_options(url, seeds, f"{url}?table=emb_vectors"))
    for summary in (to_redis, to_table):
        assert (summary.answered, summary.replayed, summary.epsilon_charged) == (0, SEEDS, 0.0)
    assert_exactly_once(url, "emb", nodes)
    try:
        for node in nodes:
            fields = client.hgetall(f"{prefix}{node}")
            assert json.loads(fields[b"embedding"]) == released[node]
            assert fields[b"hash_salt"].decode() == rows[node]["hash_salt"]
            assert float(fields[b"score_grid"]) == rows[node]["score_grid"]
            assert fields[b"graph_version"].decode() == first.graph_version
            assert (fields[b"k"], fields[b"sigma"], fields[b"epsilon"]) == (
                str(K).encode(),
                b"0.001",
                b"0.5",
            )
    finally:
        client.delete(*[f"{prefix}{n}" for n in nodes])
        client.close()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            kind = conn.execute(
                text(
                    "SELECT data_type FROM information_schema.columns "
                    "WHERE table_name = 'emb_vectors' AND column_name = 'embedding'"
                )
            ).scalar()
            stored = conn.execute(
                text("SELECT user_node, embedding, hash_salt, score_grid, k FROM emb_vectors")
            ).all()
    finally:
        engine.dispose()
    assert kind == "ARRAY"
    assert {r[0]: list(r[1]) for r in stored} == released
    assert {(r[2], r[3], r[4]) for r in stored} == {
        (rows["0"]["hash_salt"], rows["0"]["score_grid"], K)
    }


@pytest.mark.slow
@pytest.mark.postgres
def test_a_refused_seed_is_charged_nothing(postgres_url: str, tmp_path: Path) -> None:
    url = migrated(postgres_url)
    ledger = Ledger.from_url(url)
    ledger.accounts.create_account("user", node_id="1", cap_epsilon=1.0, delta=1e-6)
    ledger.accounts.create_account(
        "user", node_id="2", cap_epsilon=0.2, delta=1e-6
    )  # below one query
    ledger.dispose()
    seeds = tmp_path / "s.txt"
    seeds.write_text("1\n2\n3\n")
    summary = run_batch(
        embedding_options(url, seeds, tmp_path / "r.parquet", create_missing_accounts=False)
    )
    assert (summary.answered, summary.skipped_budget, summary.skipped_no_account) == (1, 1, 1)
    assert summary.skipped == {"budget_exhausted": 1, "unknown_account": 1}
    assert [c[0] for c in run_charges(url, "emb")] == ["1"]
    assert pq.read_table(tmp_path / "r.parquet").column("user").to_pylist() == ["1"]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.postgres
def test_bad_input_is_one_line_and_nothing_charged(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = migrated(postgres_url)
    ledger = Ledger.from_url(url)
    personalized_only = ledger.accounts.create_account(
        "service", cap_epsilon=5.0, delta=1e-6, modes=("personalized",)
    )
    ledger.dispose()
    good = tmp_path / "good.txt"
    good.write_text("1\n2\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("1\nno-such-node\n")
    base = ["batch", "--database-url", url, "--no-progress", "--out", str(tmp_path / "r.parquet")]
    cases = [
        (["--output", "embeddings", "--k", "5000"], "error [invalid_parameter]: k: must be"),
        (["--output", "embeddings", "--sigma", "5"], "error [invalid_parameter]: sigma: must"),
        (["--output", "embeddings", "--epsilon", "5"], "error [invalid_parameter]: epsilon:"),
        (["--sigma", "0.01"], "error [invalid_parameter]: --sigma: applies to --output"),
        (["--output", "embeddings", "--mechanism", "blended"], "--mechanism: names a ranking"),
        (["--output", "embeddings", "--exclude-neighbors"], "--exclude-neighbors: applies to"),
        (
            [
                "--output",
                "embeddings",
                "--mode",
                "edge",
                "--service-account",
                str(personalized_only.account_id),
            ],
            "error [mode_not_allowed]: service account",
        ),
        (["--output", "vectors"], None),  # argparse: exit 2 with its usage
    ]
    for flags, expected in cases:
        argv = [*base, "--accounts", str(good), *flags]
        if expected is None:
            with pytest.raises(SystemExit) as stopped:
                main(argv)
            assert stopped.value.code == 2
            capsys.readouterr()
            continue
        line = _fails(argv, capsys)
        assert expected in line, line
    line = _fails([*base, "--accounts", str(bad), "--output", "embeddings"], capsys)
    assert line.startswith("error [unknown_node]: node 'no-such-node'")
    ledger = Ledger.from_url(url)
    assert count_charges(ledger) == 0
    ledger.dispose()
    assert not (tmp_path / "r.parquet").exists()


@pytest.mark.slow
def test_edge_mode_runs_charge_the_service_account(sqlite_url: str, tmp_path: Path) -> None:
    url = migrated(sqlite_url)
    ledger = Ledger.from_url(url)
    backend = ledger.accounts.create_account(
        "service", cap_epsilon=5.0, delta=1e-6, modes=("edge",)
    )
    ledger.dispose()
    seeds = seeds_file(tmp_path, 3)
    summary = run_batch(
        embedding_options(
            url, seeds, f"{url}?table=vectors", mode=Mode.EDGE,
            service_account_id=backend.account_id, create_missing_accounts=False,
        )
    )  # fmt: skip
    assert (summary.answered, summary.failed) == (3, 0)
    charges = run_charges(url, "emb")
    assert {(c[2]) for c in charges} == {backend.account_id}
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT user_node, embedding, mode FROM vectors")).all()
    finally:
        engine.dispose()
    released = released_vectors(url, "emb")
    # SQLite has no arrays: the vector is a JSON array there
    assert {r[0]: json.loads(r[1]) for r in rows} == released
    assert {r[2] for r in rows} == {"edge"}
