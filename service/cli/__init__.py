"""Command-line entry point: ``python -m service <command>``.

Each command lives in its own module under ``service.cli`` and exposes
``register(subparsers) -> None``, which adds a parser whose ``handler`` default is a function
``(args) -> int``. Errors a person can act on (:class:`ServiceError`, bad arguments) end the
process with a one-line message and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from service.errors import ServiceError

if TYPE_CHECKING:
    from pydantic import ValidationError

#: Command modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "calibrate",
    "query",
    "evaluate",
    "plan",
    "bench",
    "serve",
    "loadtest",
    "soak",
    "accounts",
    "ledger",
    "db",
    "batch",
    "synthesize",
    "embeddings",
)


#: The installed command's name (``[project.scripts]`` in pyproject.toml).
SCRIPT_NAME = "dp-ppr"


def program_name(argv0: str | None = None) -> str:
    """How the user started us: ``dp-ppr`` (the installed command) or ``python -m service``."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return SCRIPT_NAME if name == SCRIPT_NAME else "python -m service"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-ppr-service")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        from service import __version__

        return __version__


class _VersionWhenAsked(argparse._VersionAction):
    """``--version``: the installed version, looked up (importlib.metadata) only when asked."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.version = f"%(prog)s {_version()}"
        super().__call__(parser, namespace, values, option_string)


def plain_text(text: str, prog: str) -> str:
    """A docstring as a terminal shows it: no reStructuredText markup (``x`` -> x, a literal
    block's ``::`` -> ``:``), and commands named the way the user runs them."""
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    text = re.sub(r"(?<=\S)::$", ":", text, flags=re.M)
    text = re.sub(r"^::$", "", text, flags=re.M)
    return text.replace("python -m service", prog)


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    prog = prog or program_name()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Differentially private personalized PageRank: engine, service and tools.",
    )
    parser.add_argument("--version", action=_VersionWhenAsked)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"service.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"service.cli.{name}":
                continue
            raise
        module.register(subparsers)
    for each in _parsers(parser):
        if each.description:
            each.description = plain_text(each.description, prog)
        if each.epilog:
            each.epilog = plain_text(each.epilog, prog)
        for action in each._actions:
            if action.help and action.help is not argparse.SUPPRESS:
                action.help = plain_text(action.help, prog)
    return parser


def _validation_error() -> type[ValidationError]:
    """pydantic's ValidationError, imported once a handler has raised something (an except
    clause is evaluated only then): ``--help`` and the parser never import pydantic."""
    from pydantic import ValidationError

    return ValidationError


def _fail(exc: ServiceError) -> int:
    print(f"error [{exc.code}]: {exc.message}", file=sys.stderr)
    return exc.cli_exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ServiceError as exc:
        return _fail(exc)
    except _validation_error() as exc:  # a PPR_* environment variable out of range
        from service.config import settings_error

        return _fail(settings_error(exc))
    except BrokenPipeError:
        # The reader went away (``... | head``): stop writing, without a traceback.
        _silence_stdout()
        print("error [broken_pipe]: the output was closed before the command finished",
              file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("PPR_TRACEBACK"):
            raise
        print(
            f"error [internal_error]: unexpected {type(exc).__name__}: {exc} "
            "(set PPR_TRACEBACK=1 to see where)",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
