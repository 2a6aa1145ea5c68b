"""The privacy audit's one command (benchmarks/privacy_audit.py, docs/privacy.md section 11):
it lists every case of the regression suite, refuses bad arguments with exit 2, and prints one
table row per case with the draws, the claim, both lower bounds and whether the control was
caught, then a verdict line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.privacy_audit import CASES
from tests.script_support import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "privacy_audit.py"


#: The command's module: its ``main`` is what ``python privacy_audit.py`` runs (the script ends
#: with ``raise SystemExit(main())``).
COMMAND = load_benchmark("privacy_audit", "privacy_audit_command")


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    def command(*args: str) -> Done:
        code = COMMAND.main(list(args))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return command


def test_it_lists_every_case_of_the_suite() -> None:
    """As a command (the other tests call its ``main`` in this process)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [spec.name for spec in CASES]


def test_bad_arguments_exit_2(run: Callable[..., Done]) -> None:
    for args in (("--only", "no-such-case"), ("--draws", "0"), ("--alpha", "1")):
        done = run(*args)
        assert done.returncode == 2 and done.stdout.startswith("privacy_audit:"), args


def test_one_case_prints_its_row_and_a_verdict(run: Callable[..., Done]) -> None:
    done = run("--only", "popular/both/friend-friend", "--draws", "3000", "--selection", "1000")
    assert done.returncode in (0, 1), done.stderr  # 1: the control not caught at 3,000 draws
    rows = [line for line in done.stdout.splitlines() if line.startswith("| popular ")]
    assert len(rows) == 2  # as it runs, and in the final table
    cells = [cell.strip() for cell in rows[-1].strip("|").split("|")]
    assert cells[:5] == ["popular", "both", "friend-friend", "3000 (+1000)", "1.0000 (0)"]
    assert len(cells) == 10 and cells[-1] in ("yes", "NO")
    assert float(cells[6]) <= 1.0 + 0.3  # the real release's lower bound, near the claim at most
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("# all 1 cases held" if done.returncode == 0 else "# NOT HELD (1)")
