"""Where a query's time goes on the request path, without HTTP: cold, warm, replay, batch.

Builds the service's runtime (ledger, caches, engine) from the PPR_* settings, creates a
service account, and answers queries one at a time through ``PprQueryService.answer``, timing
each stage by wrapping the methods that implement it. Prints, per kind of query, the mean
milliseconds per stage and per query. The batch rows answer ``--batch-size`` cold seeds per
call through ``BatchQueryService`` (one admission and one storing transaction per call).

    PPR_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/DB \\
    PPR_REDIS_URL=redis://127.0.0.1:6379/0 PPR_GRAPH_PATH=../shared/data/facebook_combined.txt \\
    python benchmarks/request_path_profile.py --queries 50
"""

from __future__ import annotations

import argparse
import functools
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import event
from sqlalchemy.engine import Engine

from service.api.runtime import build_runtime
from service.config import Settings
from service.privacy.modes import Mode
from service.serving.batch import BatchRequest
from service.serving.schemas import Principal, QueryRequest

#: The query pipeline's stages (service/serving/pipeline), by the attribute of the query
#: service that holds each, and the methods timed on it.
STAGES: dict[str, list[str]] = {
    "preparing": ["prepare", "bind"],
    "replaying": ["find_release", "release_for_idempotency_key", "replay"],
    "admitting": ["admit"],
    "drawing": ["draw", "draw_group"],
    "storing": ["store_many"],
}  # fmt: skip


def instrument(obj: Any, names: list[str], label: str, totals: dict[str, float]) -> None:
    for name in names:
        original: Callable[..., Any] = getattr(obj, name)

        @functools.wraps(original)  # type: ignore[arg-type]
        def timed(*args: Any, __f: Callable[..., Any] = original, __n: str = name,
                  **kwargs: Any) -> Any:  # fmt: skip
            start = time.perf_counter()
            try:
                return __f(*args, **kwargs)
            finally:
                totals[f"{label}.{__n}"] += time.perf_counter() - start

        setattr(obj, name, timed)


def count_statements(totals: dict[str, float]) -> None:
    """Every SQL statement's time on every engine (``sql.time``, seconds) and their number
    (``sql.statements``), and the commits (``sql.commits``)."""

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        conn.info.setdefault("started", []).append(time.perf_counter())

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        totals["sql.time"] += time.perf_counter() - conn.info["started"].pop()
        totals["sql.statements"] += 1

    def commit(conn: Any) -> None:
        totals["sql.commits"] += 1

    event.listen(Engine, "before_cursor_execute", before)
    event.listen(Engine, "after_cursor_execute", after)
    event.listen(Engine, "commit", commit)


def print_totals(totals: dict[str, float], per: int, unit: str) -> None:
    counts = {name: totals.pop(name, 0.0) for name in ("sql.statements", "sql.commits")}
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {name:40s} {seconds / per * 1000:8.2f} ms{unit}")
    for name, count in counts.items():
        print(f"  {name:40s} {count / per:8.1f}{unit}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.EDGE.value)
    args = parser.parse_args()
    mode = Mode(args.mode)
    settings = Settings()
    runtime = build_runtime(settings)
    try:
        ledger = runtime.ledger
        account = ledger.accounts.create_account(
            "service", label=f"profile-{uuid.uuid4().hex[:8]}", cap_epsilon=1000.0,
            delta=1e-6, modes=(mode.value,),
        )  # fmt: skip
        principal = Principal(account_id=account.account_id, type="service", modes=(mode.value,))
        graph = runtime.graphs.current
        rng = np.random.default_rng(1)
        seeds = [str(s) for s in rng.choice(graph.node_ids, size=args.queries, replace=False)]
        cold = [s for s in graph.external_ids(np.arange(graph.n)) if s not in set(seeds)]
        rng.shuffle(cold)
        queries = runtime.queries
        totals: dict[str, float] = defaultdict(float)
        for stage, names in STAGES.items():
            instrument(getattr(queries, stage), names, stage, totals)
        instrument(queries.drawing.reads, ["record"], "reads", totals)
        instrument(queries.engine, ["compute"], "engine", totals)
        instrument(queries.prefixes, ["lookup", "remember"], "prefixes", totals)
        count_statements(totals)

        def run(kind: str, fresh: bool) -> None:
            totals.clear()
            start = time.perf_counter()
            for seed in seeds:
                queries.answer(QueryRequest(principal, seed, 20, args.epsilon, mode, fresh=fresh,
                                            request_id=uuid.uuid4().hex))  # fmt: skip
            wall = time.perf_counter() - start
            print(f"\n{kind}: {wall / len(seeds) * 1000:.2f} ms per query ({len(seeds)} queries)")
            print_totals(totals, len(seeds), "")

        run("fresh, cold seeds", fresh=True)
        run("fresh, warm seeds", fresh=True)
        run("replay", fresh=False)

        def run_batches(kind: str, nodes: list[str]) -> None:
            totals.clear()
            start = time.perf_counter()
            done = 0
            for b in range(args.batches):
                chunk = nodes[b * args.batch_size : (b + 1) * args.batch_size]
                items = runtime.batch.answer(
                    BatchRequest(
                        principal,
                        chunk,
                        20,
                        args.epsilon,
                        mode,
                        fresh=True,
                        request_id=uuid.uuid4().hex,
                    )
                )
                done += sum(1 for item in items if item.answer is not None)
            wall = time.perf_counter() - start
            print(
                f"\n{kind}: {wall / args.batches * 1000:.1f} ms per call of {args.batch_size}, "
                f"{done / wall:.1f} seeds/s"
            )
            print_totals(totals, args.batches, " per call")

        instrument(runtime.batch, ["run_all"], "batch", totals)
        run_batches("batch, cold seeds", cold)
        run_batches("batch, the same seeds again (warm)", cold)
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
