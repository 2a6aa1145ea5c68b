"""``python -m service ARGS`` without a new interpreter each time: one process imports the
command line (and what its commands import) once, then forks a child for each command.

Starting the interpreter and importing the service (SQLAlchemy, NumPy, pydantic, the ledger)
is most of a short command's cost: 0.7-0.9 CPU-s of an ``accounts list``, 1.5 of a server's
2.6. The child forked for a command runs ``python -m service`` the way the interpreter does
(``runpy``: the package's ``__main__``, ``sys.argv`` as it sets it), in the command's working
directory and environment, with its own stdout and stderr and stdin from /dev/null, and exits
with the command's exit status (a ``SystemExit``'s code; 1 and the traceback for an exception
that escapes). What it cannot see is a fresh interpreter: the runner's modules are already
imported (nothing runs at their import that reads the environment: settings are read when a
command builds them), and ``PYTHON*`` variables of the command's environment are not read
again (``TMPDIR`` is: where temporary files go is decided anew in each child); what the
runner's imports printed (a warning, say) each child prints first, as a new interpreter would.
A server (``start`` of ``serve``) is forked from the runner after it imported what a server
imports, except what imports prometheus_client: that decides at its import, from the
environment, where a server's metrics live (``serve`` sets it for several workers); the server
then forks its workers itself, as it does when started on its own.

The runner is started with ``python -m tests.cli_runner_support`` and reads one JSON request a
line on stdin (an id, argv, env, cwd, two output paths); it answers ``started ID PID`` when it
has forked the command's child and ``exited PID STATUS`` when that child has ended (statuses as
``subprocess`` gives them: minus the signal for a killed one). When its stdin closes it stops
what still runs (SIGTERM, then SIGKILL) and exits. :func:`shared` is this process's runner.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    "service.graph.loader",
    "service.loadtest.run",
    "service.loadtest.httpx_driver",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
)

#: Imported before the first server is forked: what ``serve`` imports, but nothing that
#: imports prometheus_client (see the module's docstring; the runner checks).
SERVER_PRELOADED = (
    "service.cli.serve",
    "service.api.forked_workers",
    "service.graph.configured",
    "service.graph.public_bounds",
    "service.serving.sandbox",
    "service.serving.batch",
    "service.mechanisms.engine",
    "service.graph.node_set",
    "service.api.open_files",
    "uvicorn",
    "uvicorn.supervisors",
    "fastapi",
    "redis",
    # what the app's modules import beside the metrics (0.09 of its import's 0.21 CPU-s)
    "service.api.models",
    "service.api.batch_models",
    "service.api.dashboard_models",
    "service.api.planning_models",
    "service.api.synthetic_models",
    "service.api.embedding_batch_models",
    "service.synthetic.release",
    "service.synthetic.jobs",
    "service.planning.budget",
    "service.embeddings.similar",
    "service.serving.coalescer",
    "service.serving.reconciler",
    "service.serving.embedding_batch",
    "service.serving.limits",
    "service.ledger.admin_views",
    "service.ledger.account_views",
    "service.ledger.audit_view",
    "service.ledger.admin_activity",
    "service.privacy.horizon",
    "service.mechanisms.discrete_gaussian",
)


@dataclass
class Completed:
    """What ``subprocess.run(..., capture_output=True, text=True)`` gives, for a forked
    command."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


class ForkedProcess:
    """A command the runner forked: what the tests use of a ``subprocess.Popen``."""

    def __init__(self, runner: CliRunner, pid: int, args: list[str]) -> None:
        self._runner = runner
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._runner.read_replies(0)
            self.returncode = self._runner.exited.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["python", "-m", "service", *self.args], timeout)
            self._runner.read_replies(left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class CliRunner:
    """The test side: starts the runner process and has it fork commands."""

    def __init__(self) -> None:
        self._outputs = Path(tempfile.mkdtemp(prefix="cli-runner-"))
        self._count = 0
        self._pending = b""
        self.started: dict[int, int] = {}  # request id -> pid
        self.exited: dict[int, int] = {}  # pid -> exit status, until its process reads it
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_runner_support"], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip

    def start(
        self, args: list[str], *, env: dict[str, str], cwd: Path, stdout: Path, stderr: Path,
        server: bool = False,
    ) -> ForkedProcess:  # fmt: skip
        """``python -m service *args`` forked in ``cwd`` with ``env``, its output written to
        ``stdout`` and ``stderr`` (one file when they are the same path); ``server``: after
        the runner has imported what a server imports."""
        assert self._process.stdin is not None
        self._count += 1
        request = {"id": self._count, "args": args, "env": env, "cwd": str(cwd),
                   "stdout": str(stdout), "stderr": str(stderr), "server": server}  # fmt: skip
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()
        deadline = time.monotonic() + 120
        while self._count not in self.started:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the command runner did not fork python -m service {args}")
            self.read_replies(left)
        return ForkedProcess(self, self.started.pop(self._count), args)

    def run(self, args: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> Completed:
        """``python -m service *args`` in ``cwd`` with ``env``, to its end; killed after
        ``timeout`` s (``subprocess.TimeoutExpired``, as ``subprocess.run`` raises)."""
        out = self._outputs / f"{self._count}.out"
        err = self._outputs / f"{self._count}.err"
        process = self.start(args, env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            status = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        try:
            return Completed(args, status, out.read_text(), err.read_text())
        finally:
            out.unlink()
            err.unlink()

    def read_replies(self, timeout: float | None) -> None:
        """The runner's answers that arrive within ``timeout`` s (None: until one does)."""
        stream = self._process.stdout
        assert stream is not None
        ready, _, _ = select.select([stream], [], [], timeout)
        if not ready:
            return
        data = os.read(stream.fileno(), 65536)
        if not data:
            raise RuntimeError(
                f"the command runner (tests/cli_runner_support.py) exited with status "
                f"{self._process.wait()}"
            )
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            kind, first, second = line.decode().split()
            if kind == "started":
                self.started[int(first)] = int(second)
            else:
                self.exited[int(first)] = int(second)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        shutil.rmtree(self._outputs, ignore_errors=True)


_shared: CliRunner | None = None


def shared() -> CliRunner:
    """This process's runner, started on first use and closed when the process exits."""
    global _shared
    if _shared is None or _shared._process.poll() is not None:
        _shared = CliRunner()
        atexit.register(_shared.close)
    return _shared


def run_cli(
    args: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO,
    timeout: float = 600,
) -> Completed:  # fmt: skip
    """``python -m service *args`` forked from :func:`shared` (``env``: the whole
    environment, default this process's)."""
    return shared().run(args, env=dict(os.environ if env is None else env), cwd=cwd,
                        timeout=timeout)  # fmt: skip


# --- the runner process ---


def _exit_status(code: Any) -> int:
    """The interpreter's exit status for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _outputs(request: dict[str, Any]) -> dict[str, int]:
    """The command's output files, opened (truncated) before its fork: they exist once the
    runner answers ``started``."""
    return {
        path: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for path in dict.fromkeys((request["stdout"], request["stderr"]))
    }


def _preload(names: tuple[str, ...], build_parser: bool = False) -> tuple[bytes, bytes]:
    """``names`` imported (and the command line's parser built); what the imports printed to
    stdout and stderr (a warning, say), which each child then prints first, as a new
    interpreter importing them would."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            for name in names:
                importlib.import_module(name)
            if build_parser:  # every command's parser module, as build_parser imports them
                importlib.import_module("service.cli").build_parser("python -m service")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, original in zip((1, 2), saved, strict=True):
                os.dup2(original, fd)
                os.close(original)
        out.seek(0)
        err.seek(0)
        _freeze()
        return out.read(), err.read()


def _freeze() -> None:
    """What the runner has imported moved out of the cyclic garbage collector's sight
    (``gc.freeze``), as the collector's documentation advises before forking: a child's
    collections then neither walk those objects nor write to their pages (each write a
    copy-on-write fault in the child). It lives as long as the runner, so nothing is kept that
    would have been collected (``gc.collect`` first). Forked servers started 0.33-0.43 CPU-s
    each with it, 0.46-0.54 without (two workers, SQLite, this machine, the runner's child and
    its workers to the first answers)."""
    gc.collect()
    gc.freeze()


def _child(
    request: dict[str, Any], opened: dict[str, int], wakeup: tuple[int, int],
    printed: list[tuple[bytes, bytes]],
) -> None:  # fmt: skip
    """In the forked child: the command, as ``python -m service`` runs it; never returns."""
    status = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wakeup:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(opened[request["stdout"]], 1)
        os.dup2(opened[request["stderr"]], 2)
        for each in opened.values():
            os.close(each)
        for out, err in printed:
            os.write(1, out)
            os.write(2, err)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # where temporary files go is read from TMPDIR on first use and kept: the runner's
        # own use (its preloading) must not decide it for the command
        tempfile.tempdir = None
        sys.argv = ["-m", *request["args"]]
        try:
            runpy.run_module("service", run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except BaseException:
            traceback.print_exc()
            status = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _write(line: str) -> None:
    os.write(1, line.encode() + b"\n")


def serve() -> None:
    """The runner's loop (see the module's docstring)."""
    printed = [_preload(PRELOADED, build_parser=True)]
    server_printed: tuple[bytes, bytes] | None = None
    wakeup = os.pipe()
    for fd in wakeup:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wakeup[1])
    signal.signal(signal.SIGCHLD, lambda number, frame: None)
    running: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0, wakeup[0]], [], [])
        if wakeup[0] in ready:
            while True:
                try:
                    if not os.read(wakeup[0], 4096):
                        break
                except BlockingIOError:
                    break
        while running:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            running.discard(pid)
            _write(f"exited {pid} {os.waitstatus_to_exitcode(wait_status)}")
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            request = json.loads(line)
            if request["server"] and server_printed is None:
                server_printed = _preload(SERVER_PRELOADED)
                assert "prometheus_client" not in sys.modules, "a preload imported it"
            sys.stdout.flush()
            sys.stderr.flush()
            opened = _outputs(request)
            pid = os.fork()
            if pid == 0:
                extra = [server_printed] if request["server"] and server_printed else []
                _child(request, opened, wakeup, printed + extra)
            for each in opened.values():
                os.close(each)
            running.add(pid)
            _write(f"started {request['id']} {pid}")
    _stop(running)


def _stop(running: set[int]) -> None:
    """What still runs when the tests' process has gone: SIGTERM, then SIGKILL after 20 s."""
    for pid in running:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while running and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
        running.discard(pid)
    for pid in running:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    serve()
