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

from service.api.runtime import build_runtime
from service.config import Settings
from service.privacy.modes import Mode
from service.serving.batch import BatchRequest
from service.serving.schemas import Principal, QueryRequest

STAGES: dict[str, list[str]] = {
    "ledger": [
        "admit", "store_release", "find_release", "budget", "account_delta",
        "release_for_idempotency_key", "charge_state", "admit_and_charge_many",
        "store_releases", "authenticate",
    ],
    # the query pipeline's stages (service/serving/pipeline), by the attribute of the service
    "preparing": ["prepare"],
    "replaying": ["find_release", "replay"],
    "admitting": ["admit"],
    "drawing": ["draw", "draw_group"],
    "storing": ["store_many"],
    "engine": ["compute"],
    "prefixes": ["lookup", "remember"],
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--batches", type=int, default=2)
    args = parser.parse_args()
    settings = Settings()
    runtime = build_runtime(settings)
    try:
        ledger = runtime.ledger
        account = ledger.accounts.create_account(
            "service", label=f"profile-{uuid.uuid4().hex[:8]}", cap_epsilon=1000.0,
            delta=1e-6, modes=("edge",),
        )  # fmt: skip
        principal = Principal(account_id=account.account_id, type="service", modes=("edge",))
        graph = runtime.graphs.current
        rng = np.random.default_rng(1)
        seeds = [str(s) for s in rng.choice(graph.node_ids, size=args.queries, replace=False)]
        cold = [s for s in graph.external_ids(np.arange(graph.n)) if s not in set(seeds)]
        rng.shuffle(cold)
        queries = runtime.queries
        totals: dict[str, float] = defaultdict(float)
        instrument(ledger, STAGES["ledger"], "ledger", totals)
        for stage in ("preparing", "replaying", "admitting", "drawing", "storing"):
            instrument(getattr(queries, stage), STAGES[stage], stage, totals)
        instrument(queries.engine, STAGES["engine"], "engine", totals)
        instrument(queries.prefixes, STAGES["prefixes"], "prefix", totals)

        def run(kind: str, fresh: bool) -> None:
            totals.clear()
            start = time.perf_counter()
            for seed in seeds:
                queries.answer(QueryRequest(principal, seed, 20, 0.1, Mode.EDGE, fresh=fresh,
                                            request_id=uuid.uuid4().hex))  # fmt: skip
            wall = time.perf_counter() - start
            print(f"\n{kind}: {wall / len(seeds) * 1000:.2f} ms per query ({len(seeds)} queries)")
            for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
                print(f"  {name:40s} {seconds / len(seeds) * 1000:8.2f} ms")

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
                        0.1,
                        Mode.EDGE,
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
            for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
                print(f"  {name:40s} {seconds / args.batches * 1000:8.2f} ms per call")

        instrument(runtime.batch, ["run_all"], "batch", totals)
        run_batches("batch, cold seeds", cold)
        run_batches("batch, the same seeds again (warm)", cold)
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
