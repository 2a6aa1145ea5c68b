"""Command-line entry point: ``python -m service <command>``.

Each command lives in its own module under ``service.cli`` and exposes
``register(subparsers) -> None``, which adds a parser whose ``handler`` default is a function
``(args) -> int``. Errors a person can act on (:class:`ServiceError`, bad arguments) end the
process with a one-line message and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from service.errors import ServiceError

#: Command modules, in the order ``--help`` lists them.
COMMAND_MODULES = ("calibrate", "query", "evaluate", "bench", "serve", "accounts", "db")


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ServiceError as exc:
        print(f"error [{exc.code}]: {exc.message}", file=sys.stderr)
        return exc.cli_exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
