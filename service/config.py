"""Service configuration from environment variables prefixed ``PPR_`` (pydantic-settings).

Every setting has a safe embedded default: SQLite ledger file, in-process cache, the built-in
demo graph. Mechanism settings are per deployment (one graph), never taken from clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.budgets import CAP_EPSILON_MAX, CAP_EPSILON_MIN, DELTA_MAX, DELTA_MIN
from service.embeddings.dp import DEFAULT_EMBEDDING_SIGMA
from service.embeddings.dp import DEFAULT_K as DP_IE_DEFAULT_K
from service.embeddings.dp import MAX_K as DP_IE_MAX_K
from service.embeddings.dp import MAX_SIGMA as DP_IE_MAX_SIGMA
from service.embeddings.dp import MIN_SIGMA as DP_IE_MIN_SIGMA
from service.errors import InvalidParameter
from service.graph.bounds import DEFAULT_MAX_DEGREE_BOUND, MAX_DEGREE_BOUND_LIMIT
from service.mechanisms.registry import DEFAULT_MECHANISM, RankingMechanism
from service.urls import check_database_url, check_redis_url


class MechanismSettings(BaseSettings):
    """How the noisy diffusion runs on this deployment's graph (clients cannot change these)."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    beta: float = Field(0.8, gt=0.0, lt=1.0, description="Diffusion weight (teleport 1 - beta).")
    steps: int = Field(100, ge=1, le=10_000, description="Diffusion steps K.")
    eta: float = Field(1e-7, gt=0.0, description="Threshold per unit degree: t_i = eta d_i.")
    epsilon_min: float = Field(0.01, gt=0.0, description="Smallest epsilon a query may ask for.")
    epsilon_max: float = Field(2.0, gt=0.0, description="Largest epsilon a query may ask for.")
    default_epsilon: float = Field(0.1, gt=0.0, description="Epsilon of a query that names none.")
    default_delta: float = Field(
        1e-6, ge=DELTA_MIN, lt=DELTA_MAX,
        description="Delta of new accounts' budgets and of the query calibration (never "
        "derived from the graph; see PPR_EDGE_COUNT_BOUND).",
    )  # fmt: skip
    edge_count_bound: int | None = Field(
        None, ge=1,
        description="A public bound on the number of edges: when set, delta is "
        "min(PPR_DEFAULT_DELTA, 1 / this), and a graph with more edges is refused at load.",
    )  # fmt: skip
    max_degree_bound: int = Field(
        DEFAULT_MAX_DEGREE_BOUND, ge=1, le=MAX_DEGREE_BOUND_LIMIT,
        description="A public bound on every node's degree: the float64 margin of the "
        "diffusion's noise (kappa) is computed from it, never from the graph's own largest "
        "degree; a graph with a node of higher degree is refused at load.",
    )  # fmt: skip
    default_cap_epsilon: float = Field(
        1.0, ge=CAP_EPSILON_MIN, le=CAP_EPSILON_MAX, description="Budget cap of new accounts."
    )
    max_k: int = Field(1000, ge=1, le=10_000, description="Largest k a query may ask for.")
    default_k: int = Field(20, ge=1, description="k of a query that names none.")
    default_mechanism: RankingMechanism = Field(
        DEFAULT_MECHANISM,
        description="Ranking of a query that names none (personalized mode); a "
        "personalized-only default is noisy_diffusion in edge mode.",
    )
    popular_epsilon: float = Field(
        0.1, gt=0.0, le=10.0,
        description="Epsilon of the one DP degree release per graph version behind `popular` "
        "and `blended` (counted once in the graph-wide exposure; each account receiving an "
        "answer built on it is charged it once per graph version).",
    )  # fmt: skip

    embedding_default_k: int = Field(
        DP_IE_DEFAULT_K, ge=1, le=DP_IE_MAX_K,
        description="Dimension k of an embedding request that names none (the paper's 256); "
        "k is bounded by PPR_MAX_K, as a ranking's, and by 4096.",
    )  # fmt: skip
    embedding_default_sigma: float = Field(
        DEFAULT_EMBEDDING_SIGMA, ge=DP_IE_MIN_SIGMA, le=DP_IE_MAX_SIGMA,
        description="PushFlowCap sensitivity sigma of a DP-IE request that names none (chosen "
        "by the sweep in docs/embeddings.md).",
    )  # fmt: skip
    embedding_min_sigma: float = Field(
        1e-5, ge=DP_IE_MIN_SIGMA, le=DP_IE_MAX_SIGMA,
        description="Smallest sigma a DP-IE request may ask for (below ~1e-5 only the seed "
        "enters the embedding on graphs of thousands of nodes).",
    )  # fmt: skip
    embedding_max_sigma: float = Field(
        DP_IE_MAX_SIGMA, ge=DP_IE_MIN_SIGMA, le=DP_IE_MAX_SIGMA,
        description="Largest sigma a DP-IE request may ask for (the noise scale is sigma n / eps).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _ranges_agree(self) -> MechanismSettings:
        if self.epsilon_min > self.epsilon_max:
            raise ValueError("PPR_EPSILON_MIN must not exceed PPR_EPSILON_MAX")
        if not self.epsilon_min <= self.default_epsilon <= self.epsilon_max:
            raise ValueError("PPR_DEFAULT_EPSILON must lie in [PPR_EPSILON_MIN, PPR_EPSILON_MAX]")
        if self.default_k > self.max_k:
            raise ValueError("PPR_DEFAULT_K must not exceed PPR_MAX_K")
        if self.embedding_default_k > self.max_k:
            raise ValueError("PPR_EMBEDDING_DEFAULT_K must not exceed PPR_MAX_K")
        if not (
            self.embedding_min_sigma <= self.embedding_default_sigma <= self.embedding_max_sigma
        ):
            raise ValueError(
                "PPR_EMBEDDING_DEFAULT_SIGMA must lie in "
                "[PPR_EMBEDDING_MIN_SIGMA, PPR_EMBEDDING_MAX_SIGMA]"
            )
        return self

    @property
    def account_delta(self) -> float:
        """Delta of new accounts and of calibration: from configuration only, never the graph."""
        if self.edge_count_bound is None:
            return self.default_delta
        return min(self.default_delta, 1.0 / self.edge_count_bound)


class Settings(MechanismSettings):
    """All settings of the service process."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    graph_path: Path | None = Field(None, description="Edge-list file; unset: the demo graph.")
    nodes_path: Path | None = Field(
        None,
        description="Node-list file (one id per line): the node set, an input like the edges "
        "(nodes without edges are served; an edge naming a node not listed is refused). "
        "Unset: the node set is derived from the edges and is then public.",
    )
    graph_dir: Path | None = Field(
        None,
        description="Directory an admin may load graph files from by name "
        '(POST /v1/admin/graph/reload {"path": ...}); unset: only the configured file.',
    )
    database_url: str = Field("sqlite:///./ppr-ledger.db", description="SQLAlchemy URL.")
    auto_migrate: bool = Field(False, description="Run migrations at start-up.")
    redis_url: str | None = Field(None, description="Redis URL; unset: in-process caches.")
    allow_prefix_in_redis: bool = Field(
        False, description="Let Redis hold noise-free prefixes (as sensitive as the graph)."
    )
    prefix_cache_bytes: int = Field(
        256 * 2**20, ge=0,
        description="Bytes of noise-free prefixes kept in process memory per machine: each of "
        "the PPR_WORKERS workers keeps at most this / PPR_WORKERS.",
    )  # fmt: skip
    prefix_table_bytes: int = Field(
        2**29, ge=0,
        description="Bytes of machine-wide prefix tables (every seed's noise-free prefix, "
        "n x n float64 per mode, one file in the snapshot directory mapped by every worker): "
        "a graph's tables are built, edge mode first, while they fit together; 0: off (also "
        "off when PPR_GRAPH_SNAPSHOTS is false).",
    )  # fmt: skip
    replay_ttl_seconds: int = Field(7 * 24 * 3600, ge=60, description="Replay cache TTL.")
    replay_store_top: int = Field(1000, ge=1, description="Results kept for replays.")
    replay_recent_seconds: float = Field(
        1.0, ge=0.0, le=60.0,
        description="Releases a worker read or wrote in the last this many seconds are kept "
        "decoded in process (hot replays skip Redis); another worker's newer release for the "
        "same query is seen after at most this long; 0: off.",
    )  # fmt: skip
    replay_recent_items: int = Field(
        256, ge=0, le=100_000,
        description="Most releases each worker keeps decoded (PPR_REPLAY_RECENT_SECONDS); one "
        "of 1000 results is ~100 kB of Python objects.",
    )  # fmt: skip
    create_seed_accounts: bool = Field(
        False,
        description="Service accounts granted may_create_seed_accounts may create a seed "
        "user's account on its first charge (both must allow it).",
    )
    service_quota_epsilon: float = Field(
        1000.0, gt=0.0,
        description="Default eps a service account may charge to other accounts per rolling "
        "24 h (per-account quota_epsilon overrides it).",
    )  # fmt: skip
    service_read_cap_epsilon: float | None = Field(
        None, gt=0.0,
        description="Default cap on a service account's read figure (the composition of every "
        "distinct release it received); unset: reported, not capped (per-account "
        "read_cap_epsilon overrides it).",
    )  # fmt: skip
    graph_cap_epsilon: float | None = Field(
        None, gt=0.0,
        description="Graph-wide cap on the composed exposure of all accounts; unset: no cap.",
    )  # fmt: skip
    exposure_delta: float | None = Field(
        None, gt=0.0, lt=1.0,
        description="Delta of the graph-wide exposure; unset: the smallest account delta.",
    )  # fmt: skip
    reconcile_after_seconds: float = Field(
        60.0, ge=1.0,
        description="An admitted charge with no stored release after this long is refunded.",
    )  # fmt: skip
    reconcile_interval_seconds: float = Field(
        30.0, ge=0.0, description="How often each worker reconciles; 0 turns it off."
    )
    ledger_connect_timeout_seconds: float = Field(
        60.0, ge=0.0,
        description="How long a starting worker waits for an unreachable ledger database "
        "before it starts serving without it: then it answers 503 ledger_unavailable (and "
        "/readyz 503) and keeps connecting in the background, with backoff, until the "
        "database answers (0: start serving at once).",
    )  # fmt: skip
    ledger_ping_idle_seconds: float = Field(
        10.0, ge=0.0,
        description="PostgreSQL: a pooled connection idle longer than this is pinged before "
        "use (0: before every transaction); a busy pool pays no ping round trip.",
    )  # fmt: skip
    ledger_group_max: int = Field(
        64, ge=1, le=10_000,
        description="Most queries a worker admits (or whose releases it stores) in one ledger "
        "transaction when they arrive while the previous one runs (group commit; each query "
        "stays all-or-nothing); 1: one transaction per query.",
    )  # fmt: skip
    query_groups_in_flight: int = Field(
        1, ge=0, le=64,
        description="Groups of single queries a worker answers at once: queries that arrive "
        "while this many run wait on the event loop and go together (up to "
        "PPR_LEDGER_GROUP_MAX) into the next group, one admission transaction, one engine "
        "block and one storing transaction; a query arriving while fewer run starts at once. "
        "0: each single query runs on its own thread (still group-committed).",
    )  # fmt: skip
    auth_cache_seconds: float = Field(
        1.0, ge=0.0,
        description="How long a worker reuses an API key's account (type, scopes, quota) "
        "without reading the ledger: a revoked key or changed scope takes effect in other "
        "workers within this bound (at once in the worker that made the change); 0: read "
        "on every request.",
    )  # fmt: skip
    twin_wait_seconds: float = Field(
        10.0, ge=0.0,
        description="How long a query waits for an identical in-flight query's release "
        "before answering 409 request_in_progress.",
    )  # fmt: skip
    # Limits (each documented in the README; 0 turns a rate limit off).
    max_body_bytes: int = Field(1 * 2**20, ge=1024, description="Largest request body (413 above).")
    max_header_bytes: int = Field(
        32 * 2**10, ge=1024, description="Largest total of request header names and values (431)."
    )
    rate_limit_per_second: float = Field(
        10_000.0, ge=0.0, description="Requests per second per account (token refill); 0: off."
    )
    rate_limit_burst: int = Field(20_000, ge=1, description="Token bucket capacity per account.")
    engine_concurrency: int = Field(
        16, ge=1, le=1024, description="Queries computing at once per worker process."
    )
    engine_queue: int = Field(
        512, ge=0, description="Queries waiting for the engine per worker (503 beyond)."
    )
    engine_queue_timeout_seconds: float = Field(
        30.0, gt=0.0, description="Longest wait for the engine before 503 overloaded."
    )
    graph_version_check_ms: float = Field(
        1000.0, ge=0.0,
        description="How often (at most) each worker compares its graph version with the one "
        "recorded in the ledger database by the last load or reload, and reloads if they "
        "differ; 0 turns following off.",
    )  # fmt: skip
    graph_snapshots: bool = Field(
        True,
        description="Serve a graph file from a binary CSR snapshot that every worker of the "
        "machine memory-maps read-only (one copy of the graph per machine); written once per "
        "file contents. Off: each process parses the file and holds its own copy.",
    )
    graph_snapshot_dir: Path | None = Field(
        None,
        description="Directory of the graph snapshots (created 0700; they hold the graph); "
        "unset: ppr-graph-snapshots-<uid> in the system temp dir.",
    )
    engine_max_batch: int = Field(
        64, ge=1, le=4096,
        description="Most queries one diffusion block computes together per worker (its "
        "memory is about 2 x n x this x 8 bytes).",
    )  # fmt: skip
    engine_batch_window_ms: float = Field(
        2.0, ge=0.0, le=1000.0,
        description="While a block runs, queries that arrive within this window join it "
        "together at one step boundary; an idle engine starts a query at once.",
    )  # fmt: skip
    metrics_token: SecretStr | None = Field(
        None, description="If set, /metrics needs 'Authorization: Bearer <token>'."
    )
    batch_max_items: int = Field(
        1000, ge=1, le=100_000, description="Most seeds one POST /v1/ppr/batch call may carry."
    )
    batch_concurrency: int = Field(
        32, ge=1, le=1024, description="Batch items answered at once per process (all batches)."
    )
    # Connections (per worker process; see service/api/http_protocol.py).
    http_head_timeout_seconds: float = Field(
        10.0, gt=0.0, le=3600.0,
        description="Longest time from a connection's opening (or a request's first byte on "
        "a kept-alive connection) to the end of the request head; then 408 request_timeout "
        "and the connection is closed.",
    )  # fmt: skip
    http_body_timeout_seconds: float = Field(
        30.0, gt=0.0, le=3600.0,
        description="Longest time from the end of a request head to the end of its body; "
        "then 408 request_timeout and the connection is closed.",
    )  # fmt: skip
    http_keep_alive_seconds: float = Field(
        5.0,
        gt=0.0,
        le=3600.0,
        description="How long an idle kept-alive connection stays open after a response.",
    )
    http_max_connections: int = Field(
        2048, ge=1, le=1_000_000,
        description="Open connections per worker process; a request on a connection beyond "
        "it gets 503 overloaded (and the connection is closed) instead of being served.",
    )  # fmt: skip
    http_max_url_bytes: int = Field(
        16_384, ge=1024, le=1_048_576,
        description="Longest request target (path and query); longer gets 414 uri_too_long.",
    )  # fmt: skip
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def snapshot_directory(self) -> Path | None:
        """Where graph snapshots go, or None when they are off."""
        if not self.graph_snapshots:
            return None
        if self.graph_snapshot_dir is not None:
            return self.graph_snapshot_dir
        from service.graph.snapshot import default_directory

        return default_directory()

    @property
    def prefix_cache_bytes_per_worker(self) -> int:
        """This worker's share of the machine's prefix cache bound."""
        return self.prefix_cache_bytes // self.workers

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return check_database_url(value)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return None if value is None else check_redis_url(value)


def settings_error(
    exc: ValidationError, *, flags: Mapping[str, str] | None = None
) -> InvalidParameter:
    """The first problem of a settings ``ValidationError`` as one ``invalid_parameter`` error
    naming the ``PPR_*`` variable, or the command-line flag in ``flags`` that set it."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    env = "PPR_" + "_".join(loc).upper() if loc else "PPR_* settings"
    name = (flags or {}).get(env, env)
    message = str(first["msg"]).removeprefix("Value error, ")
    return InvalidParameter(name, message)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
