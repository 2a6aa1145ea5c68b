"""The README is true on a clean clone: its links stay inside the repository, nothing points at
``../shared`` or at a development machine, every ``python -m service`` command in it (and in the
docs) is one the CLI accepts, the accounts block runs as written on a fresh ledger, the example
answer agrees with the quick start, ``serve`` prints that quick start, every setting is in the
configuration table (docs/configuration.md), and CONTRIBUTING.md's count of data-dependent skips
is right. (tests/test_doc_blocks.py runs every shell block against a live server.)"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import build_parser, main
from service.config import Settings
from service.ledger import upgrade
from tests.api_support import free_port, wait_until_ready
from tests.cli_runner_support import shared as shared_runner

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
#: Where the user docs' shell blocks are: the README, docs/ (notes included) and CONTRIBUTING.md.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "CONTRIBUTING.md"]
PREFIX = ".venv/bin/python -m service "
#: Fields of a ``blended`` answer's mechanism block computed from that answer's noisy counts
#: (the example is the default, ``friends_of_friends``, which states none: kept should it be a
#: ``blended`` answer again).
ANSWER_DEPENDENT = frozenset(
    {"weight", "reliability_counts", "reliability_degrees", "counts_signal", "score_grid"}
)


def _shell_blocks(text: str = README) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def _quick_start() -> str:
    (block,) = [b for b in _shell_blocks() if "KEY=ppr_..." in b and "/v1/me/budget" in b]
    return block


def _accounts_block() -> str:
    (block,) = [b for b in _shell_blocks() if f"{PREFIX}accounts revoke-key" in b]
    return block


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
    commands = [
        argv
        for path in DOCS
        for block in _shell_blocks(path.read_text())
        for argv in _commands(block)
    ]
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
    block = _accounts_block()
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

    # the example answer is that of the user account the quick start creates (account 2), with
    # the cap it gives it (the same account and cap as the accounts block leaves on a fresh ledger)
    answer = _example_answer()
    budget = answer["budget"]
    assert budget["account_id"] == 2
    assert budget["cap_epsilon"] == _cap_after_the_block(_commands(_quick_start()))
    assert budget["cap_epsilon"] == _cap_after_the_block(commands)
    assert budget["remaining_epsilon"] == pytest.approx(
        budget["cap_epsilon"] - budget["spent_epsilon"], abs=1e-12
    )


def _example_answer() -> dict[str, Any]:
    """The README's first example answer (the block after the first query)."""
    queries = README[README.index("### Queries") :]
    answer: dict[str, Any] = json.loads(re.search(r"```json\n(.*?)```", queries, re.S)[1])  # type: ignore[index]
    return answer


def _cap_after_the_block(commands: list[list[str]]) -> float:
    """Account 2's cap once the accounts block has run: its last set-budget, else its create."""
    (create_user,) = [argv for argv in commands if "--node" in argv]
    cap = float(create_user[create_user.index("--cap") + 1])
    for argv in commands:
        if argv[:3] == ["accounts", "set-budget", "2"] and "--cap" in argv:
            cap = float(argv[argv.index("--cap") + 1])
    return cap


@pytest.mark.slow
def test_the_first_example_answer_is_the_default_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's first query, asked of a live server on the embedded default (SQLite
    ledger, in-process caches, demo graph, default settings) with the key the accounts block
    printed, answers in the shape and with the mechanism the README shows; with the quick
    start's accounts in the ledger, ``serve`` does not print the quick start."""
    block = _quick_start()
    url = f"sqlite:///{tmp_path / 'ppr-ledger.db'}"
    upgrade(url)
    for name in [n for n in os.environ if n.startswith("PPR_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PPR_DATABASE_URL", url)
    key = None
    commands = _commands(block)
    for argv in commands:
        assert main(argv) == 0
        out = capsys.readouterr().out
        if "--node" in argv:
            key = json.loads(out)["api_key"]
    assert key is not None
    queries = README[README.index("### Queries") :]
    target = re.search(r'"http://127\.0\.0\.1:8000(/v1/ppr/[^"]+)"', queries)
    assert target is not None
    shown = _example_answer()

    env = {name: value for name, value in os.environ.items() if not name.startswith("PPR_")}
    env.update(
        PPR_DATABASE_URL=url,
        # where the graph's snapshot goes, and no background prefix table: neither changes
        # an answer's shape or mechanism
        PPR_GRAPH_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
        PPR_PREFIX_TABLE_BYTES="0",
    )
    log = tmp_path / "server.log"
    with _serving(env, REPO, log) as base:
        response = httpx.get(
            base + target[1], headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
    out = log.read_text()
    assert f"{base}/v1/me/budget" not in out, out  # accounts: no quick start
    assert response.status_code == 200, response.text
    real = response.json()

    assert list(real) == list(shown)
    assert real["node"] == shown["node"]
    # the public version id is random per ledger (never a hash of the edges): same form only
    assert re.fullmatch(r"[0-9a-f]{20}", real["graph_version"]), real["graph_version"]
    assert re.fullmatch(r"[0-9a-f]{20}", shown["graph_version"]), shown["graph_version"]
    # the mechanism block: the same fields; the same values, but for what a blend would read off
    # this answer's own noisy counts
    assert list(real["mechanism"]) == list(shown["mechanism"])
    for field, value in real["mechanism"].items():
        if field in ANSWER_DEPENDENT:
            assert type(value) is type(shown["mechanism"][field]), field
        else:
            assert value == shown["mechanism"][field], field
    assert real["budget"] == shown["budget"]
    assert real["epsilon_charged"] == shown["epsilon_charged"]
    assert real["replayed"] is shown["replayed"] is False
    # the ranking: k results, on the score grid, on the same scale
    for answer in (real, shown):
        grid = answer["mechanism"]["score_grid"]
        assert len(answer["results"]) == 5 and all(set(r) == {"node", "score"}
                                                   for r in answer["results"])  # fmt: skip
        scores = [r["score"] for r in answer["results"]]
        assert scores == sorted(scores, reverse=True)
        assert all((score / grid).is_integer() for score in scores)
    top_real, top_shown = real["results"][0]["score"], shown["results"][0]["score"]
    assert top_shown / 10 < max(top_real, real["mechanism"]["score_grid"]) < top_shown * 10


def test_every_setting_is_in_the_configuration_table() -> None:
    table = (REPO / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"`PPR_{name.upper()}" in table, f"PPR_{name.upper()} is not documented"


def test_every_documented_setting_is_a_setting() -> None:
    """The other direction: every variable the configuration table documents is a field of
    Settings (a renamed or removed setting leaves no row behind)."""
    documented: list[str] = []
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| `PPR_") and len(cells) >= 3:
            documented += re.findall(r"`(PPR_[A-Z0-9_]+)`", cells[0])
    assert len(documented) >= len(Settings.model_fields)
    for variable in documented:
        assert variable[4:].lower() in Settings.model_fields, f"{variable} is not a setting"


def test_the_data_dependent_skips_are_stated_right() -> None:
    """CONTRIBUTING.md names the one reason every data-dependent test skips with (no count
    that drifts), and no test looks for the shared data but through tests/shared_data.py."""
    from tests.shared_data import REASON

    statement = " ".join((REPO / "CONTRIBUTING.md").read_text().split())
    assert f"skips each of them with the reason `{REASON}`" in statement
    assert not re.search(r"skips (exactly )?(\d+|five|those \d+)", statement)
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name == "shared_data.py":
            continue
        text = path.read_text()
        assert not re.search(r'"shared"\s*/\s*"data"', text), (
            f"{path.name} finds the shared data itself: use tests/shared_data.py"
        )


def test_the_readme_is_for_users() -> None:
    """At most 450 lines, no path of a development machine, no commit hash."""
    assert len(README.splitlines()) <= 450
    for path in DOCS:
        text = path.read_text()
        assert not re.search(r"/(work|home|Users)/\w", text), f"{path.name}: a machine's path"
        assert not re.search(r"\b[0-9a-f]{40}\b", text), f"{path.name}: a commit hash"
        assert not re.search(r"\bcommit [0-9a-f]{7,}\b", text), f"{path.name}: a commit hash"


@pytest.mark.slow
def test_serve_prints_the_readme_quick_start_on_an_empty_ledger(tmp_path: Path) -> None:
    """The quick start ``make serve`` prints (``serve`` on a ledger with no accounts) is the
    README's, command for command (with accounts in the ledger it is not printed:
    test_the_first_example_answer_is_the_default_answer's server shows that)."""
    from service.cli.quickstart import QUICK_START, quick_start

    assert QUICK_START.format(base="http://127.0.0.1:8000") == _quick_start()
    assert _quick_start() in quick_start("127.0.0.1", 8000)
    url = f"sqlite:///{tmp_path / 'ppr-ledger.db'}"
    upgrade(url)
    env = {name: value for name, value in os.environ.items() if not name.startswith("PPR_")}
    env.update(PPR_DATABASE_URL=url, PPR_GRAPH_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
               PPR_PREFIX_TABLE_BYTES="0")  # fmt: skip
    log = tmp_path / "serve.log"
    with _serving(env, tmp_path, log) as base:
        pass
    out = log.read_text()
    assert f"{base}/v1/me/budget" in out, out


@contextmanager
def _serving(env: dict[str, str], cwd: Path, log: Path) -> Iterator[str]:
    """``python -m service serve`` on a free port with ``env``, forked from the command runner
    (tests/cli_runner_support.py), its output in ``log``: its base URL once ``/readyz`` answers
    (the log in the failure if it stops or is not ready within 180 s); terminated on exit."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = shared_runner().start(
        ["serve", "--port", str(port)], env=env, cwd=cwd, stdout=log, stderr=log, server=True
    )
    try:
        wait_until_ready(server, base, log, seconds=180)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)
