"""What a person sees of the command line: help texts in plain words (no reStructuredText markup,
no example paths outside the project), the installed command naming itself ``dp-ppr``,
``--version``, a SQLite ledger in a directory that does not exist yet, and a start-up that
imports no numerical, database or web library before a command runs."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import build_parser, main


def _every_parser(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _every_parser(sub)
    return found


@pytest.mark.parametrize("prog", ["dp-ppr", "python -m service"])
def test_help_texts_are_plain_and_name_the_command_as_it_was_run(prog: str) -> None:
    parsers = _every_parser(build_parser(prog))
    assert len(parsers) > 20
    for name, parser in parsers:
        text = parser.format_help()
        assert name.startswith(prog)
        assert "``" not in text, f"{name}: reStructuredText markup in --help"
        assert "::" not in text, f"{name}: reStructuredText literal block in --help"
        assert "../" not in text and "shared/data" not in text, f"{name}: a path outside"
        other = "python -m service" if prog == "dp-ppr" else "dp-ppr "
        assert other not in text, f"{name}: names the command as {other!r}"


def test_the_installed_command_names_itself_and_has_a_version() -> None:
    script = Path(sys.executable).with_name("dp-ppr")
    if not script.exists():
        pytest.skip(f"{script} is not installed (make install installs it)")
    done = subprocess.run([str(script), "batch", "--help"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert done.stdout.startswith("usage: dp-ppr batch ")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip().startswith("dp-ppr 0.")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0
    out = capsys.readouterr().out.split()
    assert out[-1][0].isdigit() and " ".join(out[:-1]) in ("dp-ppr", "python -m service")


def test_a_sqlite_ledger_in_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "not" / "yet"
    url = f"sqlite:///{folder / 'ledger.db'}"
    # the advice names the directory and the command that creates it
    assert main(["accounts", "list", "--database-url", url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"nor does its directory {folder} (python -m service db upgrade creates it)" in err
    # and db upgrade does
    assert main(["db", "upgrade", "--database-url", url]) == 0
    captured = capsys.readouterr()
    assert f"created the directory {folder} for the ledger database" in captured.err
    assert folder.is_dir() and (folder / "ledger.db").is_file()
    assert main(["accounts", "list", "--database-url", url]) == 0


#: What no command's parser may import: each takes tenths of a second to seconds to load, and
#: every ``python -m service ...`` (``--help`` included) builds every command's parser.
HEAVY = ("numpy", "scipy", "numba", "sklearn", "sqlalchemy", "alembic", "pydantic", "fastapi")


def test_building_every_parser_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "from service.cli import build_parser\n"
        "from tests.test_cli_help import HEAVY, _every_parser\n"
        "for _, parser in _every_parser(build_parser()):\n"
        "    parser.format_help()\n"
        "print(' '.join(m for m in HEAVY if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert done.stdout.split() == []
