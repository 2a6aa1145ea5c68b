"""Where blocks of seeds run: a process pool on this machine (``local``) or a Ray cluster (``ray``).

Both take the run's blocks, keep a bounded number in flight, and yield each block's result as it
completes (so results stream to the sink), or a :class:`BlockFailure` once a block has failed
``retries + 1`` times. A retried block runs again from its first seed: its seeds already stored
are replayed from the ledger, and the charges its dead attempt left admitted are refunded
first (:mod:`service.batch.worker`), so no seed is charged twice.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from service.batch.lifetime import die_with_driver
from service.batch.ray_reaper import Reaper
from service.batch.shared_graph import SharedGraph, graph_from_shared
from service.batch.spec import BatchSpec, BlockFailure, BlockResult
from service.batch.worker import answerer_for
from service.errors import ServiceError
from service.graph.model import Graph

log = logging.getLogger(__name__)

Block = tuple[int, list[str]]
Outcome = BlockResult | BlockFailure


class Engine(Protocol):
    name: str

    def run(self, spec: BatchSpec, graph: Graph, blocks: list[Block]) -> Iterator[Outcome]: ...


@dataclass
class BlockAttempts:
    retries: int
    counts: dict[int, int] = field(default_factory=dict)

    def failed(self, block: Block, error: str, queue: deque[Block]) -> BlockFailure | None:
        """Requeue ``block`` for another attempt, or give it up (returned)."""
        index = block[0]
        self.counts[index] = self.counts.get(index, 0) + 1
        log.warning("batch block %d failed (attempt %d): %s", index, self.counts[index], error)
        if self.counts[index] <= self.retries:
            queue.append(block)
            return None
        return BlockFailure(index, block[1], error, self.counts[index])


# -- local: a process pool -------------------------------------------------------------------------

_local_graphs: dict[tuple[str | None, str], Graph] = {}


def _local_block(spec: BatchSpec, index: int, nodes: list[str]) -> BlockResult:
    """Runs in a pool process: load the run's graph once, then answer the block."""
    key = (spec.graph_path, spec.graph_version)
    graph = _local_graphs.get(key)
    if graph is None:
        from service.graph.configured import load_configured_graph

        graph = load_configured_graph(
            Path(spec.graph_path) if spec.graph_path else None,
            nodes_path=spec.settings.nodes_path,
        )
        _local_graphs.clear()
        _local_graphs[key] = graph
    return answerer_for(spec, graph).answer_block(spec, index, nodes)


def pool_context() -> multiprocessing.context.BaseContext:
    """How pool processes start: forked from multiprocessing's fork server, a fresh interpreter
    this driver starts once (not a fork of the driver, so nothing of the driver is shared) that
    imports this module, and with it everything a block needs, before it forks. A pool process
    is then ready in milliseconds, where a spawned one imports the service anew (one to two
    CPU seconds each, paid again by every fresh pool after a worker died). The fork server ends
    once the driver and every pool process have ended (each holds the end of the pipe the
    server waits on), and the pool processes end with the driver
    (:func:`service.batch.lifetime.die_with_driver`). Spawned where the platform has no fork
    server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # used by the fork server this driver starts
    return context


class LocalEngine:
    """Blocks on a pool of ``workers`` processes (forked from a fork server, so nothing of the
    driver is shared; :func:`pool_context`).

    Every process loads the graph file itself (memory: one graph per process) and checks that
    its version is the run's. A process that dies breaks the pool: the blocks in flight are
    retried on a fresh pool.
    """

    name = "local"

    def __init__(self, *, workers: int | None = None, retries: int = 3) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.retries = retries

    def run(self, spec: BatchSpec, graph: Graph, blocks: list[Block]) -> Iterator[Outcome]:
        queue: deque[Block] = deque(blocks)
        attempts = BlockAttempts(self.retries)
        context = pool_context()
        while queue:
            pool = ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                initializer=die_with_driver,  # a killed driver takes its pool with it
                initargs=(os.getpid(),),
            )
            finished = False
            try:
                yield from self._run_pool(pool, spec, queue, attempts)
                finished = True
            finally:
                if finished:
                    pool.shutdown(wait=True)
                else:  # the driver is stopping (an error, a signal, Ctrl-C): no more answers
                    _stop_now(pool)

    def _run_pool(
        self,
        pool: ProcessPoolExecutor,
        spec: BatchSpec,
        queue: deque[Block],
        attempts: BlockAttempts,
    ) -> Iterator[Outcome]:
        in_flight: dict[Future[BlockResult], Block] = {}
        broken = False
        while (queue or in_flight) and not broken:
            while queue and len(in_flight) < 2 * self.workers:
                block = queue.popleft()
                try:
                    in_flight[pool.submit(_local_block, spec, *block)] = block
                except BrokenProcessPool:  # a worker died meanwhile: this block never ran
                    queue.appendleft(block)
                    broken = True
                    break
            if broken:
                break
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                block = in_flight.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool:
                    broken = True
                    lost = attempts.failed(block, "a worker process died", queue)
                    if lost is not None:
                        yield lost
                except Exception as exc:
                    lost = attempts.failed(block, _describe(exc), queue)
                    if lost is not None:
                        yield lost
        if broken:  # every other block in flight went down with the pool
            for future, block in in_flight.items():
                if future.done() and future.exception() is None:
                    yield future.result()
                    continue
                lost = attempts.failed(block, "a worker process died", queue)
                if lost is not None:
                    yield lost
            pool.shutdown(wait=True, cancel_futures=True)


def _stop_now(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's processes and drop its queued work, without waiting for blocks in flight.

    A seed killed mid-answer leaves at most its charge admitted, never a release: the next run
    with the same run id refunds it (:mod:`service.batch.worker`).
    """
    processes: dict[int, Any] = dict(getattr(pool, "_processes", None) or {})
    for process in processes.values():
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


# -- ray -------------------------------------------------------------------------------------------


def _ray_block(shared: SharedGraph, spec: BatchSpec, index: int, nodes: list[str]) -> BlockResult:
    """Runs as a Ray task: the graph arrives from the object store as read-only views."""
    return answerer_for(spec, graph_from_shared(shared)).answer_block(spec, index, nodes)


class RayEngine:
    """Blocks as Ray tasks on a cluster (``address``) or on a local instance started here.

    The graph is put into the object store once; each task takes a block and returns its
    outcomes to this process, which writes them to the sink as tasks complete. Ray retries a
    task whose worker died or that raised (``retries`` times), without double charges (see
    :mod:`service.batch.worker`).
    """

    name = "ray"

    def __init__(
        self, *, address: str | None = None, workers: int | None = None, retries: int = 3
    ) -> None:
        self.address = address
        self.workers = workers
        self.retries = retries
        self._reaper: Reaper | None = None

    def _connect(self) -> bool:
        """Connect (or start a local instance); True if this call started Ray here."""
        try:
            import ray
        except ImportError as exc:
            raise RayUnavailable(
                "Ray is not installed: pip install 'dp-ppr-service[ray]' (make install does)"
            ) from exc

        if ray.is_initialized():
            return False
        if self.address is None:
            # the instance's processes end within a second of this driver, however it ends
            # (service/batch/ray_reaper.py)
            if Reaper.supported():
                self._reaper = Reaper()
            try:
                ray.init(
                    address="local",  # a fresh instance, never someone else's
                    num_cpus=self.workers or os.cpu_count() or 1,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    configure_logging=False,
                )
                if self._reaper is not None:
                    self._reaper.watch_started_processes()
            except BaseException:
                self._close_reaper()
                raise
        else:
            try:
                ray.init(
                    address=self.address, logging_level=logging.WARNING, configure_logging=False
                )
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise RayUnavailable(
                    f"cannot join the Ray cluster at {self.address!r}: {exc}. Start one with "
                    "'ray start --head' or leave --address out to start a local instance"
                ) from exc
        return True

    def run(self, spec: BatchSpec, graph: Graph, blocks: list[Block]) -> Iterator[Outcome]:
        started = self._connect()
        import ray

        try:
            yield from self._run(ray, spec, graph, blocks)
        finally:
            if started:
                try:
                    ray.shutdown()
                finally:
                    self._close_reaper()

    def _close_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    def _run(
        self, ray: Any, spec: BatchSpec, graph: Graph, blocks: list[Block]
    ) -> Iterator[Outcome]:
        shared = ray.put(SharedGraph.of(graph))
        spec_ref = ray.put(spec)
        task = ray.remote(_ray_block).options(
            num_cpus=1, max_retries=self.retries, retry_exceptions=True
        )
        cpus = int(ray.cluster_resources().get("CPU", 1))
        limit = max(2, 2 * cpus)
        queue: deque[Block] = deque(blocks)
        in_flight: dict[Any, Block] = {}
        lost_component = _system_errors(ray)
        while queue or in_flight:
            while queue and len(in_flight) < limit:
                block = queue.popleft()
                in_flight[task.remote(shared, spec_ref, *block)] = block
            try:
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=RAY_WATCH_SECONDS)
            except lost_component as exc:
                raise RayComponentLost(_lost_component_message(ray, exc)) from exc
            _check_local_processes(ray)
            for ref in ready:
                index, nodes = in_flight.pop(ref)
                try:
                    yield ray.get(ref)
                except lost_component as exc:
                    raise RayComponentLost(_lost_component_message(ray, exc)) from exc
                except Exception as exc:  # every retry failed (RayTaskError, WorkerCrashedError)
                    yield BlockFailure(index, nodes, _describe(exc), self.retries + 1)


#: Seconds between two looks at the local Ray instance's processes while blocks run.
RAY_WATCH_SECONDS = 1.0

_RESUME = "the run stops; rerun with the same --run-id to resume (nothing is charged twice)"


def _system_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean a part of Ray itself is gone (not a task or its worker)."""
    names = ("LocalRayletDiedError", "NodeDiedError", "RaySystemError", "OwnerDiedError")
    found = (getattr(ray.exceptions, name, None) for name in names)
    return tuple(cls for cls in found if isinstance(cls, type))


def _local_node(ray: Any) -> Any:
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    return getattr(worker, "_global_node", None)


#: Parts of a local Ray instance without which no task can run or return (a log monitor or a
#: dashboard that exits does not stop the run).
ESSENTIAL_RAY_PROCESSES = frozenset({"raylet", "gcs_server"})


def _dead_local_processes(ray: Any, *, essential_only: bool = False) -> list[str]:
    """The processes of the local Ray instance that have exited, by name and pid (empty when
    the driver joined a cluster: its processes are not ours to watch)."""
    node = _local_node(ray)
    if node is None or not hasattr(node, "dead_processes"):
        return []
    try:
        dead = node.dead_processes()
    except Exception:  # pragma: no cover - Ray's internals changed: nothing to report
        return []
    return [
        f"{kind} (pid {process.pid})"
        for kind, process in dead
        if kind in ESSENTIAL_RAY_PROCESSES or not essential_only
    ]


def _check_local_processes(ray: Any) -> None:
    if _dead_local_processes(ray, essential_only=True):
        dead = _dead_local_processes(ray)
        raise RayComponentLost(
            f"Ray's {', '.join(dead)} of the local instance exited; {_RESUME}{_logs_hint(ray)}"
        )


def _lost_component_message(ray: Any, exc: BaseException) -> str:
    dead = _dead_local_processes(ray)
    what = {
        "LocalRayletDiedError": "the raylet (Ray's node manager) on this machine died",
        "NodeDiedError": "a Ray node died",
        "OwnerDiedError": "the owner of a Ray object died",
    }.get(type(exc).__name__, f"Ray failed ({_describe(exc)})")
    if dead:
        what += f" (exited: {', '.join(dead)})"
    return f"{what}; {_RESUME}{_logs_hint(ray)}"


def _logs_hint(ray: Any) -> str:
    node = _local_node(ray)
    logs = getattr(node, "get_logs_dir_path", None)
    try:
        return f" (Ray's logs: {logs()})" if callable(logs) else ""
    except Exception:  # pragma: no cover
        return ""


class RayComponentLost(ServiceError):
    """A part of Ray (the raylet, a node, the GCS) went away during the run."""

    code = "ray_component_lost"
    status = 503


class RayUnavailable(ServiceError):
    code = "ray_unavailable"
    status = 503
    exit_code = 2


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


def make_engine(
    name: str, *, workers: int | None, retries: int, address: str | None = None
) -> Engine:
    if name == "ray":
        return RayEngine(address=address, workers=workers, retries=retries)
    return LocalEngine(workers=workers, retries=retries)
