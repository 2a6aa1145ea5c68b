"""``python -m service db ...`` and ``python -m service accounts ...`` on real databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.config import Settings
from service.ledger import Ledger, upgrade

REPO = Path(__file__).resolve().parents[1]
#: The newest migration: its file is named after its revision id.
LEDGER_HEAD = sorted(p.stem for p in (REPO / "migrations" / "versions").glob("0*.py"))[-1]


@pytest.fixture(autouse=True)
def _demo_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands resolve nodes against the configured graph: make it the demo graph."""
    monkeypatch.delenv("PPR_GRAPH_PATH", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_db_commands(capsys: pytest.CaptureFixture[str], ledger_url: str) -> None:
    db = ("--database-url", ledger_url)
    code, _, err = run(capsys, "db", "check", *db)
    assert code == 2 and "error [ledger_not_migrated]" in err
    assert "python -m service db upgrade" in err and "Traceback" not in err
    assert run_json(capsys, "db", "current", *db)["current"] == []
    code, out, _ = run(capsys, "db", "upgrade", *db)
    assert code == 0 and f"{LEDGER_HEAD} (head)" in out
    assert run(capsys, "db", "upgrade", *db)[0] == 0  # idempotent
    status = run_json(capsys, "db", "check", *db)
    assert status["at_head"] and status["current"] == status["head"] == [LEDGER_HEAD]
    assert status["grid_version"] == "1"
    code, out, _ = run(capsys, "db", "current", *db)
    assert code == 0 and "at head" in out


def test_accounts_on_unmigrated_database(
    capsys: pytest.CaptureFixture[str], sqlite_url: str
) -> None:
    code, out, err = run(capsys, "accounts", "list", "--database-url", sqlite_url)
    assert code == 2 and out == ""
    assert err.startswith("error [ledger_not_migrated]: ")
    assert "`python -m service db upgrade`" in err and "PPR_AUTO_MIGRATE=true" in err


def test_accounts_lifecycle(capsys: pytest.CaptureFixture[str], ledger_url: str) -> None:
    upgrade(ledger_url)
    db = ("--database-url", ledger_url)
    settings = Settings()
    created = run_json(capsys, "accounts", "create", "--type", "user", "--node", "5", *db)
    assert set(created) == {
        "account_id", "type", "node_id", "cap_epsilon", "delta", "key_id", "api_key",
    }  # fmt: skip
    assert created["type"] == "user" and created["node_id"] == "5"
    assert created["cap_epsilon"] == settings.default_cap_epsilon
    assert created["delta"] == settings.account_delta  # the demo graph's edges
    svc = run_json(
        capsys, "accounts", "create", "--type", "service", "--cap", "3", "--delta", "1e-7",
        "--label", "backend", "--may-create-seed-accounts", *db,
    )  # fmt: skip
    assert (svc["cap_epsilon"], svc["delta"], svc["node_id"]) == (3.0, 1e-7, None)

    ledger = Ledger.from_url(ledger_url)
    try:
        user = ledger.api_keys.authenticate(created["api_key"])
        assert user is not None and user.account_id == created["account_id"]
        service = ledger.api_keys.authenticate(svc["api_key"])
        assert service is not None and service.may_create_seed_accounts
        assert service.label == "backend"
    finally:
        ledger.dispose()

    listed = run_json(capsys, "accounts", "list", *db)
    assert [a["account_id"] for a in listed] == [created["account_id"], svc["account_id"]]
    assert listed[1]["budget"]["cap_epsilon"] == 3.0
    only = run_json(capsys, "accounts", "list", "--type", "service", *db)
    assert [a["account_id"] for a in only] == [svc["account_id"]]
    code, out, _ = run(capsys, "accounts", "list", *db)
    assert code == 0 and "backend" in out

    account = str(created["account_id"])
    budget = run_json(capsys, "accounts", "set-budget", account, "--cap", "2.5", *db)
    assert budget["cap_epsilon"] == 2.5 and budget["remaining_epsilon"] == 2.5
    budget = run_json(capsys, "accounts", "set-budget", account, "--delta", "1e-8", *db)
    assert budget["delta"] == 1e-8
    assert run_json(capsys, "accounts", "budget", account, *db) == budget
    code, out, _ = run(capsys, "accounts", "budget", account, *db)
    assert code == 0 and "remaining_epsilon" in out
    daily = run_json(
        capsys, "accounts", "set-budget", account, "--period", "day", "--period-cap", "0.1", *db
    )
    assert daily["period"] == "day" and daily["period_cap_epsilon"] == 0.1
    assert daily["period_spent_epsilon"] == 0.0 and daily["period_resets_at"].endswith("+00:00")
    weekly = run_json(capsys, "accounts", "set-budget", account, "--period", "week", *db)
    assert weekly["period"] == "week" and weekly["period_cap_epsilon"] == 0.1
    cleared = run_json(capsys, "accounts", "set-budget", account, "--clear-period", *db)
    assert "period" not in cleared and cleared == budget

    new = run_json(capsys, "accounts", "new-key", account, *db)
    assert new["api_key"].startswith("ppr_")
    code, out, _ = run(capsys, "accounts", "revoke-key", str(created["key_id"]), *db)
    assert code == 0 and "revoked" in out
    keys = run_json(capsys, "accounts", "keys", account, *db)
    assert [(k["key_id"], k["revoked_at"] is None) for k in keys] == [
        (created["key_id"], False),
        (new["key_id"], True),
    ]
    ledger = Ledger.from_url(ledger_url)
    try:
        assert ledger.api_keys.authenticate(created["api_key"]) is None
        assert ledger.api_keys.authenticate(new["api_key"]) is not None
        actions = [row["action"] for row in ledger.reports.list_audit()]
        assert actions.count("account.create") == 2 and actions.count("budget.set") == 5
        assert all(row["actor_account_id"] is None for row in ledger.reports.list_audit())
    finally:
        ledger.dispose()


def test_create_prints_the_key_once(capsys: pytest.CaptureFixture[str], sqlite_url: str) -> None:
    upgrade(sqlite_url)
    code, out, _ = run(
        capsys, "accounts", "create", "--type", "admin", "--database-url", sqlite_url
    )
    assert code == 0
    key = out.strip().splitlines()[-1]
    assert key.startswith("ppr_") and out.count(key) == 1
    code, out, _ = run(capsys, "accounts", "keys", "1", "--database-url", sqlite_url)
    assert code == 0 and key not in out and key[:12] in out


@pytest.mark.parametrize(
    ("argv", "code_name"),
    [
        (["--type", "user"], "invalid_parameter"),
        (["--type", "service", "--node", "5"], "invalid_parameter"),
        (["--type", "user", "--node", "not-a-node"], "unknown_node"),
        (["--type", "user", "--node", "7"], "account_exists"),
    ],
)
def test_create_errors(
    capsys: pytest.CaptureFixture[str], sqlite_url: str, argv: list[str], code_name: str
) -> None:
    upgrade(sqlite_url)
    db = ("--database-url", sqlite_url)
    assert run(capsys, "accounts", "create", "--type", "user", "--node", "7", *db)[0] == 0
    code, out, err = run(capsys, "accounts", "create", *argv, *db)
    assert code == 2 and out == ""
    assert err.startswith(f"error [{code_name}]: ") and "Traceback" not in err


def test_create_on_a_graph_file(
    capsys: pytest.CaptureFixture[str], sqlite_url: str, tmp_path: Path
) -> None:
    upgrade(sqlite_url)
    graph = tmp_path / "edges.txt"
    graph.write_text("alice bob\nbob carol\n")
    db = ("--database-url", sqlite_url)
    created = run_json(
        capsys, "accounts", "create", "--type", "user", "--node", "alice", "--graph", str(graph),
        *db,
    )  # fmt: skip
    assert created["delta"] == Settings().account_delta
    code, _, err = run(
        capsys, "accounts", "create", "--type", "user", "--node", "5", "--graph", str(graph), *db
    )
    assert code == 2 and "unknown_node" in err


def test_other_errors(capsys: pytest.CaptureFixture[str], sqlite_url: str) -> None:
    upgrade(sqlite_url)
    db = ("--database-url", sqlite_url)
    code, _, err = run(capsys, "accounts", "budget", "42", *db)
    assert code == 2 and err.startswith("error [unknown_account]")
    code, _, err = run(capsys, "accounts", "revoke-key", "42", *db)
    assert code == 2 and err.startswith("error [unknown_api_key]")
    code, _, err = run(capsys, "accounts", "set-budget", "1", *db)
    assert code == 2 and err.startswith("error [invalid_parameter]")
    with pytest.raises(SystemExit) as usage:
        main(["accounts", "create", "--type", "root", *db])
    assert usage.value.code == 2


def test_module_entry_point_without_traceback(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    env = {**os.environ, "PPR_DATABASE_URL": url}
    env.pop("PPR_GRAPH_PATH", None)
    refused = subprocess.run(
        [sys.executable, "-m", "service", "accounts", "list"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "python -m service db upgrade" in refused.stderr and "Traceback" not in refused.stderr
    assert not Path(tmp_path / "ledger.db").exists()  # refusing created nothing
