"""How a worker answers queries: the engine's concurrency, queue and diffusion blocks, groups
of single queries, and how long a query waits for an identical one in flight."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServingSettings(BaseSettings):
    """How a worker answers queries: the engine, its queue and blocks, query groups, twins."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    synthesis_jobs_per_worker: int = Field(
        1, ge=1, le=64,
        description="Synthesis jobs (POST /v1/admin/synthetic) one worker runs at once; "
        "another start is refused with 429 synthesis_busy, nothing charged.",
    )  # fmt: skip

    engine_concurrency: int = Field(
        16, ge=1, le=1024, description="Queries computing at once per worker process."
    )
    ranking_draws_at_once: int = Field(
        1, ge=1, le=1024,
        description="Count-ranking draws (common_neighbours, friends_of_friends, blended) one "
        "worker computes at once; the others wait their turn. A draw holds the interpreter lock "
        "nearly throughout, so more at once share one core and add switching.",
    )  # fmt: skip
    engine_queue: int = Field(
        512, ge=0, description="Queries waiting for the engine per worker (503 beyond)."
    )
    engine_queue_timeout_seconds: float = Field(
        30.0, gt=0.0, description="Longest wait for the engine before 503 overloaded."
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
    query_groups_in_flight: int = Field(
        1, ge=0, le=64,
        description="Groups of single queries a worker answers at once: queries that arrive "
        "while this many run wait on the event loop and go together (up to "
        "PPR_LEDGER_GROUP_MAX) into the next group, one admission transaction, one engine "
        "block and one storing transaction; a query arriving while fewer run starts at once. "
        "0: each single query runs on its own thread (still group-committed).",
    )  # fmt: skip
    query_group_gather_ms: float = Field(
        20.0, ge=0.0, le=1000.0,
        description="After a group's end, the next group of single queries starts once as "
        "many wait as were in flight when it ended (under load, its callers' next queries and "
        "those already waiting), else at the end of a window of this many milliseconds (or of "
        "the ended group's duration, if shorter) counted from the first query to arrive since "
        "that end; a query arriving twice this many milliseconds or more after the end starts "
        "at once (an idle worker), a group that answered all its queries before admission "
        "(replays) is followed at once, and after a window that ends short the next 8 groups "
        "do not wait. 0: the next group takes what waits when one ends.",
    )  # fmt: skip
    twin_wait_seconds: float = Field(
        10.0, ge=0.0,
        description="How long a query waits for an identical in-flight query's release "
        "before answering 409 request_in_progress.",
    )  # fmt: skip
