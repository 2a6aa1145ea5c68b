"""``python -m service.cache.prefix_table_builder``: the one process of a machine that writes
a graph's prefix tables, in the background, at the lowest CPU priority.

A serving process starts it (:class:`service.serving.prefix_tables.SharedPrefixTables`) after
winning the graph's build lock, and hands it that lock (``--lock-fd``): the lock is held until
this process exits, so no other worker starts a second builder meanwhile. It maps the graph
the same way the workers do (its snapshot), checks that it is the graph the tables are for,
and writes the tables in the order given. It stops when its parent is gone (it checks after
every block of seeds) or on SIGTERM; an unfinished table is never renamed into place.

SIGTERM only records the request; the build loop acts on it after the block of seeds in hand,
by raising :class:`SystemExit`. Raising from the handler itself would be unreliable: Python
runs a handler between any two bytecodes, also inside a finalizer or a weakref callback, where
an exception is printed and dropped, and the builder would go on to finish its table.

Once it has unwound (the temporary file removed), it exits at once, without the interpreter's
teardown: that teardown costs about half a CPU second (numba's and llvmlite's finalizers),
which at nice 19 on a busy machine is many seconds of waiting, so a stopped builder would
outlast its worker's grace period and be SIGKILLed. A SIGTERM is acted on within one block
of 64 seeds (a table is n x n floats, so n, and with it a block, stays small: about 60 ms at
n = 3,000).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from service.cache.prefix_table_file import TableSpec, build_tables, graph_fingerprint
from service.graph.demo import DEMO_SOURCE

log = logging.getLogger("service.cache.prefix_table_builder")

#: Exit status when the graph found is not the one the tables are for (it changed meanwhile).
EXIT_OTHER_GRAPH = 3
#: Exit status when the parent went away (nobody waits for the tables).
EXIT_ORPHANED = 4


def command(
    source: str,
    snapshot_dir: Path,
    fingerprint: str,
    specs: list[TableSpec],
    lock_fd: int,
    nodes: Path | None = None,
) -> list[str]:
    """The command line that builds ``specs`` (``source``: the graph file, or the demo;
    ``nodes``: the node list it is served with)."""
    return [
        sys.executable, "-m", "service.cache.prefix_table_builder",
        "--graph", source, "--snapshot-dir", str(snapshot_dir), "--fingerprint", fingerprint,
        "--specs", json.dumps([spec.__dict__ for spec in specs]), "--lock-fd", str(lock_fd),
        "--parent", str(os.getpid()),
        *(["--nodes", str(nodes)] if nodes is not None else []),
    ]  # fmt: skip


#: The signal that asked this process to stop, once one has (set by :func:`_stop`).
_stop_signal: int | None = None


def _stop(signum: int, frame: FrameType | None) -> None:
    global _stop_signal
    _stop_signal = signum


def _stop_if_asked() -> None:
    """Unwind (the temporary file is removed) if a SIGTERM has arrived."""
    if _stop_signal is not None:
        raise SystemExit(128 + _stop_signal)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefix_table_builder", description=__doc__)
    parser.add_argument("--graph", required=True, help=f"edge-list file, or {DEMO_SOURCE!r}")
    parser.add_argument("--snapshot-dir", type=Path, required=True)
    parser.add_argument("--nodes", type=Path, default=None, help="node-list file")
    parser.add_argument("--fingerprint", required=True)
    parser.add_argument("--specs", required=True, help="JSON list of table specs, in order")
    parser.add_argument("--lock-fd", type=int, help="the build lock (held until exit)")
    parser.add_argument("--parent", type=int, help="stop when this process is gone")
    args = parser.parse_args(argv)
    os.nice(19)  # only this process: the workers keep their priority
    signal.signal(signal.SIGTERM, _stop)
    from service.logs import configure_logging

    configure_logging()  # the settings of the worker that started it (its environment)
    from service.graph.configured import load_configured_graph

    source = None if args.graph == DEMO_SOURCE else Path(args.graph)
    graph = load_configured_graph(source, args.snapshot_dir, args.nodes)
    if graph_fingerprint(graph) != args.fingerprint:
        log.warning("prefix tables not built: %s no longer holds the graph served", args.graph)
        return EXIT_OTHER_GRAPH
    specs = [TableSpec(**spec) for spec in json.loads(args.specs)]
    _stop_if_asked()  # asked while the graph was loading

    def after_block(done: int) -> None:
        _stop_if_asked()
        if args.parent is not None and os.getppid() != args.parent:
            raise SystemExit(EXIT_ORPHANED)

    build_tables(graph, specs, args.snapshot_dir, after_block=after_block)
    return 0


def run(argv: list[str] | None = None) -> NoReturn:
    """:func:`main`, then exit with its status without the interpreter's teardown (logs and
    standard streams flushed first)."""
    try:
        status: object = main(argv)
    except SystemExit as exc:
        status = exc.code
    logging.shutdown()
    if not (status is None or isinstance(status, int)):
        print(status, file=sys.stderr)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status or 0)


if __name__ == "__main__":  # pragma: no cover - run as a subprocess
    run()
