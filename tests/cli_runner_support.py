"""``python -m service ARGS`` without a new interpreter each time: one process imports the
command line (and what its commands import) once, then forks a child for each command.

Starting the interpreter and importing the service (SQLAlchemy, NumPy, pydantic, the ledger)
is most of a short command's cost: 0.7-0.9 CPU-s of an ``accounts list``. The child forked for
a command runs ``python -m service`` the way the interpreter does (``runpy``: the package's
``__main__``, ``sys.argv`` as it sets it), in the command's working directory and environment,
with its own stdout and stderr and stdin from /dev/null, and exits with the command's exit
status (a ``SystemExit``'s code, 1 and the traceback for an exception that escapes). What it
cannot see is a fresh interpreter: the runner's modules are already imported (nothing runs at
their import that reads the environment: settings are read when a command builds them), and
``PYTHON*`` variables of the command's environment are not read again.

The runner is started with ``python -m tests.cli_runner_support`` and reads one JSON request a
line on stdin (argv, env, cwd, two output paths); for each it writes the child's pid, then its
exit status, one line each.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

REPO = Path(__file__).resolve().parents[1]

#: Imported before the first fork: the command line's modules and what the commands the tests
#: run import when they run (the ledger, the settings, the batch runner, the load generator).
PRELOADED = (
    "service.cli",
    "service.config",
    "service.ledger.ledger",
    "service.ledger.database",
    "service.batch.run",
    "service.batch.lifetime",
    "service.cli.edge_report",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
)


@dataclass
class Completed:
    """What ``subprocess.run(..., capture_output=True, text=True)`` gives, for a forked
    command."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


class CliRunner:
    """The test side: starts the runner process and runs commands in it, one at a time."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._count = 0
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_runner_support"], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip

    def run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Completed:
        """``python -m service *args`` in ``cwd`` with ``env``; killed after ``timeout`` s."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._count += 1
        out = self._workdir / f"cli-{self._count}.out"
        err = self._workdir / f"cli-{self._count}.err"
        request = {"args": args, "env": env, "cwd": str(cwd), "stdout": str(out),
                   "stderr": str(err)}  # fmt: skip
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()
        pid = int(self._reply(self._process.stdout, 60, args))
        try:
            status = int(self._reply(self._process.stdout, timeout, args))
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise
        return Completed(args, status, out.read_text(), err.read_text())

    def _reply(self, stream: BinaryIO, timeout: float, args: list[str]) -> str:
        ready, _, _ = select.select([stream], [], [], timeout)
        if not ready:
            raise TimeoutError(f"python -m service {' '.join(args)}: no answer in {timeout} s")
        line = stream.readline()
        if not line:
            raise RuntimeError(
                f"the command runner (tests/cli_runner_support.py) exited (status "
                f"{self._process.wait()}) while running python -m service {' '.join(args)}"
            )
        return line.decode().strip()

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


def _exit_status(code: Any) -> int:
    """The interpreter's exit status for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any]) -> None:
    """In the forked child: the command, as ``python -m service`` runs it; never returns."""
    status = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = ["-m", *request["args"]]
        try:
            runpy.run_module("service", run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except BaseException:
            traceback.print_exc()
            status = 1
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def serve() -> None:
    """The runner's loop: a request a line on stdin, the pid and the exit status on stdout."""
    for name in PRELOADED:
        importlib.import_module(name)
    # every command's parser module, as build_parser imports them
    importlib.import_module("service.cli").build_parser("python -m service")
    requests = sys.stdin.buffer
    replies = sys.stdout.buffer
    for line in requests:
        request = json.loads(line)
        replies.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        replies.write(f"{pid}\n".encode())
        replies.flush()
        _, wait_status = os.waitpid(pid, 0)
        replies.write(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
        replies.flush()


if __name__ == "__main__":
    serve()
