"""The driver of a batch run: check everything, run the blocks, stream answers to the sink.

Order of a run: load the graph (its version pins the run) -> open the ledger -> resolve the
principal (the service account, checked against its scopes) -> read and check the seeds ->
open the sink -> audit ``batch.start`` -> answer the blocks on the engine, writing each block's
answers to the sink as it completes -> refund what blocks that failed on every attempt left
admitted -> close the sink -> audit ``batch.finish`` with the counts. Every bad input is
reported before anything is charged.
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from service.batch.engines import Block, Engine, make_engine
from service.batch.sinks import RunInfo, Sink, open_sink
from service.batch.spec import (
    BUDGET_CODES,
    NO_ACCOUNT_CODE,
    BatchSpec,
    BlockFailure,
    BlockResult,
    FailureInjection,
    Output,
    SeedOutcome,
    check_run_id,
)
from service.batch.worker import refund_dead_charges
from service.config import Settings
from service.embeddings.release import DP_IE
from service.errors import Forbidden, InvalidParameter
from service.graph.configured import load_configured_graph
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import ModeNotAllowed, UnknownAccount
from service.privacy.modes import Mode
from service.serving.graph_identity import as_served
from service.serving.refresh import parse_refresh
from service.serving.schemas import Principal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchOptions:
    """One run, as the command line (or a test) describes it."""

    sink: str
    mode: Mode = Mode.PERSONALIZED
    epsilon: float | None = None  # None: PPR_DEFAULT_EPSILON
    mechanism: str | None = None  # None: the served default (PPR_DEFAULT_MECHANISM for the mode)
    k: int | None = None  # None: PPR_DEFAULT_K
    accounts_file: Path | None = None  # None with all_accounts: every user account
    all_accounts: bool = False
    graph_path: Path | None = None  # None: PPR_GRAPH_PATH, else the demo graph
    run_id: str | None = None  # None: a new run id
    service_account_id: int | None = None
    create_missing_accounts: bool = False
    fresh: bool = False
    refresh: str | None = None  # the refresh policy (service.serving.refresh); None: the default
    exclude_neighbors: bool = False
    engine: str = "local"
    address: str | None = None
    workers: int | None = None
    block_size: int = 64
    retries: int = 3
    settings: Settings | None = None  # None: from the environment
    progress: bool | None = None  # None: a bar when stderr is a terminal
    #: ``embeddings``: a DP-IE embedding per seed (k: PPR_EMBEDDING_DEFAULT_K, sigma:
    #: PPR_EMBEDDING_DEFAULT_SIGMA unless given) instead of a ranking.
    output: Output = "rankings"
    sigma: float | None = None
    failure: FailureInjection | None = field(default=None, compare=False)  # TEST ONLY


@dataclass
class BatchSummary:
    run_id: str
    graph_version: str
    engine: str
    mode: str
    epsilon: float
    sink: str
    seeds: int = 0
    mechanism: str = ""
    output: str = "rankings"
    k: int = 0  # results per seed, or the embeddings' dimension
    sigma: float = 0.0  # embeddings: PushFlowCap's sigma
    refresh: str = "on_new_version"  # the refresh policy (service.serving.refresh)
    answered: int = 0  # a new release, charged in this run
    replayed: int = 0  # a stored release (this run's, or an identical earlier query's): free
    skipped_budget: int = 0
    skipped_no_account: int = 0
    failed: int = 0
    epsilon_charged: float = 0.0
    reconciled: int = 0  # admitted charges of dead attempts or failed seeds, refunded
    worker_cpu_seconds: float = 0.0  # CPU time the workers spent on the blocks that completed
    setup_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)  # error code -> seeds
    skipped: dict[str, int] = field(default_factory=dict)  # error code -> seeds

    @property
    def seeds_per_second(self) -> float:
        done = self.answered + self.replayed + self.skipped_budget + self.skipped_no_account
        done += self.failed
        return done / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    @property
    def seeds_per_cpu_second(self) -> float:
        """Seeds answered or replayed per second of worker CPU: seeds/s per fully used core."""
        done = self.answered + self.replayed
        return done / self.worker_cpu_seconds if self.worker_cpu_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seeds_per_second"] = self.seeds_per_second
        data["seeds_per_cpu_second"] = self.seeds_per_cpu_second
        return data

    def add(self, outcome: SeedOutcome) -> None:
        if outcome.status == "answered":
            self.answered += 1
        elif outcome.status == "replayed":
            self.replayed += 1
        elif outcome.status == "skipped":
            code = outcome.code or "skipped"
            self.skipped[code] = self.skipped.get(code, 0) + 1
            if code in BUDGET_CODES:
                self.skipped_budget += 1
            else:
                self.skipped_no_account += 1
        else:
            code = outcome.code or "failed"
            self.failures[code] = self.failures.get(code, 0) + 1
            self.failed += 1
        self.epsilon_charged = math.fsum([self.epsilon_charged, outcome.epsilon_charged])


def new_run_id() -> str:
    return f"run-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def read_seeds(path: Path) -> list[str]:
    """Node ids, one per line (blank lines and ``#`` comments skipped), first occurrence kept."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidParameter("--accounts", f"no such file: {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameter("--accounts", f"cannot read {str(path)!r}: {exc}") from None
    seeds = (line.strip() for line in text.splitlines())
    found = list(dict.fromkeys(s for s in seeds if s and not s.startswith("#")))
    if not found:
        raise InvalidParameter(
            "--accounts",
            f"{str(path)!r} lists no node ids (one per line; blank lines and '#' comments are "
            "skipped)",
        )
    return found


def _user_nodes(ledger: Ledger) -> Iterator[str]:
    offset, page = 0, 5000
    while True:
        accounts = ledger.accounts.list_accounts(type="user", limit=page, offset=offset)
        for account in accounts:
            if account.node_id is not None:
                yield account.node_id
        if len(accounts) < page:
            return
        offset += page


def _service_principal(ledger: Ledger, options: BatchOptions) -> Principal | None:
    if options.service_account_id is None:
        if options.mode is Mode.EDGE:
            raise InvalidParameter(
                "--service-account",
                "edge mode charges a service account: name it (--service-account ID)",
            )
        return None
    try:
        account = ledger.accounts.get_account(options.service_account_id)
    except UnknownAccount:
        raise UnknownAccount(
            f"--service-account: account {options.service_account_id} does not exist",
            details={"account_id": options.service_account_id},
        ) from None
    if account.type != "service":
        raise InvalidParameter(
            "--service-account",
            f"account {account.account_id} is of type {account.type!r}, not a service account",
        )
    if options.mode.value not in account.modes:
        raise ModeNotAllowed(
            f"service account {account.account_id} may query in {', '.join(account.modes)} "
            f"mode only; an admin must grant {options.mode.value!r} "
            f"(accounts set-scopes {account.account_id} --modes ...)",
            details={"mode": options.mode.value, "modes": list(account.modes)},
        )
    if options.create_missing_accounts and not account.may_create_seed_accounts:
        raise Forbidden(
            f"service account {account.account_id} may not create seed users' accounts; an "
            f"admin must grant it (accounts set-scopes {account.account_id} "
            "--may-create-seed-accounts)"
        )
    return Principal(
        account_id=account.account_id,
        type="service",
        may_create_seed_accounts=account.may_create_seed_accounts,
        modes=account.modes,
        quota_epsilon=account.quota_epsilon,
    )


def _seeds(options: BatchOptions, graph: Graph, ledger: Ledger) -> tuple[list[str], int]:
    """The run's seeds (all in the graph) and how many user accounts were outside it."""
    if options.accounts_file is not None:
        seeds = read_seeds(options.accounts_file)
        for node in seeds:
            graph.index_of(node)  # unknown_node: bad input, nothing charged
        return seeds, 0
    nodes = list(dict.fromkeys(_user_nodes(ledger)))
    inside = [n for n in nodes if graph.has_node(n)]
    return inside, len(nodes) - len(inside)


def _blocks(seeds: list[str], size: int) -> list[Block]:
    return [(i, seeds[start : start + size]) for i, start in enumerate(range(0, len(seeds), size))]


class _Progress:
    def __init__(self, total: int, enabled: bool, stream: TextIO) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, unit="seed", file=stream, dynamic_ncols=True, smoothing=0.1
            )

    def update(self, summary: BatchSummary, count: int) -> None:
        if self._bar is not None:
            self._bar.set_postfix(
                answered=summary.answered + summary.replayed,
                skipped=summary.skipped_budget + summary.skipped_no_account,
                failed=summary.failed,
                refresh=False,
            )
            self._bar.update(count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_batch(
    options: BatchOptions,
    *,
    engine: Engine | None = None,
    stream: TextIO | None = None,
    on_start: Callable[[BatchSummary], None] | None = None,
) -> BatchSummary:
    """Run one batch (see the module docstring) and return its summary."""
    started = time.perf_counter()
    settings = options.settings if options.settings is not None else Settings()
    epsilon = settings.default_epsilon if options.epsilon is None else float(options.epsilon)
    k, sigma = _dimension_and_sigma(options, settings)
    run_id = check_run_id(options.run_id) if options.run_id is not None else new_run_id()
    if options.create_missing_accounts and options.mode is not Mode.PERSONALIZED:
        raise InvalidParameter(
            "--create-missing-accounts", "edge mode charges the service account, not the users"
        )
    if (options.accounts_file is None) == (not options.all_accounts):
        raise InvalidParameter("--accounts", "give either --accounts FILE or --all")
    policy = parse_refresh(options.refresh, fresh=options.fresh, name="--refresh")
    if policy.max_age_seconds is not None and options.output == "embeddings":
        raise InvalidParameter("--refresh", "max_age applies to rankings, not --output embeddings")
    mechanism = DP_IE if options.output == "embeddings" else _mechanism(options, settings)
    graph_path = options.graph_path if options.graph_path is not None else settings.graph_path
    graph = load_configured_graph(graph_path, nodes_path=settings.nodes_path)
    ledger = Ledger.from_url(settings.database_url, auto_migrate=False)
    try:
        graph = as_served(
            graph, ledger.graph_versions,
            max_degree_bound=settings.max_degree_bound,
            edge_count_bound=settings.edge_count_bound,
        )  # fmt: skip
        service = _service_principal(ledger, options)
        spec = BatchSpec(
            run_id=run_id,
            graph_version=graph.version,
            mode=options.mode,
            epsilon=epsilon,
            k=k,
            settings=settings,
            service_account=service,
            fresh=policy.always,
            max_age_seconds=policy.max_age_seconds,
            exclude_neighbors=options.exclude_neighbors,
            create_missing_accounts=options.create_missing_accounts,
            graph_path=str(graph_path.resolve()) if graph_path is not None else None,
            invocation=secrets.token_hex(4),
            mechanism=mechanism,
            mechanism_chosen=options.mechanism is not None,
            output=options.output,
            sigma=sigma,
            failure=options.failure,
        )
        _check_query(spec, graph, ledger)
        seeds, outside = _seeds(options, graph, ledger)
        info = RunInfo(run_id, graph.version, spec.mode.value, epsilon, k, options.output, sigma)
        sink = open_sink(options.sink, info)
        chosen = engine or make_engine(
            options.engine,
            workers=options.workers,
            retries=options.retries,
            address=options.address,
        )
        summary = BatchSummary(
            run_id,
            graph.version,
            chosen.name,
            spec.mode.value,
            epsilon,
            sink.description,
            seeds=len(seeds),
            mechanism=mechanism,
            output=options.output,
            k=k,
            sigma=sigma,
            refresh=str(policy),
        )
        if outside:
            summary.skipped["not_in_graph"] = outside
        actor = service.account_id if service is not None else None
        ledger.reports.record_audit(
            actor, "batch.start", details=_audit_details(spec, options, summary)
        )
        if on_start is not None:
            on_start(summary)
        try:
            _execute(spec, graph, seeds, options, chosen, sink, summary, ledger, stream, started)
        except BaseException:
            sink.abort()
            raise
        sink.close()
        ledger.reports.record_audit(
            actor,
            "batch.finish",
            details={**_audit_details(spec, options, summary), **_counts(summary)},
        )
        return summary
    finally:
        ledger.dispose()


def _dimension_and_sigma(options: BatchOptions, settings: Settings) -> tuple[int, float]:
    """k (results per seed, or the embedding's dimension) and sigma (embeddings only)."""
    if options.output != "embeddings":
        if options.sigma is not None:
            raise InvalidParameter("--sigma", "applies to --output embeddings only")
        return (settings.default_k if options.k is None else int(options.k)), 0.0
    if options.mechanism is not None:
        raise InvalidParameter(
            "--mechanism", "names a ranking; --output embeddings releases DP-IE embeddings"
        )
    if options.exclude_neighbors:
        raise InvalidParameter("--exclude-neighbors", "applies to rankings only")
    k = settings.embedding_default_k if options.k is None else int(options.k)
    sigma = settings.embedding_default_sigma if options.sigma is None else float(options.sigma)
    return k, sigma


def _mechanism(options: BatchOptions, settings: Settings) -> str:
    """The ranking the run charges for: ``--mechanism``, else what a GET without one gets."""
    from service.mechanisms.registry import resolve_mechanism

    try:
        chosen = resolve_mechanism(options.mechanism, options.mode, settings.default_mechanism)
    except InvalidParameter as exc:
        raise InvalidParameter("--mechanism", exc.message.removeprefix("mechanism: ")) from None
    return chosen.value


def _check_query(spec: BatchSpec, graph: Graph, ledger: Ledger) -> None:
    """k, epsilon and the mode's options, checked as the API checks them (nothing charged)."""
    from service.serving.graph_holder import GraphHolder
    from service.serving.ppr_query import build_ppr_query_service
    from service.serving.schemas import QueryRequest

    checker = build_ppr_query_service(
        spec.settings,
        graphs=GraphHolder(None, loader=lambda _path: graph),
        ledger=ledger,
        caches=None,  # it only checks parameters: nothing is answered
        create_seed_accounts=False,
        group_commit=False,
    )
    # asked as the run asks: its service account, or each seed's own user account
    probe = (
        Principal(account_id=0, type="service", modes=("personalized", "edge"))
        if spec.service_account is not None
        else Principal(account_id=0, type="user", node_id="", modes=("personalized", "edge"))
    )
    if spec.output == "embeddings":
        from service.serving.embedding_query import EmbeddingQueryService

        EmbeddingQueryService(checker, spec.settings).parameters(spec.k, spec.sigma, spec.epsilon)
        return
    checker.validate(
        QueryRequest(
            probe,
            "",
            spec.k,
            spec.epsilon,
            spec.mode,
            exclude_neighbors=spec.exclude_neighbors,
            mechanism=spec.mechanism,
        )
    )


def _execute(
    spec: BatchSpec,
    graph: Graph,
    seeds: list[str],
    options: BatchOptions,
    engine: Engine,
    sink: Sink,
    summary: BatchSummary,
    ledger: Ledger,
    stream: TextIO | None,
    started: float,
) -> None:
    out = stream if stream is not None else sys.stderr
    enabled = options.progress if options.progress is not None else out.isatty()
    progress = _Progress(len(seeds), enabled, out)
    failed_blocks: list[BlockFailure] = []
    compute_start = time.perf_counter()
    summary.setup_seconds = compute_start - started
    outcomes = engine.run(spec, graph, _blocks(seeds, options.block_size))
    try:
        for item in outcomes:
            if isinstance(item, BlockResult):
                sink.write([o for o in item.outcomes if o.status in ("answered", "replayed")])
                for outcome in item.outcomes:
                    summary.add(outcome)
                summary.reconciled += item.reconciled
                summary.worker_cpu_seconds += item.cpu_seconds
                progress.update(summary, len(item.outcomes))
            else:
                failed_blocks.append(item)
                for node in item.nodes:
                    summary.add(
                        SeedOutcome(node, "failed", code="block_failed", message=item.error)
                    )
                progress.update(summary, len(item.nodes))
        summary.elapsed_seconds = time.perf_counter() - compute_start
    finally:
        # A driver that stops early (an error, a signal) stops the engine now, not whenever
        # the generator is collected: no block keeps charging for answers nobody writes.
        close = getattr(outcomes, "close", None)
        if close is not None:
            close()
        progress.close()
    if failed_blocks:
        summary.reconciled += _reconcile_failed_blocks(ledger, spec, failed_blocks)


def _reconcile_failed_blocks(ledger: Ledger, spec: BatchSpec, failed: list[BlockFailure]) -> int:
    """Refund what blocks that failed on every attempt left admitted: their attempts are over,
    so those charges can never be released (and a late one would be discarded)."""
    return sum(
        refund_dead_charges(
            ledger,
            spec,
            block.nodes,
            f"batch run {spec.run_id}: block {block.index} failed on every attempt "
            f"({block.error}); nothing was released",
        )
        for block in failed
    )


def _audit_details(spec: BatchSpec, options: BatchOptions, summary: BatchSummary) -> dict[str, Any]:
    return {
        "run_id": spec.run_id,
        "graph_version": spec.graph_version,
        "mode": spec.mode.value,
        "mechanism": spec.mechanism,
        "output": spec.output,
        "epsilon": spec.epsilon,
        "k": spec.k,
        **({"sigma": spec.sigma} if spec.output == "embeddings" else {}),
        "fresh": spec.fresh,
        "refresh": summary.refresh,
        "engine": summary.engine,
        "sink": summary.sink,
        "seeds": summary.seeds,
        "principal": "service account" if spec.service_account is not None else "each seed user",
        "create_missing_accounts": spec.create_missing_accounts,
        "source": str(options.accounts_file) if options.accounts_file else "all user accounts",
    }


def _counts(summary: BatchSummary) -> dict[str, Any]:
    return {
        "answered": summary.answered,
        "replayed": summary.replayed,
        "skipped_budget": summary.skipped_budget,
        "skipped_no_account": summary.skipped_no_account,
        "failed": summary.failed,
        "epsilon_charged": summary.epsilon_charged,
        "reconciled": summary.reconciled,
        "elapsed_seconds": round(summary.elapsed_seconds, 3),
    }


def _what(summary: BatchSummary) -> str:
    if summary.output != "embeddings":
        return summary.mechanism
    return f"DP-IE embeddings ({summary.mechanism}, k {summary.k}, sigma {summary.sigma:g})"


def summary_lines(summary: BatchSummary) -> list[str]:
    """The final summary, as printed by the command."""
    skipped = Counter(summary.skipped)
    failures = ", ".join(f"{code} {n}" for code, n in sorted(summary.failures.items()))
    lines = [
        f"run {summary.run_id} on graph {summary.graph_version} ({summary.engine} engine, "
        f"{_what(summary)} in {summary.mode} mode, epsilon {summary.epsilon:g}) -> "
        f"{summary.sink}",
        f"seeds                {summary.seeds}",
        f"answered             {summary.answered} (charged now)",
        f"replayed             {summary.replayed} (stored releases, no charge)",
        f"skipped for budget   {summary.skipped_budget}"
        + (
            f" ({', '.join(f'{c} {skipped[c]}' for c in sorted(BUDGET_CODES) if skipped[c])})"
            if summary.skipped_budget
            else ""
        ),
        f"skipped, no account  {summary.skipped_no_account}",
        f"failed               {summary.failed}" + (f" ({failures})" if failures else ""),
        f"epsilon charged      {summary.epsilon_charged:.6g} in total",
        f"refunded (dead)      {summary.reconciled} admitted charge(s) of ended attempts",
        f"seeds per second     {summary.seeds_per_second:.2f} ({summary.elapsed_seconds:.1f} s "
        f"answering, {summary.setup_seconds:.1f} s setup)",
        f"per core             {summary.seeds_per_cpu_second:.2f} seeds per worker CPU-second "
        f"({summary.worker_cpu_seconds:.1f} CPU-s in the workers)",
    ]
    if skipped.get("not_in_graph"):
        lines.insert(6, f"not in graph         {skipped['not_in_graph']} user account(s)")
    if summary.skipped_no_account and not summary.failed:
        lines.append(
            f"hint: {NO_ACCOUNT_CODE}: run with --create-missing-accounts to create the missing "
            "user accounts with the default cap"
        )
    return lines
