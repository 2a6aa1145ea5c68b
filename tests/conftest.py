"""Shared fixtures.

Ledger databases: ``sqlite_url`` (a file in tmp_path), ``postgres_url`` (a fresh, uniquely
named, empty database on the server at PPR_TEST_POSTGRES_URL, given back afterwards: emptied
and renamed for a later test, tests/postgres_pool.py; the test is skipped
only if the server does not answer), ``ledger_url`` (both, ids "sqlite" and "postgres") and
``ledger`` (migrated and opened).
"""

from __future__ import annotations

import compileall
import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.exc import OperationalError

from service.ledger import Ledger, upgrade
from tests import migration_replay, postgres_pool

# Empty ledgers migrate to head by replaying this process's first migration (see the module).
migration_replay.install()

POSTGRES_BASE_URL = os.environ.get(
    "PPR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)

_postgres_unreachable: str | None = None


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, uniquely named, empty database (safe under pytest-xdist), given back afterwards
    (recycled for a later test under a new name, see tests/postgres_pool.py); skips the test if
    the server does not answer."""
    global _postgres_unreachable
    base = make_url(POSTGRES_BASE_URL)
    shown = base.render_as_string(hide_password=True)
    if _postgres_unreachable is not None:
        pytest.skip(_postgres_unreachable)
    admin = create_engine(base, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        try:
            name = postgres_pool.take(admin)
        except OperationalError as exc:
            _postgres_unreachable = f"PostgreSQL at {shown} does not answer: {exc.orig}"
            pytest.skip(_postgres_unreachable)
        yield base.set(database=name).render_as_string(hide_password=False)
        postgres_pool.give_back(admin, base, name)
    finally:
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh database, unique per test (safe under pytest-xdist), dropped after the test."""
    with postgres_database() as url:
        yield url


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def ledger_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    upgrade(ledger_url)
    opened = Ledger.from_url(ledger_url)
    yield opened
    opened.dispose()


#: A test's ``record_property`` under this name is printed in the run's summary (with xdist too).
SUMMARY_PROPERTY = "summary"

#: Where tests leave files for people to look at (screenshots of the browser test).
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def pytest_configure(config: pytest.Config) -> None:
    config._ppr_started = time.time()  # type: ignore[attr-defined]
    # With pytest-xdist (make test: -n 3), hand tests to the workers one at a time in the
    # order below rather than in long runs of consecutive tests: each worker takes the next
    # test when it is free, so the slow tests, first, spread over both and the run ends on
    # short ones. The tests of a module that shares one expensive fixture (a server, a Ray
    # instance) carry xdist_group("<module>") and go to one worker together (loadgroup:
    # each other test is a unit of its own).
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    # The order below is the schedule (pytest-xdist would otherwise sort the units by size,
    # pytest_collection_modifyitems does that itself).
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False
    # A worker decides at its start, from its own command line, whether to tag its tests
    # with their xdist_group (pytest-xdist's remote.setup_config reads --dist, which is not
    # on the line make test gives); without the tag the controller schedules every test on
    # its own and a grouped module's shared server or Ray instance is started on each worker.
    # The controller says what it chose (pytest_configure_node below).
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get(_WORKERS_GROUP) is not None:
        config.option.loadgroup = workerinput[_WORKERS_GROUP]
    # Before the workers start: numba's kernels compiled once into its on-disk cache. On a
    # fresh clone every worker and every server a test starts would otherwise compile the same
    # kernels at once (about 25 CPU seconds each). In two processes: nothing else runs yet.
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        kernels = subprocess.Popen(
            [sys.executable, "-m", "service.mechanisms.compile_kernels", "--parallel"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        _write_bytecode()
        _write_rewritten_tests(config)
        assert kernels.wait() == 0, "python -m service.mechanisms.compile_kernels failed"


#: The key of the controller's choice of grouping in each worker's workerinput.
_WORKERS_GROUP = "ppr_loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist (controller): tell each worker whether the run schedules by xdist_group."""
    node.workerinput[_WORKERS_GROUP] = node.config.getvalue("dist") == "loadgroup"


def _write_bytecode() -> None:
    """The bytecode of the service and the test helpers, written once (0.4 s). Where
    PYTHONDONTWRITEBYTECODE is set (as on CI machines) no process writes it, and each of the
    ~200 processes the suite starts (servers, CLI commands, pools) would compile what it
    imports again: about 0.1 s each."""
    root = Path(__file__).resolve().parent.parent
    for folder in ("service", "tests"):
        compileall.compile_dir(root / folder, quiet=1)


def _write_rewritten_tests(config: pytest.Config) -> None:
    """pytest's assertion-rewritten bytecode of every test module, written once (4 s). pytest
    keeps none where PYTHONDONTWRITEBYTECODE is set, so each worker would rewrite every test
    module at collection (4.4 CPU-s each). Written with pytest's own rewrite and cache format
    (hash-checked: a changed module is rewritten again); these are pytest's private functions,
    so a pytest without them skips this and the workers rewrite as before."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
        )

        state = config.stash[assertstate_key]
    except (ImportError, KeyError):  # another pytest, or --assert=plain
        return
    tests = Path(__file__).resolve().parent
    for module in [*tests.rglob("test_*.py"), *tests.rglob("conftest.py")]:
        cache = get_cache_dir(module)
        pyc = cache / (module.name[:-3] + PYC_TAIL)
        if _read_pyc(module, pyc) is None:
            cache.mkdir(exist_ok=True)
            source_hash, code = _rewrite_test(module, config)
            _write_pyc(state, code, source_hash, pyc)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[object]:
    """Collection (every test module imported, with the service and its dependencies) without
    the cyclic garbage collector: what it builds lives until the process ends (see below), and
    the collector's passes over it while it grew were about a seventh of a worker's collection
    (collect-only, same hour: 7.4 CPU-s with the collector on, 6.4 with it off)."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every test module, the service and its dependencies, imported)
    lives until the process ends: moved out of the cyclic garbage collector's sight
    (``gc.freeze``), so that its full collections during the tests stop walking it each time.
    A worker holds about 1.3 M objects after collection; three API test modules in one process
    spent 5.5 CPU-s of 45 s in the collector, 3.1 after the freeze."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules with a test marked ``slow`` first, then the others, each module's tests
    together and in their order (a module's shared fixtures are set up once per worker).
    Scheduled by xdist_group: see :func:`_schedule`."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("waits") is not None:
                item.add_marker(pytest.mark.xdist_group(f"waits-{item.path.stem}"))
            _tag_with_group(item)
        items[:] = _schedule(items)


def _unit(item: pytest.Item) -> str:
    """What the controller hands to a worker at once: the test's xdist_group, else the test
    (as pytest-xdist's LoadGroupScheduling splits a test id)."""
    nodeid = item.nodeid
    return nodeid.rsplit("@", 1)[-1] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def _schedule(items: list[pytest.Item]) -> list[pytest.Item]:
    """The units in the order the workers take them: the groups, largest first, then the
    single tests in their order (what pytest-xdist's own reordering gave), and a module marked
    ``waits`` as one unit placed among the single tests, the waiting modules evenly apart. Run
    together they left the machine idle: consecutive in the order, a waiting module's tests
    went to all three workers at once (in a run of the suite, test_api_refresh_policy's
    3-second sleeps on all three: 1.2-1.5 of the two cores busy over those 20 s, 1.8-2.0 in
    most of the run); as one unit each they wait on one worker while the other two compute."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    waiting = [u for u in units.values() if u[0].get_closest_marker("waits") is not None]
    ordered = sorted(
        (u for u in units.values() if u[0].get_closest_marker("waits") is None),
        key=lambda unit: -len(unit),
    )  # fmt: skip
    singles = next((i for i, unit in enumerate(ordered) if len(unit) == 1), len(ordered))
    spacing = (len(ordered) - singles) / (len(waiting) + 1)
    for k in reversed(range(len(waiting))):
        ordered.insert(singles + round((k + 1) * spacing), waiting[k])
    return [item for unit in ordered for item in unit]


def _tag_with_group(item: pytest.Item) -> None:
    """A worker's test id with its xdist_group after an ``@``, as pytest-xdist tags it (the
    controller schedules a group's tests as one unit by that suffix). pytest-xdist sets the
    private ``_nodeid``, which pytest 9.2 no longer reads (the id is a ``NodeId`` in ``_id``):
    there the tag is set here, in the form xdist reads back."""
    groups = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
         for m in item.iter_markers("xdist_group")}
    )  # fmt: skip
    if not groups or "@" in item.nodeid.rpartition("]")[2]:
        return  # no group, or xdist's own tag took
    tagged = f"{item.nodeid}@{'_'.join(groups)}"
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest reads _nodeid, and xdist's tag took there
        return
    item._id = NodeId.parse(tagged)  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the databases this process kept for reuse (tests/postgres_pool.py)."""
    if _postgres_unreachable is not None:
        return
    admin = create_engine(
        make_url(POSTGRES_BASE_URL), isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 5},
    )  # fmt: skip
    try:
        postgres_pool.drop_recycled(admin)
    except OperationalError:
        pass
    finally:
        admin.dispose()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print what tests recorded as their summary (e.g. the Schemathesis request counts) and
    name the artifacts this run wrote (e.g. the dashboard's screenshots)."""
    lines = [
        str(value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == SUMMARY_PROPERTY
    ]
    if lines:
        terminalreporter.section("summaries")
        for line in lines:
            terminalreporter.write_line(line)
    started = getattr(config, "_ppr_started", None)
    if started is None or not ARTIFACTS.is_dir():
        return
    fresh = sorted(p for p in ARTIFACTS.rglob("*.png") if p.stat().st_mtime >= started)
    if fresh:
        terminalreporter.write_line(f"test artifacts ({len(fresh)} screenshots):")
        for path in fresh:
            terminalreporter.write_line(f"  {path}")
