"""What the typed client adds to a call on the caller's CPU: building the request and reading
the answer into its models (no network), for one ``ppr`` answer and for a ``batch`` answer.

    .venv/bin/python benchmarks/client_overhead.py --k 20 --batch 200
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from service.client import calls


def _answer(node: int, k: int) -> dict[str, Any]:
    return {
        "node": str(node),
        "graph_version": "sha256:0123456789abcdef",
        "results": [{"node": str(node + i + 1), "score": 0.0123 - i * 1e-4} for i in range(k)],
        "mechanism": {
            "name": "noisy_diffusion", "mode": "edge", "epsilon": 0.1, "delta": 1e-6,
            "beta": 0.8, "steps": 100, "noisy_steps": 6, "eta": 1e-7, "noise_scale": 0.002,
            "score_grid": 2**-17,
        },
        "budget": {"account_id": 1, "spent_epsilon": 0.5, "cap_epsilon": 10.0,
                   "remaining_epsilon": 9.5, "delta": 1e-6, "charges": 5},
        "replayed": False, "request_id": "f02cf19a37934461957028ddb367e6fb",
        "epsilon_charged": 0.1,
    }  # fmt: skip


def _time(fn: Callable[[], object], seconds: float = 1.0) -> float:
    """Mean seconds per call of ``fn``, over at least ``seconds``."""
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        n += 1
    return elapsed / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    http = httpx.Client(base_url="http://127.0.0.1:8000")
    single = json.dumps(_answer(1, args.k)).encode()
    items = [
        {k: v for k, v in _answer(i, args.k).items() if k in ("node", "results")}
        | {"replayed": False, "epsilon_charged": 0.1}
        for i in range(args.batch)
    ]
    many = json.dumps({"items": items, "request_id": "r", "epsilon_charged": 20.0}).encode()
    nodes = [str(i) for i in range(args.batch)]

    def read(call: calls.Call[Any], body: bytes) -> object:
        request = call.request(http.build_request)
        return call.result(httpx.Response(200, content=body, request=request))

    ppr, batch = calls.ppr("42", k=args.k), calls.batch(nodes, k=args.k)
    rows = [
        ("ppr: build request", _time(lambda: ppr.request(http.build_request)), 1),
        ("ppr: build + read answer", _time(lambda: read(ppr, single)), 1),
        ("ppr: json.loads only (ref.)", _time(lambda: json.loads(single)), 1),
        ("batch: build + read answer", _time(lambda: read(batch, many)), args.batch),
        ("batch: json.loads only (ref.)", _time(lambda: json.loads(many)), args.batch),
    ]
    print(f"k = {args.k}, batch = {args.batch} seeds (no network: the client's own CPU)\n")
    print(f"| {'step':<29} | {'per call':>12} | {'per seed':>10} |")
    print(f"| {'-' * 29} | {'-' * 12}:| {'-' * 10}:|")
    for name, seconds, seeds in rows:
        print(f"| {name:<29} | {seconds * 1e6:>9.1f} µs | {seconds / seeds * 1e6:>7.1f} µs |")


if __name__ == "__main__":
    main()
