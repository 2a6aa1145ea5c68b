"""What one service process holds: settings, the graph, the ledger, the caches, the query path.

Built once at start-up (the app's lifespan) and torn down at shutdown. Nothing here knows about
HTTP, so a batch job can build the same runtime and call ``queries.answer`` directly.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.cache.caches import Caches, build_caches
from service.config import Settings
from service.embeddings.similar import SimilarIndexHolder
from service.graph.model import Graph
from service.ledger.ledger import Ledger, LedgerUnavailable
from service.ledger.records import GraphCap
from service.mechanisms.engine import DiffusionEngine
from service.serving.batch import BatchQueryService
from service.serving.coalescer import QueryCoalescer
from service.serving.embedding_query import EmbeddingQueryService
from service.serving.graph_holder import GraphHolder
from service.serving.graph_identity import serving_loader
from service.serving.limits import EngineGate, RateLimiter
from service.serving.ppr_query import PprQueryService, build_ppr_query_service
from service.serving.prefix_tables import SharedPrefixTables
from service.serving.rankings import DegreeReleases
from service.serving.reconciler import Reconciler
from service.serving.sandbox import SandboxQueries, SandboxRules, synthetic_release_of
from service.synthetic.jobs import SynthesisRunner

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    graphs: GraphHolder
    ledger: Ledger
    caches: Caches
    queries: PprQueryService
    batch: BatchQueryService
    reconciler: Reconciler | None = None
    coalescer: QueryCoalescer | None = None  # None: each single query on its own thread
    limiter: RateLimiter = field(default_factory=lambda: RateLimiter(0, 1))
    gate: EngineGate = field(default_factory=lambda: EngineGate(16, 512, 30.0))
    similar: SimilarIndexHolder | None = None  # the all-node embedding release's index
    synthesis: SynthesisRunner = field(init=False)
    embeddings: EmbeddingQueryService = field(init=False)
    #: Set when this worker serves a synthetic release as a sandbox (its answers exact, the
    #: release charged once to each account that receives one).
    sandbox: SandboxQueries | None = None

    def __post_init__(self) -> None:
        self.synthesis = synthesis_runner(self.settings, self.ledger, self.queries.degree_releases)
        self.embeddings = EmbeddingQueryService(self.queries, self.settings)

    def start_background(self) -> None:
        self.reconciler = Reconciler(
            self.ledger,
            older_than_seconds=self.settings.reconcile_after_seconds,
            interval_seconds=self.settings.reconcile_interval_seconds,
        )
        self.reconciler.start()

    def close(self) -> None:
        if self.reconciler is not None:
            self.reconciler.stop()
        self.synthesis.close()
        self.limiter.close()
        self.batch.close()
        self.queries.live.close()
        self.queries.engine.close()
        if self.queries.prefixes.tables is not None:
            self.queries.prefixes.tables.close()
        self.ledger.dispose()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when the graph is loaded and the ledger answers; a degraded cache is reported
        but does not make the process unready (answers and charges do not depend on it)."""
        loaded = self.graphs.loaded
        database_ok = self.ledger.ping()
        cache_state = self.caches.state()
        checks: dict[str, Any] = {
            "graph": {
                "status": "ok",
                "version": loaded.graph.version,
                "source": loaded.source,
                "node_set": node_set_origin(self.settings, loaded.source),
            }
            if loaded is not None
            else {"status": "not_loaded"},
            "database": {"status": "ok" if database_ok else "unreachable"},
            "cache": cache_state,
        }
        tables = self.queries.prefixes.tables
        if tables is not None:
            checks["prefix_table"] = tables.state()
        return loaded is not None and database_ok, checks


def sandbox_for(settings: Settings, ledger: Ledger) -> SandboxQueries | None:
    """The sandbox with ``PPR_GRAPH_IS_SYNTHETIC`` (a graph file the ledger does not know as a
    synthetic release: NotASyntheticRelease and the worker does not start), else None."""
    if not settings.graph_is_synthetic:
        return None
    job = synthetic_release_of(settings.graph_path, ledger, required=True)
    assert job is not None
    log.warning(
        "serving the synthetic release %s as a sandbox: every answer is marked synthetic, and "
        "each account that receives one pays for the release once", job.release_name,
    )  # fmt: skip
    rules = SandboxRules.from_settings(settings)
    return SandboxQueries(ledger, job, beta=settings.beta, rules=rules)


def synthesis_runner(
    settings: Settings, ledger: Ledger, releases: DegreeReleases
) -> SynthesisRunner:
    """This worker's synthesis job runner (``chung_lu`` reads the service's degree release)."""
    from service.mechanisms.randomness import fresh_generator
    from service.serving.rankings import degree_release_name

    def degrees(graph: Graph, cap: GraphCap | None) -> tuple[Any, str]:
        return releases.get(graph, cap).values, degree_release_name(releases.plan.scale)

    return SynthesisRunner(ledger, settings, degrees, fresh_generator)


def node_set_origin(settings: Settings, source: str) -> str:
    """Where the served node set comes from: ``listed`` (PPR_NODES_PATH), ``fixed`` (the demo
    graph's ids 0..n-1), or ``derived_from_edges`` (no node list: the node set is public)."""
    if settings.nodes_path is not None:
        return "listed"
    return "fixed" if source == "demo" else "derived_from_edges"


def open_ledger(settings: Settings, *, wait_seconds: float | None = None) -> Ledger:
    """Open the ledger, waiting up to ``wait_seconds`` (default
    ``ledger_connect_timeout_seconds``) while its database does not answer; then
    ``LedgerUnavailable``. An un-migrated ledger or one on another order grid is refused at once.
    """
    wait = settings.ledger_connect_timeout_seconds if wait_seconds is None else wait_seconds
    deadline = time.monotonic() + wait
    pause = 0.25
    while True:
        ledger: Ledger | None = None
        try:
            ledger = Ledger.from_url(
                settings.database_url,
                auto_migrate=settings.auto_migrate,
                ping_idle_seconds=settings.ledger_ping_idle_seconds,
            )
            _ = ledger.ledger_id  # read once now, while the database answers
            ledger.accounts.default_period = settings.default_budget_period
            return ledger
        except LedgerUnavailable as exc:
            if ledger is not None:
                ledger.dispose()
            if time.monotonic() + pause > deadline:
                raise
            log.warning("the ledger database does not answer; retrying: %s", exc)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


class RuntimeStarter:
    """Builds a worker's runtime so that a database outage never stops the worker.

    :meth:`start` waits up to ``ledger_connect_timeout_seconds`` for the ledger. If it still
    does not answer, the worker starts serving without a runtime (requests that need one get
    503 ``ledger_unavailable``, ``/readyz`` says not ready, ``/healthz`` stays up) and a
    background thread keeps building it, with backoff up to ``MAX_PAUSE_SECONDS``, for as
    long as the outage lasts; ``on_ready`` receives it when it is built. A failure that is not
    an outage (an un-migrated ledger, an unreadable graph) is a real one: it is logged,
    remembered in :attr:`failure`, and ``on_failure`` is called to stop the process.
    """

    MAX_PAUSE_SECONDS = 5.0

    def __init__(
        self,
        settings: Settings,
        *,
        on_ready: Callable[[Runtime], None],
        on_failure: Callable[[BaseException], None],
        on_cache_event: Any = None,
    ) -> None:
        self.settings = settings
        self.on_ready = on_ready
        self.on_failure = on_failure
        self.on_cache_event = on_cache_event
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> Runtime | None:
        """The runtime, or None when the ledger did not answer in time (then retried)."""
        try:
            return build_runtime(self.settings, on_cache_event=self.on_cache_event)
        except LedgerUnavailable as exc:
            log.warning(
                "the ledger database did not answer within %g s (PPR_LEDGER_CONNECT_TIMEOUT_"
                "SECONDS): serving 503 ledger_unavailable and retrying in the background: %s",
                self.settings.ledger_connect_timeout_seconds, exc,
            )  # fmt: skip
        self._thread = threading.Thread(target=self._retry, name="runtime-starter", daemon=True)
        self._thread.start()
        return None

    def _retry(self) -> None:
        pause = 0.5
        while not self._stop.wait(pause):
            try:
                runtime = build_runtime(
                    self.settings, on_cache_event=self.on_cache_event, wait_seconds=0.0
                )
            except LedgerUnavailable:
                pause = min(pause * 2, self.MAX_PAUSE_SECONDS)
                continue
            except BaseException as exc:
                log.exception("the runtime cannot be built: stopping this worker")
                self.failure = exc
                self.on_failure(exc)
                return
            with self._lock:
                if self._stop.is_set():
                    runtime.close()
                    return
                log.info("the ledger database answers again: serving")
                self.on_ready(runtime)
            return

    def stop(self) -> None:
        """Stop retrying (at shutdown); a runtime built meanwhile is closed, not handed over."""
        with self._lock:
            self._stop.set()


def build_runtime(
    settings: Settings, *, on_cache_event: Any = None, wait_seconds: float | None = None
) -> Runtime:
    """Open the ledger (refusing an un-migrated one; see :func:`open_ledger` for
    ``wait_seconds``), build the caches, load the graph."""
    ledger = open_ledger(settings, wait_seconds=wait_seconds)
    tables: SharedPrefixTables | None = None
    try:
        # Keys live under the ledger's own id: account ids are per ledger, so two ledgers (or a
        # restored one) sharing a Redis never see each other's replays.
        caches = build_caches(settings, namespace=ledger.ledger_id, on_event=on_cache_event)

        def remember_degrees(graph: Graph) -> None:
            caches.degrees.put(graph.version, graph.degrees)

        sandbox = sandbox_for(settings, ledger)
        snapshot_dir = settings.snapshot_directory
        graphs = GraphHolder(
            settings.graph_path,
            loader=serving_loader(settings, ledger.graph_versions),
            on_load=remember_degrees,
            # a sandbox neither records its graph as the service's current one nor follows it
            versions=ledger.graph_versions
            if settings.graph_version_check_ms > 0 and sandbox is None
            else None,
            check_seconds=settings.graph_version_check_ms / 1000.0,
        )
        graphs.start()  # records its version (or follows the recorded one): workers agree
        if node_set_origin(settings, graphs.source) == "derived_from_edges":
            # serve warns once, naming where the node count shows; each worker says it at info
            log.info(
                "the node set is derived from the edges (no PPR_NODES_PATH): it is public "
                "(docs/privacy.md, 'The node set')"
            )
        tables = SharedPrefixTables(
            snapshot_dir, settings.prefix_table_bytes, settings, lambda: graphs.served,
            on_event=on_cache_event,
        )  # fmt: skip
        tables.follow(now=True)  # maps the tables, or starts their builder, in a thread
        engine = DiffusionEngine(
            settings.engine_max_batch, window_seconds=settings.engine_batch_window_ms / 1000.0
        )
        queries = build_ppr_query_service(
            settings,
            graphs=graphs,
            ledger=ledger,
            caches=caches,
            create_seed_accounts=settings.create_seed_accounts,
            group_commit=True,
            prefix_tables=tables,
            engine=engine,
        )
        limiter = RateLimiter(
            settings.rate_limit_per_second,
            settings.rate_limit_burst,
            redis_url=settings.redis_url,
            namespace=ledger.ledger_id,
        )
    except BaseException:
        if tables is not None:
            tables.close()
        ledger.dispose()
        raise
    gate = EngineGate(
        settings.engine_concurrency, settings.engine_queue, settings.engine_queue_timeout_seconds
    )
    batch = BatchQueryService(queries, concurrency=settings.batch_concurrency)
    coalescer = None
    if settings.query_groups_in_flight > 0:
        coalescer = QueryCoalescer(
            lambda reqs, on_ready: queries.answer_many(reqs, batch.run_all, on_ready),
            max_group=settings.ledger_group_max,
            groups_in_flight=settings.query_groups_in_flight,
            gather_seconds=settings.query_group_gather_ms / 1000.0,
        )
    similar = SimilarIndexHolder(
        settings.embedding_release_dir,
        release_is_live=lambda version, name: (
            ledger.graph_releases.graph_release_state(version, name) == "released"
        ),
    )
    return Runtime(
        settings, graphs, ledger, caches, queries, batch,
        limiter=limiter, gate=gate, coalescer=coalescer, sandbox=sandbox, similar=similar,
    )  # fmt: skip


def stop_this_process() -> None:
    """Stop this server process as SIGTERM does: its server shuts down gracefully, then the
    signal ends the process (a non-zero status; uvicorn's supervisor starts a new worker,
    whose start-up meets the same failure at once and stops the server with status 3)."""
    os.kill(os.getpid(), signal.SIGTERM)
