"""Migrations carry existing ledgers forward (issue 19, "Done when"): a ledger holding every
kind of row the service writes (accounts, keyed count charges with their stored releases, a
refund, a blended answer's degree-release charge, the graph-wide degree release, a service
account's reads, an embedding salt, a synthesis run, public graph ids) is taken back to each
earlier revision from 0003 (the schema of the ledgers written before issue 19) to 0009 and
brought forward again with ``upgrade``: every revision's upgrade then runs on data, the ledger
verifies clean, and what a revision's downgrade did not drop is as it was (each account's
spend, the public graph id, the idempotency-key binding, the synthesis run, the salt).

On SQLite and on PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from alembic import command
from sqlalchemy import create_engine, text

from service.graph.build import build_graph
from service.ledger import DegreeCharge, Ledger, upgrade
from service.ledger.database import alembic_config
from service.ledger.records import Admission, ReleaseKey, StoredRelease, SyntheticCharge
from service.mechanisms.postprocess import RankedNode
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.sampler import FLOAT_COUNT_RELEASE_TV
from service.serving.rankings import degree_release_name
from service.synthetic.release import Request, synthesize_release
from tests.ledger_support import admit_and_charge, graph_fingerprint_of

DELTA = 1e-6
VERSIONS = Path(__file__).resolve().parents[1] / "migrations" / "versions"
#: every revision a ledger in use may be at, oldest first: 0003 is the schema of the ledgers
#: written before issue 19's changes (the public graph id arrived with 0004)
OLD_REVISIONS = [
    "0003_admin_dashboard",
    "0004_graph_identity",
    "0005_degree_and_read_charges",
    "0006_idempotency_binding",
    "0007_synthesis_jobs",
    "0008_popular_key_bindings",
    "0009_embedding_salts",
    "0010_sampler_share",
    "0011_synthetic_release_charges",
    "0012_charge_heartbeat",
    "0013_budget_periods",
    "0014_quota_buckets",
    "0015_release_results_lz4",
]


def float_era(epsilon: float) -> RdpCurve:
    """A count release's curve as the float sampler's code charged it (with its share): what
    a ledger at any of OLD_REVISIONS holds. Count releases drawn now carry no share, and 0010
    cannot tell them apart, so a roundtrip below it adds the share to them (docs/privacy.md,
    section 5: conservative); the roundtrip is exact for the rows it was written for."""
    return laplace_curve(epsilon).with_sampler_tv(FLOAT_COUNT_RELEASE_TV)


@dataclass(frozen=True)
class Written:
    user: int
    other: int
    service: int
    version: str
    fingerprint: str
    salt: bytes
    synthetic_sha256: str
    synthetic_release: str
    stored: StoredRelease
    spent: dict[int, float]


def _write(url: str, tmp_path: Path) -> Written:
    """Every kind of row, through the ledger's own methods, at head."""
    graph = build_graph([0, 0, 1, 2, 3], [1, 2, 2, 3, 4])
    ledger = Ledger.from_url(url)
    try:
        version = ledger.graph_versions.public_graph_version(graph.fingerprint)
        ledger.graph_versions.set_current_graph_version(version, path="graph.txt")
        user = ledger.accounts.create_account(
            "user", node_id="1", cap_epsilon=5.0, delta=DELTA
        ).account_id
        other = ledger.accounts.create_account(
            "user", node_id="2", cap_epsilon=5.0, delta=DELTA
        ).account_id
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=DELTA, modes=("edge", "personalized"), label="b"
        ).account_id
        curve = float_era(0.1)  # what the service charged a count release then
        charges = []
        for i, key in enumerate(["released", "refunded"]):
            charges.append(
                admit_and_charge(
                    ledger,
                    charged_account_id=user, principal_account_id=user, seed="1",
                    mechanism="common_neighbours", mode="personalized", params={},
                    query_curve=curve, query_epsilon=0.1, graph_version=version,
                    request_id=f"r{i}", idempotency_key=key,
                ).charge_id
            )  # fmt: skip
        release_key = ReleaseKey(user, "1", version, "personalized", 0.1, "common_neighbours")
        stored = StoredRelease(release_key, charges[0], [RankedNode("2", 0.5)], {}, "r0")
        ledger.settlement.store_release(
            stored, idempotency_key="released", principal_account_id=user
        )
        ledger.settlement.refund(charges[1], reason="test: nothing drawn")
        d_curve = float_era(0.05)
        blended = ledger.admission.admit_and_charge(
            Admission(
                charged_account_id=other, principal_account_id=service, seed="2",
                mechanism="blended", mode="personalized", params={"name": "blended"},
                query_curve=curve, query_epsilon=0.1, graph_version=version,
                request_id="b0", degree=DegreeCharge(version, 0.05, d_curve),
            )
        )  # fmt: skip
        name = degree_release_name(40.0)
        ledger.graph_releases.graph_release(
            version, name, epsilon=0.05, curve=d_curve, draw=lambda: b"deg"
        )
        ledger.read_figures.record_reads(
            service, charge_ids=[blended.charge_id], graph_release=(version, name)
        )
        salt = ledger.embedding_salts.embedding_salt(version, lambda: bytes(range(16)))
        job = synthesize_release(
            ledger, graph, Request("communities", 1.0), tmp_path / "synthetic.txt", cap=None,
            rng_factory=np.random.default_rng,
        )  # fmt: skip
        recorded = ledger.synthesis.synthetic_release_by_sha256(job.sha256)
        assert recorded is not None
        # a sandbox answer's charge for that release
        paid = ledger.quota_and_degree.admit_synthetic_release(
            charged_account_id=other, principal_account_id=other, seed="2", mode="edge",
            release=SyntheticCharge(recorded.graph_version, job.release_name), request_id="s0",
        )  # fmt: skip
        assert paid.charged
        report = ledger.reports.verify()
        assert report.ok, report.mismatches
        spent = {a: ledger.budgets.budget(a).spent_epsilon for a in (user, other, service)}
        assert spent[user] > 0 and spent[other] > 0
        assert ledger.read_figures.read_view(service).releases == 2
        return Written(user, other, service, version, graph.fingerprint, salt,
                       job.sha256, job.release_name, stored, spent)  # fmt: skip
    finally:
        ledger.dispose()


def test_the_list_names_every_revision_before_head() -> None:
    revisions = sorted(p.stem for p in VERSIONS.glob("0*.py"))
    assert revisions[-1] > OLD_REVISIONS[-1]  # head is newer than every listed one
    assert [r for r in revisions[:-1] if r >= "0003"] == OLD_REVISIONS, (
        "a migration was added: list the previous head in OLD_REVISIONS"
    )


@pytest.mark.parametrize("revision", OLD_REVISIONS)
def test_a_ledger_at_an_old_revision_verifies_after_upgrade(
    revision: str, ledger_url: str, tmp_path: Path
) -> None:
    upgrade(ledger_url)
    written = _write(ledger_url, tmp_path)
    command.downgrade(alembic_config(ledger_url), revision)
    engine = create_engine(ledger_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == revision
    engine.dispose()
    upgrade(ledger_url)
    ledger = Ledger.from_url(ledger_url)
    try:
        report = ledger.reports.verify()
        assert report.ok, report.mismatches
        for account, spent in written.spent.items():
            assert ledger.budgets.budget(account).spent_epsilon == pytest.approx(spent, rel=1e-12)
        if revision >= "0004":  # the fingerprint -> public id record survives
            assert (
                ledger.graph_versions.public_graph_version(written.fingerprint) == written.version
            )
        else:  # rebuilt by 0004: every id already shown keeps being its own public id
            assert graph_fingerprint_of(ledger, written.version) is not None
        # kept, or (below 0006) bound again by 0006's backfill of every live keyed charge
        assert (
            ledger.stored_releases.release_for_idempotency_key(written.user, "released")
            == written.stored
        )
        if revision >= "0005":
            assert ledger.read_figures.read_view(written.service).releases == 2
        job = ledger.synthesis.synthetic_release_by_sha256(
            written.synthetic_sha256
        )  # 0007 backfills
        assert job is not None and job.state == "done"
        assert job.release_name == written.synthetic_release
        if revision >= "0009":
            assert (
                ledger.embedding_salts.embedding_salt(written.version, lambda: b"\0" * 16)
                == written.salt
            )
    finally:
        ledger.dispose()


def _plain(value: object) -> object:
    """``value`` (reflected) in comparable form: SQL expressions as their text, in order."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    text_of = getattr(value, "text", None)
    return text_of if isinstance(text_of, str) else value


def _ledger_contents(url: str) -> tuple[dict[str, object], dict[str, list[tuple[object, ...]]]]:
    """The schema (every table's columns, keys, indexes and constraints, each kind in sorted
    order) and every row, with the ledger's id and the times the migrations wrote left out."""
    from sqlalchemy import DateTime, inspect

    engine = create_engine(url)
    try:
        inspector = inspect(engine)
        schema: dict[str, object] = {}
        rows: dict[str, list[tuple[object, ...]]] = {}
        with engine.connect() as conn:
            for table in sorted(inspector.get_table_names()):
                columns = inspector.get_columns(table)
                schema[table] = (
                    [(c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                     for c in columns],
                    _plain(inspector.get_pk_constraint(table)),
                    sorted(map(repr, map(_plain, inspector.get_foreign_keys(table)))),
                    sorted(map(repr, map(_plain, inspector.get_indexes(table)))),
                    sorted(map(repr, map(_plain, inspector.get_unique_constraints(table)))),
                    sorted(map(repr, map(_plain, inspector.get_check_constraints(table)))),
                )  # fmt: skip
                times = [isinstance(c["type"], DateTime) for c in columns]
                found = conn.execute(text(f'SELECT * FROM "{table}"')).all()
                rows[table] = sorted(
                    (
                        tuple("<time>" if t else v for v, t in zip(row, times, strict=True))
                        for row in found
                        if not (table == "ledger_meta" and row[0] == "ledger_id")
                    ),
                    key=repr,
                )
    finally:
        engine.dispose()
    return schema, rows


def _ledger_id(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT value FROM ledger_meta WHERE key = 'ledger_id'"))
            return str(found.scalar_one())
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_replayed_migration_matches_a_real_one(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite migrates most empty ledgers by replaying its first migration's statements
    (tests/migration_replay.py): a replayed ledger is the one Alembic makes, with an id of
    its own."""
    from contextlib import ExitStack

    from tests import migration_replay
    from tests.conftest import postgres_database

    with ExitStack() as stack:
        if kind == "sqlite":
            urls = [f"sqlite:///{tmp_path / f'{name}.db'}" for name in ("a", "b", "real")]
        else:
            urls = [stack.enter_context(postgres_database()) for _ in range(3)]
        first, replayed, real = urls
        upgrade(first)  # recorded, unless this process recorded one already
        upgrade(replayed)  # replayed: a recording exists now
        assert kind.replace("postgres", "postgresql") in migration_replay._recordings
        with monkeypatch.context() as patched:
            patched.setattr(command, "upgrade", migration_replay._real_upgrade)
            upgrade(real)
        assert _ledger_contents(replayed) == _ledger_contents(real)
        assert len({_ledger_id(url) for url in urls}) == 3
        for url in urls:  # each verifies and opens as a ledger at head
            ledger = Ledger.from_url(url)
            try:
                assert ledger.reports.verify().ok
            finally:
                ledger.dispose()


def _schemas_and_sequences(url: str) -> tuple[set[str], dict[str, tuple[int, bool]]]:
    """The database's own schemas, and where each sequence in ``public`` stands."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            schemas = set(
                conn.execute(
                    text("SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_' "
                         "AND nspname <> 'information_schema'")
                ).scalars()
            )  # fmt: skip
            names = conn.execute(
                text("SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'")
            ).scalars()
            positions = {}
            for name in list(names):
                last, called = conn.execute(
                    text(f'SELECT last_value, is_called FROM "{name}"')
                ).one()
                positions[str(name)] = (int(last), bool(called))
    finally:
        engine.dispose()
    return schemas, positions


@pytest.mark.postgres
def test_a_reused_ledger_matches_a_real_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PostgreSQL ledger a test wrote to is reset and kept out of sight when its database is
    recycled, and renamed into place when the next test migrates that database
    (tests/spare_ledgers.py): the next test sees an empty database, and once migrated the
    ledger Alembic makes (schema, rows, sequence positions), with an id of its own."""
    from tests import migration_replay
    from tests.conftest import postgres_database
    from tests.spare_ledgers import SPARE_SCHEMA

    with postgres_database() as used:
        upgrade(used)  # recorded or replayed: this process now knows a fresh ledger
        ledger = Ledger.from_url(used)
        try:  # rows and sequence positions the reset must undo
            for node in ("1", "2", "3"):
                account = ledger.accounts.create_account(
                    "user", node_id=node, cap_epsilon=1.0, delta=1e-6
                )
                ledger.api_keys.create_api_key(account.account_id)
        finally:
            ledger.dispose()
        used_id = _ledger_id(used)
    with postgres_database() as reused, postgres_database() as real:
        schemas, _ = _schemas_and_sequences(reused)  # the database just given back, renamed
        assert schemas == {"public", SPARE_SCHEMA}
        assert _ledger_contents(reused) == ({}, {})  # what a test sees: an empty database
        upgrade(reused)
        with monkeypatch.context() as patched:
            patched.setattr(command, "upgrade", migration_replay._real_upgrade)
            upgrade(real)
        assert _ledger_contents(reused) == _ledger_contents(real)
        schemas, positions = _schemas_and_sequences(reused)
        assert schemas == {"public"}  # the spare is the ledger now
        assert positions == _schemas_and_sequences(real)[1]
        assert len({used_id, _ledger_id(reused), _ledger_id(real)}) == 3
        ledger = Ledger.from_url(reused)
        try:
            assert ledger.reports.verify().ok
            account = ledger.accounts.create_account(
                "user", node_id="1", cap_epsilon=1.0, delta=1e-6
            )  # the first account again: its id is where a new ledger's first one is
        finally:
            ledger.dispose()
        ledger = Ledger.from_url(real)
        try:
            first = ledger.accounts.create_account("user", node_id="1", cap_epsilon=1.0, delta=1e-6)
        finally:
            ledger.dispose()
        assert account.account_id == first.account_id


#: The columns 0015 and 0016 compress with LZ4 on PostgreSQL: a release's results and every
#: stored RDP curve.
LZ4_COLUMNS = [
    ("releases", "results"),
    *((table, "rdp") for table in ("charges", "service_reads", "spend", "exposure_shards",
                                   "read_totals", "graph_releases")),
]  # fmt: skip


@pytest.mark.postgres
def test_results_and_curves_are_written_with_lz4(postgres_url: str, tmp_path: Path) -> None:
    """At head, the values written to the release results and RDP curve columns are compressed
    with LZ4, not pglz (which tried each 2 kB curve, then stored it uncompressed); a
    PostgreSQL built without LZ4 keeps pglz (skipped here)."""
    upgrade(postgres_url)
    _write(postgres_url, tmp_path)
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            methods = {
                (table, column): method
                for table, column, method in conn.execute(
                    text("SELECT c.relname, a.attname, a.attcompression FROM pg_attribute a "
                         "JOIN pg_class c ON c.oid = a.attrelid "
                         "WHERE c.relnamespace = 'public'::regnamespace")
                )
            }  # fmt: skip
            if methods[("releases", "results")] != "l":
                pytest.skip("this PostgreSQL has no LZ4: the columns keep pglz")
            assert {methods[c] for c in LZ4_COLUMNS} == {"l"}
            written = {
                (table, column): set(
                    conn.execute(
                        text(f"SELECT DISTINCT pg_column_compression({column}) FROM {table}")
                    ).scalars()
                )
                for table, column in LZ4_COLUMNS
            }
    finally:
        engine.dispose()
    # values under the 2 kB threshold are not compressed at all (NULL); none is pglz
    assert all(found <= {"lz4", None} for found in written.values()), written
    assert "lz4" in written[("charges", "rdp")] and "lz4" in written[("spend", "rdp")], written
