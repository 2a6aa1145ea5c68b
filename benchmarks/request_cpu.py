"""CPU time per HTTP request, by kind, through the whole app in one process (no sockets).

Builds the app (``create_app`` with the PPR_* settings of the environment; the ledger at
``PPR_DATABASE_URL`` must be migrated), makes a service account and its key, stores 100
releases, then sends ``--requests`` requests of each kind (``/healthz``, replays of the stored
releases, and a tenth as many fresh queries of the same seeds), ``--concurrency`` at once,
through httpx's ASGI transport. Prints, per kind, this process's CPU seconds (event loop and
every thread: the query groups, the engine, the database and Redis clients) and the wall time,
per request. CPU time is what a worker spends on a request whatever else shares the machine,
so two checkouts compare on a busy machine better by it than by req/s.

Meant to be run by any checkout's own interpreter:

    PPR_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/DB PPR_GRAPH_PATH=graph.txt \\
    PPR_REDIS_URL=redis://127.0.0.1:6379/0 PPR_PREFIX_TABLE_BYTES=0 \\
        .venv/bin/python benchmarks/request_cpu.py --requests 1000 --concurrency 16

Not part of the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np


@asynccontextmanager
async def app_in_process(
    *, personalized: bool = False
) -> AsyncIterator[tuple[httpx.AsyncClient, Any, dict[str, str]]]:
    """The app (``create_app`` with the PPR_* settings of the environment), started: an httpx
    client that sends to it in this process, the graph it serves, and the bearer header of a
    new service account (``personalized``: one that may also charge seed users)."""
    from service.api.app import create_app
    from service.config import Settings
    from service.loadtest.server import service_account_key

    key = service_account_key(os.environ["PPR_DATABASE_URL"], delta=1e-6, personalized=personalized)
    app = create_app(Settings(), configure_logs=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client, app.state.runtime.graphs.current, {"Authorization": f"Bearer {key}"}


async def run(requests: int, concurrency: int) -> None:
    async with app_in_process() as (client, graph, auth):
        rng = np.random.default_rng()
        picks = rng.choice(graph.n, size=100, replace=False)
        seeds = [str(s) for s in graph.external_ids(picks)]
        query = "mode=edge&epsilon=0.01&k=10"
        for seed in seeds:  # the releases the replays read
            response = await client.get(f"/v1/ppr/{seed}?{query}", headers=auth)
            response.raise_for_status()

        async def send(paths: list[str], headers: dict[str, str]) -> None:
            for path in paths:
                response = await client.get(path, headers=headers)
                response.raise_for_status()

        kinds: list[tuple[str, Callable[[int], str], dict[str, str], int]] = [
            ("healthz", lambda i: "/healthz", {}, requests),
            ("replay", lambda i: f"/v1/ppr/{seeds[i % 100]}?{query}", auth, requests),
            ("fresh", lambda i: f"/v1/ppr/{seeds[i % 100]}?{query}&fresh=true", auth,
             max(requests // 10, 1)),
        ]  # fmt: skip
        for kind, path_of, headers, count in kinds:
            paths = [path_of(i) for i in range(count)]
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(send(paths[i::concurrency], headers)
                                   for i in range(concurrency)))  # fmt: skip
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(
                f"{kind}: {count} requests, {concurrency} at once: "
                f"CPU {cpu / count * 1000:.3f} ms/request, "
                f"wall {wall / count * 1000:.2f} ms/request"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(run(args.requests, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
