"""The command runner the tests fork ``python -m service`` from (tests/cli_runner_support.py)
gives what a new interpreter gives: exit status, stdout and stderr, in the command's working
directory and environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner_support import REPO, run_cli


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--cap", "1", "--days", "30", "--answers-per-day", "1", "--json"],
        ["plan", "--cap", "x"],  # argparse's usage and error, exit 2
        ["accounts", "budget", "1", "--database-url", "sqlite:///no/such/dir/l.db"],  # one line
    ],
    ids=["answer", "usage", "error"],
)
def test_a_forked_command_answers_as_a_new_interpreter_does(args: list[str]) -> None:
    fresh = subprocess.run(
        [sys.executable, "-m", "service", *args], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    forked = run_cli(args, cwd=REPO, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode, fresh.stdout, fresh.stderr
    )  # fmt: skip


def test_a_forked_command_runs_in_its_directory_and_environment(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("PPR_")}
    env["PPR_DATABASE_URL"] = "sqlite:///relative.db"  # relative to the working directory
    done = run_cli(["db", "upgrade"], env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "relative.db").is_file()
    assert not (REPO / "relative.db").exists()
    unset = run_cli(["accounts", "list"], env={**env, "PPR_DATABASE_URL": "nope"}, cwd=tmp_path)
    assert unset.returncode == 2 and unset.stderr.startswith("error ["), unset.stderr
