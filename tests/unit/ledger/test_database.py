"""The ledger's revision checks without Alembic (service/ledger/database.py): the heads read from
the migration files and the revisions read from the version table agree with Alembic's own
``ScriptDirectory`` and ``MigrationContext`` on both backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from service.ledger.database import (
    alembic_config,
    check_migrated,
    current_revisions,
    head_revisions,
    make_engine,
    script_assignments,
    upgrade,
)
from service.ledger.records import LedgerNotMigrated


def test_the_heads_read_from_the_files_are_alembics() -> None:
    heads = set(ScriptDirectory.from_config(alembic_config()).get_heads())
    assert head_revisions() == heads
    assert len(heads) == 1  # one line of migrations


def test_a_files_assignments_are_read_as_literals(tmp_path: Path) -> None:
    script = tmp_path / "0002_merge.py"
    script.write_text(
        'revision: str = "0002_merge"\n'
        'down_revision = ("0001_a", "0001_b")\n'
        "branch_labels = None\n"
        "def upgrade() -> None:\n"
        '    revision = "not this one"\n'
    )
    found = script_assignments(script, ("revision", "down_revision", "branch_labels"))
    assert found == {
        "revision": "0002_merge",
        "down_revision": ("0001_a", "0001_b"),
        "branch_labels": None,
    }


def test_the_version_table_is_read_as_alembic_reads_it(ledger_url: str) -> None:
    engine = make_engine(ledger_url)
    try:
        with engine.connect() as conn:  # an empty database: no version table yet
            assert current_revisions(conn) == set()
            assert current_revisions(conn) == set(
                MigrationContext.configure(conn).get_current_heads()
            )
        with pytest.raises(LedgerNotMigrated, match="not migrated"):
            check_migrated(engine)
        upgrade(ledger_url)
        with engine.connect() as conn:
            assert current_revisions(conn) == head_revisions()
            assert current_revisions(conn) == set(
                MigrationContext.configure(conn).get_current_heads()
            )
        check_migrated(engine)
    finally:
        engine.dispose()


def test_opening_a_migrated_ledger_does_not_import_alembic(sqlite_url: str) -> None:
    """A command or server start on a migrated ledger checks its revision without Alembic."""
    upgrade(sqlite_url)
    code = (
        "import sys\n"
        "from service.ledger import Ledger\n"
        f"Ledger.from_url({sqlite_url!r}).dispose()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
