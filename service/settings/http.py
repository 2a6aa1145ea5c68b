"""The HTTP server's settings: where it listens and with how many worker processes, its
connections (per worker process; see ``service/api/http_protocol.py``), the request limits
(each a 4xx before anything is charged; 0 turns the rate limit off) and the metrics token."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class HttpSettings(BaseSettings):
    """The HTTP server: where it listens, its workers, its connections and request limits."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_body_bytes: int = Field(1 * 2**20, ge=1024, description="Largest request body (413 above).")
    max_header_bytes: int = Field(
        32 * 2**10, ge=1024, description="Largest total of request header names and values (431)."
    )
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
    http_write_timeout_seconds: float = Field(
        60.0, gt=0.0, le=3600.0,
        description="Longest time an answer may wait, unsent, for its client to read (the "
        "connection's send buffer full); then the connection is closed.",
    )  # fmt: skip
    http_keep_alive_seconds: float = Field(
        5.0,
        gt=0.0,
        le=3600.0,
        description="How long an idle kept-alive connection stays open after a response.",
    )
    http_max_connections: int = Field(
        2048, ge=1, le=1_000_000,
        description="Open connections per worker process, counted from accept: beyond it the "
        "oldest connection still waiting for its request head is answered 503 overloaded "
        "and closed, or, if none is, the new one is.",
    )  # fmt: skip
    http_reserved_files: int = Field(
        256, ge=0, le=1_000_000,
        description="File descriptors a worker keeps free for what it opens besides its "
        "connections (ledger and Redis pools, graph files, logs, metrics): a worker holds at "
        "most its open-file limit, less what it holds at start, less this, in connections "
        "(or PPR_HTTP_MAX_CONNECTIONS if fewer).",
    )  # fmt: skip
    http_max_url_bytes: int = Field(
        16_384, ge=1024, le=1_048_576,
        description="Longest request target (path and query); longer gets 414 uri_too_long.",
    )  # fmt: skip
    rate_limit_per_second: float = Field(
        10_000.0, ge=0.0, description="Requests per second per account (token refill); 0: off."
    )
    rate_limit_burst: int = Field(20_000, ge=1, description="Token bucket capacity per account.")
    metrics_token: SecretStr | None = Field(
        None, description="If set, /metrics needs 'Authorization: Bearer <token>'."
    )
