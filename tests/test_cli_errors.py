"""Every bad invocation of the CLI ends in one line naming the flag (or the ``PPR_*`` variable
that set the value) and exit status 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import main
from tests.cli_runner_support import run_cli


def fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line error of ``argv`` (argparse's usage error or ours), after exit status 2."""
    with pytest.raises(SystemExit) as raised:
        status = main(argv)
        raise SystemExit(status)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["db", "upgrade", "--database-url", "postgres://u@h/db"], "not 'postgres://'"),
        (["db", "upgrade", "--database-url", "notaurl"], "not a database URL: 'notaurl'"),
        (["db", "current", "--database-url", "mysql://u@h/db"], "unsupported database 'mysql'"),
        (["accounts", "list", "--database-url", "notaurl"], "not a database URL"),
        (["serve", "--redis-url", "notredis://x"], "not a Redis URL: 'notredis://x'"),
        (["serve", "--database-url", "mysql://u@h/db"], "unsupported database"),
        (["bench", "--generate", "10,1000"], "10 nodes hold at most 45 edges, got 1000"),
        (["serve", "--port", "99999"], "must be in [1, 65535], got 99999"),
        (["bench", "--demo", "--epsilon", "nan"], "expected a finite number, got 'nan'"),
        (["bench", "--demo", "--queries", "x"], "expected an integer, got 'x'"),
        (["accounts", "list", "--offset", str(2**70)], "must be in [0, 2147483647]"),
        (["accounts", "list", "--offset", "-1"], "must be in [0, 2147483647], got -1"),
        (["accounts", "list", "--limit", str(2**70)], "must be in [1, 1000]"),
        (["accounts", "create", "--type", "service", "--label", "a\tb"], "control characters"),
        (["db", "upgrade", "--wait", "-1"], "must be in [0, 86400], got -1"),
    ],
)
def test_bad_flags_name_the_flag(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = fails(argv, capsys)
    assert expected in line
    flag = [a for a in argv if a.startswith("--")][-1]
    assert f"argument {flag}" in line
    assert "PPR_" not in line


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({"PPR_PORT": "99999"}, ["serve"], "PPR_PORT: Input should be less than or equal"),
        ({"PPR_DATABASE_URL": "mysql://u@h/db"}, ["accounts", "list"], "PPR_DATABASE_URL"),
        ({"PPR_DATABASE_URL": "notaurl"}, ["db", "current"], "PPR_DATABASE_URL: not a data"),
        ({"PPR_REDIS_URL": "x"}, ["serve"], "PPR_REDIS_URL: not a Redis URL"),
    ],
)
def test_bad_environment_names_the_variable(
    env: dict[str, str],
    argv: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = fails(argv, capsys)
    assert line.startswith("error [invalid_parameter]: ") and expected in line


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["accounts", "budget", str(2**31)], "ACCOUNT_ID"),
        (["accounts", "set-budget", str(2**63), "--cap", "1"], "ACCOUNT_ID"),
        (["accounts", "set-scopes", "0", "--modes", "edge"], "ACCOUNT_ID"),
        (["accounts", "revoke-key", str(10**30)], "KEY_ID"),
    ],
)
def test_ids_beyond_the_ledger_columns_name_the_argument(
    argv: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = fails(argv, capsys)
    assert f"argument {name}: must be in [1, 2147483647]" in line


def test_a_closed_pipe_is_one_line_not_a_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "calibrate", "--epsilon", "0.1", "--delta", "1e-6",
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| true`: the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 2
    assert "Traceback" not in err and err.strip().splitlines() == [
        "error [broken_pipe]: the output was closed before the command finished"
    ]


@pytest.mark.parametrize(
    ("content", "workers", "expected"),
    [
        (b"", "1", "no edges: the file is empty"),
        (b"", "2", "no edges: the file is empty"),
        (b"1 2\n3\n", "1", ":2: only one field ('3')"),
    ],
)
def test_serve_a_file_that_is_not_a_graph_is_one_line_whatever_the_workers(
    tmp_path: Path, content: bytes, workers: str, expected: str
) -> None:
    graph = tmp_path / "graph.txt"
    graph.write_bytes(content)
    env = {**os.environ, "PPR_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.db'}"}
    env.pop("PPR_GRAPH_PATH", None)
    done = run_cli(
        ["serve", "--graph", str(graph), "--auto-migrate", "--port", "1", "--workers", workers],
        env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error [graph_load_error]: "), done.stderr
    assert expected in lines[0]
