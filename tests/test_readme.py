"""The README is true on a clean clone: its links stay inside the repository, nothing points at
``../shared``, every ``python -m service`` command in it is one the CLI accepts, the accounts
block runs as written on a fresh ledger, the example answer agrees with it, every setting is in
the configuration table, and the test section's count of data-dependent skips is right."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from service.cli import build_parser, main
from service.config import Settings
from service.ledger import upgrade

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PREFIX = ".venv/bin/python -m service "


def _shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README, re.S)


def _commands(block: str) -> list[list[str]]:
    """The ``python -m service`` commands of a shell block, as argv (comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith(PREFIX):
            continue
        argv = shlex.split(line[len(PREFIX) :], comments=True)
        commands.append(argv)
    return commands


def test_links_stay_inside_the_repository() -> None:
    assert "../shared" not in README and "](../" not in README
    for target in re.findall(r"\]\(([^)]+)\)", README):
        assert not re.match(r"[a-z]+:", target), f"link outside the repository: {target}"
        path = target.split("#", 1)[0]
        if path:
            assert (REPO / path).resolve().is_relative_to(REPO), f"outside the repo: {target}"
            assert (REPO / path).exists(), f"broken link: {target}"


def test_every_command_is_accepted_by_the_cli() -> None:
    parser = build_parser()
    commands = [argv for block in _shell_blocks() for argv in _commands(block)]
    assert len(commands) > 20
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(
                f"the README's command is not accepted: python -m service {shlex.join(argv)}"
            )


def test_the_accounts_block_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (block,) = [b for b in _shell_blocks() if f"{PREFIX}accounts create --type admin" in b]
    url = f"sqlite:///{tmp_path / 'ppr-ledger.db'}"
    upgrade(url)
    monkeypatch.setenv("PPR_DATABASE_URL", url)
    monkeypatch.delenv("PPR_GRAPH_PATH", raising=False)
    commands = _commands(block)
    assert [argv[:2] for argv in commands[-6:]] == [
        ["accounts", "list"], ["accounts", "budget"], ["accounts", "set-budget"],
        ["accounts", "keys"], ["accounts", "new-key"], ["accounts", "revoke-key"],
    ]  # fmt: skip
    for argv in commands:
        status = main(argv)
        _, err = capsys.readouterr()
        assert status == 0, f"python -m service {shlex.join(argv)}: {err}"

    # the example answer is that of the user account the block creates (account 2, its cap)
    (create_user,) = [argv for argv in commands if "--node" in argv]
    cap = float(create_user[create_user.index("--cap") + 1])
    pattern = (
        r'"budget": \{"account_id": (\d+), "spent_epsilon": ([\d.]+), '
        r'"cap_epsilon": ([\d.]+),\s+"remaining_epsilon": ([\d.]+)'
    )
    budget = re.search(pattern, README)
    assert budget is not None
    account, spent, shown_cap, remaining = budget.groups()
    assert int(account) == 2 and float(shown_cap) == cap
    assert float(remaining) == pytest.approx(cap - float(spent), abs=1e-12)


def test_every_setting_is_in_the_configuration_table() -> None:
    table = README[README.index("### Configuration") :]
    for name in Settings.model_fields:
        assert f"`PPR_{name.upper()}" in table, f"PPR_{name.upper()} is not documented"


def test_the_data_dependent_skips_are_counted_right() -> None:
    assert "a clone without it skips exactly those 5" in README
    tests = "".join(p.read_text() for p in (REPO / "tests").glob("test_*.py"))
    uses = len(re.findall(r'_shared\("', tests)) + len(re.findall(r"skipif\(not \(DATA", tests))
    assert uses == 5
