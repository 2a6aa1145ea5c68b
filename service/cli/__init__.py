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
import sys
from collections.abc import Sequence

from service.errors import ServiceError

#: Command modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "calibrate",
    "query",
    "evaluate",
    "bench",
    "serve",
    "loadtest",
    "soak",
    "accounts",
    "ledger",
    "db",
    "batch",
    "synthesize",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description="Differentially private personalized PageRank: engine, service and tools.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"service.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"service.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def _fail(exc: ServiceError) -> int:
    print(f"error [{exc.code}]: {exc.message}", file=sys.stderr)
    return exc.cli_exit_code


def main(argv: Sequence[str] | None = None) -> int:
    from pydantic import ValidationError

    from service.config import settings_error

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ServiceError as exc:
        return _fail(exc)
    except ValidationError as exc:  # a PPR_* environment variable out of range
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
