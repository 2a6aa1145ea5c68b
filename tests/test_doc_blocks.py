"""Every shell block in README.md, docs/**/*.md and CONTRIBUTING.md runs as written.

The blocks are run in the order the files are read (README first, then docs/ by path,
then CONTRIBUTING.md), line by line with bash, against a live server started the way the
README says (``make serve``) on the embedded default: a fresh SQLite ledger, in-process caches,
the demo graph. They run in parts, one test each, so that the suite's workers share them: a
block on a ledger or database of its own (``fresh-ledger``, ``postgres`` below) is a part of its
own, and so is a document whose blocks make every key they use (``ON_THEIR_OWN``), with a
server and ledger of its own; every other block runs, in order, in the first part. What a
reader fills in is filled from earlier output of its part: ``NAME=ppr_...`` takes the key of
the last account created of the kind the name says (``ADMIN_KEY`` an admin,
``SERVICE_KEY`` and ``LOAD_KEY`` a service account, anything else a user), and
``http://127.0.0.1:8000`` becomes the live server (an HTTP error status fails ``curl``, as
``--fail-with-body`` makes it). A line that starts a server (``make serve``,
``... service serve ...``) runs in the background on a port of its own until its block has run
and ``/readyz`` answered. A block after ``<!-- doc-block: postgres -->`` runs with a fresh
PostgreSQL database in place of the one it names (and Redis as it says); one after
``<!-- doc-block: fresh-ledger -->`` on a ledger of its own (its comments give a fresh ledger's
ids). A line that is one ``.venv/bin/python -m service ...`` command (no pipe, redirection or
command substitution) has its arguments expanded by bash as written and runs in a child forked
from a process that has imported the service once (tests/cli_runner_support.py: a new
interpreter for each of the ~30 such lines cost 0.8 CPU-s each); every other line runs in bash.
Every command must exit 0. When a ``json`` block follows a shell block, the last command's
output must have its shape: the same top-level fields, every field it names, and the same
mechanism.

A block that cannot run here is marked ``<!-- doc-block: not-run (reason) -->``; the test lists
the marked blocks with their reasons (``test_the_not_run_blocks_are_listed``) and checks that
every one has a reason, so nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from service.ledger import LedgerNotMigrated
from tests.api_support import free_port, wait_until_ready
from tests.cli_runner_support import CliRunner, Completed, shared
from tests.test_api import REDIS_URL, forget_cached_keys, redis_answers

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "CONTRIBUTING.md"]
BLOCK = re.compile(
    r"(?:<!-- doc-block: (?P<marker>[a-z-]+)(?: \((?P<reason>[^)]*)\))? -->\n)?"
    r"^(?P<indent>[ \t]*)```sh\n(?P<body>.*?)^[ \t]*```\n"
    r"(?P<after>[ \t]*```json\n(?P<json>.*?)```)?",
    re.S | re.M,
)
MARKERS = {"not-run", "postgres", "fresh-ledger"}
#: Markers of a block that runs on a ledger or database of its own (no live server needed).
OWN_LEDGER = {"postgres", "fresh-ledger"}
#: Documents whose blocks make every key they use: each runs on a server of its own.
ON_THEIR_OWN = ("docs/embeddings.md",)
SERVER = re.compile(r"(^|\s)(make serve|\S*python -m service serve|\S*dp-ppr serve)(\s|$)")
LIVE = "http://127.0.0.1:8000"
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/"


@dataclass
class Block:
    path: Path
    line: int
    body: str
    marker: str | None
    reason: str | None
    shown: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            indent = match["indent"]
            body = "\n".join(line.removeprefix(indent) for line in match["body"].splitlines())
            found.append(
                Block(
                    path=path,
                    line=text.count("\n", 0, match.start("body")),
                    body=body,
                    marker=match["marker"],
                    reason=match["reason"],
                    shown=match["json"],
                )
            )
    return found


@dataclass
class Part:
    """Blocks that run in order in one test; ``live``: against a live server of their own."""

    name: str
    blocks: list[Block]
    live: bool


def parts() -> list[Part]:
    """Every block that runs, in parts (see the module's docstring)."""
    first = Part("documents", [], live=True)
    found = [first]
    for block in blocks():
        relative = str(block.path.relative_to(REPO))
        if block.marker == "not-run":
            continue
        if block.marker in OWN_LEDGER:
            found.append(Part(block.name, [block], live=False))
        elif relative in ON_THEIR_OWN:
            if found[-1].name != relative:
                found.append(Part(relative, [], live=True))
            found[-1].blocks.append(block)
        else:
            first.blocks.append(block)
    return found


def test_every_block_that_runs_is_in_exactly_one_part() -> None:
    runnable = [b.name for b in blocks() if b.marker != "not-run"]
    in_parts = [b.name for part in parts() for b in part.blocks]
    assert sorted(in_parts) == sorted(runnable)
    assert len(in_parts) == len(set(in_parts))
    assert len(in_parts) >= 8
    for name in ON_THEIR_OWN:
        assert any(part.name == name for part in parts()), f"{name} has no block that runs"


def test_every_shell_block_is_found_and_every_marker_is_known() -> None:
    found = blocks()
    for path in DOCS:
        opened = len(re.findall(r"^[ \t]*```sh\n", path.read_text(), re.M))
        assert opened == sum(b.path == path for b in found), f"{path.name}: a block not parsed"
    for block in found:
        assert block.marker is None or block.marker in MARKERS, block.name
        if block.marker == "not-run":
            assert block.reason and len(block.reason) > 10, f"{block.name}: say why not"
    text = "".join(path.read_text() for path in DOCS)
    # a marker that is not right before a block is a mistake
    assert text.count("<!-- doc-block:") == sum(b.marker is not None for b in found)


def test_the_not_run_blocks_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    """The blocks no test runs, each with its reason (shown with ``-s``); the README's own are
    only those that need Docker, the suite itself, the wheel build or minutes of load."""
    marked = [b for b in blocks() if b.marker == "not-run"]
    with capsys.disabled():
        print(f"\n{len(marked)} shell blocks are not run:")
        for block in marked:
            print(f"  {block.name}: {block.reason}")
    readme = [b for b in marked if b.path.name == "README.md"]
    allowed = ("Docker", "suite", "wheel", "load")
    for block in readme:
        assert any(word in (block.reason or "") for word in allowed), block.name


@dataclass
class Run:
    """The state the blocks share: the live server, the environment, the keys printed."""

    workdir: Path
    port: int
    env: dict[str, str]
    cli: CliRunner | None = None
    keys: dict[str, str] = field(default_factory=dict)  # account type -> last key printed
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)


def _environment(tmp_path: Path, url: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("PPR_")}
    env.update(
        PPR_DATABASE_URL=url,
        # where the graph's snapshot goes, and no background prefix table: neither changes an
        # answer's shape or mechanism, and a table build would take the machine for minutes
        PPR_GRAPH_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
        PPR_PREFIX_TABLE_BYTES="0",
        PPR_LOG_LEVEL="warning",
    )
    return env


def _wait_ready(server: subprocess.Popen[bytes], port: int, log: Path) -> None:
    wait_until_ready(server, f"http://127.0.0.1:{port}", log, seconds=240)


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    workdir = tmp_path / "reader"
    workdir.mkdir()
    # a reader's checkout: what the blocks name, without writing into the repository
    for name in (".venv", "Makefile", "pyproject.toml", "Dockerfile", "docker-compose.yml"):
        (workdir / name).symlink_to(REPO / name)
    url = f"sqlite:///{tmp_path / 'ppr-ledger.db'}"
    state = Run(workdir=workdir, port=free_port(), env=_environment(tmp_path, url), cli=shared())
    try:
        yield state
    finally:
        for started in state.servers:
            _stop(started)
        for name in state.databases:
            # what the block's server cached in the shared Redis, under this ledger's id (none
            # where the block made no ledger there)
            url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
            with contextlib.suppress(OperationalError, LedgerNotMigrated):
                if redis_answers():
                    forget_cached_keys(url, REDIS_URL)
            subprocess.run(
                ["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", "--force", name],
                capture_output=True,
            )  # fmt: skip


def _serve(state: Run, tmp_path: Path) -> None:
    """``make serve`` on the run's ledger, as the README starts it; back once it is ready."""
    log = tmp_path / "make-serve.log"
    env = dict(state.env, PPR_PORT=str(state.port))
    with open(log, "wb") as sink:
        server = subprocess.Popen(
            ["make", "serve"], cwd=state.workdir, env=env, stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    state.servers.append(server)
    _wait_ready(server, state.port, log)
    # make serve on an empty ledger prints the quick start, pointed at where it listens
    assert f"http://127.0.0.1:{state.port}/v1/me/budget" in log.read_text()


def _lines(body: str) -> list[str]:
    """The block's commands: continuation lines joined, blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n[ \t]*", " ", body)
    return [
        line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _placeholder(name: str) -> str:
    upper = name.upper()
    if "ADMIN" in upper:
        return "admin"
    if "SERVICE" in upper or "LOAD" in upper:
        return "service"
    return "user"


def _fill(line: str, state: Run, env: dict[str, str]) -> str:
    def key(match: re.Match[str]) -> str:
        kind = _placeholder(match[1])
        assert kind in state.keys, f"no {kind} key printed before {line!r}"
        return f"{match[1]}={state.keys[kind]}"

    line = re.sub(r"\b([A-Z_]+)=ppr_\.\.\.", key, line)
    if re.match(r"^[A-Z_]+=\S+(\s+#.*)?$", line):
        line = "export " + line  # a variable the next lines (each its own bash) read
    assert "ppr_..." not in line, f"a placeholder the test cannot fill: {line!r}"
    # an HTTP error is a failed command, as a reader would take it (curl -s alone exits 0)
    line = re.sub(r"(^|\s)curl ", r"\1curl --fail-with-body ", line)
    return line.replace(LIVE, f"http://127.0.0.1:{state.port}")


def _postgres(line: str, state: Run, names: dict[str, str]) -> str:
    """A fresh database in place of each one the line names (created by its createdb)."""

    def fresh(name: str) -> str:
        if name not in names:
            names[name] = f"doc_{name}_{uuid.uuid4().hex[:10]}"
            state.databases.append(names[name])
        return names[name]

    line = re.sub(
        r"(createdb -h 127\.0\.0\.1 -U postgres )(\w+)", lambda m: m[1] + fresh(m[2]), line
    )
    return re.sub(re.escape(PG) + r"(\w+)", lambda m: PG + fresh(m[1]), line)


#: A line that is one ``python -m service`` command of the reader's venv (and what follows it).
CLI_LINE = re.compile(r"^\s*\.venv/bin/python -m service(?=\s|$)")


def _cli_arguments(line: str, env: dict[str, str]) -> list[str] | None:
    """The arguments of a line that is one ``.venv/bin/python -m service`` command, expanded by
    bash as written (variables, quotes, a trailing comment); None for any other line (a pipe,
    a redirection, a command substitution, more than one command)."""
    found = CLI_LINE.match(line)
    if found is None or "`" in line or "$(" in line:
        return None
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        if any(set(token) <= set(lexer.punctuation_chars) for token in lexer):
            return None
    except ValueError:  # an unclosed quote: bash's to report
        return None
    done = subprocess.run(
        ["bash", "-c", "printf '%s\\0'" + line[found.end() :]], env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"bash could not expand {line!r}: {done.stderr}"
    return done.stdout.split("\0")[:-1]


def _run_line(line: str, state: Run, env: dict[str, str], envfile: Path) -> Completed:
    """One line: a ``python -m service`` command forked from the runner (the environment is
    unchanged by it), any other in bash, the environment it leaves read back into ``env``."""
    arguments = _cli_arguments(line, env) if state.cli is not None else None
    if arguments is not None and state.cli is not None:
        return state.cli.run(arguments, env=env, cwd=state.workdir, timeout=600)
    script = f"{line}\nstatus=$?\nenv -0 > {shlex.quote(str(envfile))}\nexit $status\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=state.workdir, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    if done.returncode == 0:
        env.clear()
        pairs = [item.split("=", 1) for item in envfile.read_text().split("\0")]
        env.update({pair[0]: pair[1] for pair in pairs if len(pair) == 2})
    return Completed(done.args, done.returncode, done.stdout, done.stderr)


def _execute(block: Block, state: Run, env: dict[str, str]) -> str:
    """Run the block line by line in one bash environment; the last command's output."""
    envfile = state.workdir / ".block-env"
    names: dict[str, str] = {}
    started: list[subprocess.Popen[bytes]] = []
    out = ""
    try:
        for raw in _lines(block.body):
            line = _fill(raw, state, env)
            if block.marker == "postgres":
                line = _postgres(line, state, names)
            if SERVER.search(line):
                port = free_port()
                log = state.workdir / f"server-{port}.log"
                command = re.sub(r"--port \d+", f"--port {port}", line)
                with open(log, "wb") as sink:
                    server = subprocess.Popen(
                        ["bash", "-c", command], cwd=state.workdir,
                        env=dict(env, PPR_PORT=str(port)), stdout=sink,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
                started.append(server)
                _wait_ready(server, port, log)
                continue
            done = _run_line(line, state, env, envfile)
            assert done.returncode == 0, f"{block.name}: {raw}\n{done.stdout}\n{done.stderr}"
            out = done.stdout
            _remember_keys(out, state)
    finally:
        for server in started:
            _stop(server)
    return out


def _remember_keys(out: str, state: Run) -> None:
    """A key a command printed (``accounts create --json``), by the type of its account."""
    try:
        printed = json.loads(out)
    except ValueError:
        return
    if isinstance(printed, dict) and "api_key" in printed and "type" in printed:
        state.keys[str(printed["type"])] = printed["api_key"]


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


#: The fields only a replayed answer carries (when its stored release was made).
_REPLAY_ONLY = {"released_at", "age_seconds"}


def _check_shape(block: Block, out: str) -> None:
    """The answer has the example's shape: top-level fields (when the example is whole JSON),
    every field the example names, and the example's mechanism."""
    assert block.shown is not None
    real = json.loads(out)
    named = set(re.findall(r'"(\w+)":', block.shown))
    assert named <= _keys(real), f"{block.name}: missing {named - _keys(real)}"
    try:
        shown = json.loads(block.shown)
    except ValueError:
        return  # an abridged example ("..."): the fields it names are checked above
    if real.get("replayed") is True and shown.get("replayed") is False:  # the doc shows a draw
        real = {key: value for key, value in real.items() if key not in _REPLAY_ONLY}
    assert list(real) == list(shown), block.name
    if "mechanism" in shown:
        assert real["mechanism"]["name"] == shown["mechanism"]["name"], block.name
        assert real["mechanism"]["mode"] == shown["mechanism"]["mode"], block.name


@pytest.mark.slow
@pytest.mark.parametrize("part", parts(), ids=lambda part: part.name)
def test_every_shell_block_runs_as_written(run: Run, tmp_path: Path, part: Part) -> None:
    executed: list[str] = []
    env = dict(run.env)
    if part.live:
        _serve(run, tmp_path)
    for block in part.blocks:
        if block.marker == "fresh-ledger":
            own = f"sqlite:///{tmp_path / f'fresh-{len(executed)}.db'}"
            assert run.cli is not None
            migrated = run.cli.run(
                ["db", "upgrade"], env=dict(env, PPR_DATABASE_URL=own), cwd=run.workdir,
                timeout=600,
            )  # fmt: skip
            assert migrated.returncode == 0, f"db upgrade of {own}: {migrated.stderr}"
            saved = dict(run.keys)
            _execute(block, run, dict(env, PPR_DATABASE_URL=own))
            run.keys = saved  # its keys are of another ledger
        else:
            block_env = dict(env)
            out = _execute(block, run, block_env)
            if block.marker != "postgres":
                env = block_env  # what a block exports, the next ones see
            if block.shown is not None:
                _check_shape(block, out)
        executed.append(block.name)
    print(f"\nran {len(executed)} shell blocks: {', '.join(executed)}")
    assert executed == [block.name for block in part.blocks]


def test_a_drifted_answer_or_an_http_error_fails() -> None:
    """What the runner would let through if it only ran commands: an answer of another shape or
    mechanism, and a curl whose request the server refused."""
    shown = '{"node": "42", "mechanism": {"name": "blended", "mode": "personalized"}}'
    block = Block(REPO / "README.md", 1, "", None, None, shown)
    _check_shape(block, '{"node": "42", "mechanism": {"name": "blended", "mode": "personalized"}}')
    for drifted in (
        '{"node": "42", "mechanism": {"name": "noisy_diffusion", "mode": "personalized"}}',
        '{"error": {"code": "unsupported_media_type", "message": "..."}}',
        '{"node": "42", "mechanism": {"name": "blended", "mode": "personalized"}, "extra": 1}',
    ):
        with pytest.raises(AssertionError):
            _check_shape(block, drifted)
    state = Run(workdir=REPO, port=1234, env={}, keys={"user": "ppr_k"})
    filled = _fill(f'KEY=ppr_... curl -s "{LIVE}/v1/me/budget"', state, {})
    assert filled == 'KEY=ppr_k curl --fail-with-body -s "http://127.0.0.1:1234/v1/me/budget"'
    assert _fill("KEY=ppr_...   # the key", state, {}) == "export KEY=ppr_k   # the key"
