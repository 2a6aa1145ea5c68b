"""``serve --workers N``: workers forked from a supervisor that loaded everything they share.

uvicorn's process manager starts each worker as a fresh interpreter (``spawn``): every worker
imports numpy, scipy, numba, FastAPI and SQLAlchemy again, compiles the kernels again and
loads its own graph. Here the supervisor does that work once, before any worker exists:

* it imports and builds the application (routes, models, OpenAPI schema; no resources),
* it loads the configured graph through its snapshot (:mod:`service.graph.snapshot`), which
  writes the snapshot if there is none, and compiles the kernels for its index types,
* it freezes the garbage collector's view of those objects (``gc.freeze``) so that no
  collection in a worker touches, and so copies, their pages,

and then uvicorn's own manager (restart of a dead worker, SIGHUP, SIGTTIN/SIGTTOU) forks the
workers instead of spawning them. Each worker still builds its own runtime (ledger pool,
caches, engine threads) in its lifespan, after the fork, and maps the graph snapshot the
supervisor wrote; the imported code and the compiled kernels stay shared pages. The
supervisor opens no connection and starts no thread before it forks, so a fork copies no
lock held by another thread. Each worker draws its noise from generators seeded per request
from the OS (:func:`service.mechanisms.randomness.fresh_generator`), never from state copied
from the supervisor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from socket import socket
from typing import Any

import numpy as np
from fastapi import FastAPI

from service.config import Settings
from service.graph.model import Graph
from service.mechanisms import hold_out, ranking_kernels
from service.mechanisms.engine import warm_engine
from service.mechanisms.operator import WalkOperator

log = logging.getLogger(__name__)

_FORK = multiprocessing.get_context("fork")


_app: FastAPI | None = None


def preloaded_app() -> FastAPI:
    """The app factory the forked workers run: the app the supervisor built (each worker's
    lifespan then builds that worker's runtime), else a new one."""
    from service.api.app import create_app

    return _app if _app is not None else create_app()


def prepare_supervisor(settings: Settings) -> None:
    """Load, once and before forking, what every worker would otherwise load for itself."""
    global _app
    from service.api.app import create_app
    from service.graph.configured import load_configured_graph

    _app = create_app(settings)
    graph = load_configured_graph(
        settings.graph_path, settings.snapshot_directory, settings.nodes_path
    )
    _compile_for(graph)  # its operator runs the kernels' warm-up, then the engine's
    del graph  # the workers map the snapshot themselves (and follow the recorded version)
    if threading.active_count() != 1:  # pragma: no cover - would make fork unsafe
        raise RuntimeError("the supervisor started a thread before forking its workers")
    gc.collect()
    gc.freeze()
    _release_free_heap()


def _release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``) so that no
    worker inherits them; a no-op where there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _compile_for(graph: Graph) -> None:
    """Run the walk operator's kernels once on this graph's own (read-only, mapped) arrays,
    so that numba compiles, here and once, the variants the workers will call."""
    op = WalkOperator(graph, threads=1)  # one thread: no pool, no thread started
    width = 2
    x = np.zeros((graph.n, width))
    op.apply(x[:, 0].copy())
    op.apply(x)
    op.fused_step(
        x,
        seeds=np.zeros(width, dtype=np.int64),
        betas=np.full(width, 0.5),
        etas=np.full(width, 1e-7),
        personalized=np.array([True, False]),
    )
    warm_engine(graph, op)  # the block engine's own variants (noise, gather), both modes
    hold_out.warm_up()  # blended's hold-out check
    ranking_kernels.warm_up()  # the count rankings' compiled steps (blended, lazy top-k)


def fork_workers() -> bool:
    """Make uvicorn's multiprocess manager fork its workers (see the module docstring).

    This replaces ``uvicorn.supervisors.multiprocess.get_subprocess``, which is not uvicorn's
    public API. If the installed uvicorn has no such hook, nothing is replaced, a warning says
    so and ``False`` is returned: the workers are then spawned as before (each still maps the
    graph snapshot the supervisor wrote, but imports and compiles on its own)."""
    try:
        from uvicorn import _subprocess
        from uvicorn.supervisors import multiprocess

        _subprocess.subprocess_started  # noqa: B018 - the hook's target must exist
        multiprocess.get_subprocess  # type: ignore[attr-defined]  # noqa: B018
    except (ImportError, AttributeError) as exc:
        log.warning(
            "this uvicorn offers no hook to fork workers (%s): workers are spawned, each "
            "mapping the graph snapshot but importing and compiling on its own",
            exc,
        )
        return False

    def forked_subprocess(
        config: Any, target: Callable[..., None], sockets: list[socket]
    ) -> multiprocessing.process.BaseProcess:
        kwargs = {"config": config, "target": _with_default_signals(target),
                  "sockets": sockets, "stdin_fileno": None}  # fmt: skip
        return _FORK.Process(target=_subprocess.subprocess_started, kwargs=kwargs)

    multiprocess.get_subprocess = forked_subprocess  # type: ignore[attr-defined,assignment]
    return True


def _with_default_signals(target: Callable[..., None]) -> Callable[..., None]:
    """``target`` run after undoing the supervisor's signal handlers, which a forked child
    inherits (uvicorn's server installs its own for SIGINT and SIGTERM)."""

    def run(sockets: list[socket] | None = None) -> None:
        for number in _SUPERVISOR_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        target(sockets=sockets)

    return run


_SUPERVISOR_SIGNALS = [
    getattr(signal, f"SIG{name}")
    for name in ["TERM", "HUP", "QUIT", "TTIN", "TTOU", "USR1", "USR2", "WINCH"]
    if hasattr(signal, f"SIG{name}")
]
