"""One load-test run: the phases in order, against one server, with one key."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from service.errors import ServiceError
from service.loadtest import cpu_share
from service.loadtest.httpx_driver import run_httpx
from service.loadtest.report import PhaseResult
from service.loadtest.workload import Workload
from service.loadtest.wrk_driver import run_wrk


@dataclass(frozen=True)
class RunPlan:
    phases: tuple[str, ...]
    concurrency: int
    seconds: float
    warmup_seconds: float
    seeds: tuple[str, ...]
    replay_seeds: tuple[str, ...]
    mixed_replay_fraction: float
    mode: str
    epsilon: float
    k: int
    batch_size: int
    driver: str  # "wrk" | "httpx"
    #: ``mechanism=`` of every ranking request; None: the server's default for the mode.
    mechanism: str | None = None
    #: Batch calls in flight at once (each carries batch_size seeds); None: ``concurrency``.
    batch_concurrency: int | None = None
    #: How long one batch call may take before the driver counts it as a timeout.
    batch_timeout_seconds: float = 300.0


def workloads(plan: RunPlan, key: str) -> list[Workload]:
    headers = {"Authorization": f"Bearer {key}"}
    base = Workload(
        name="",
        kind="ppr",
        seeds=plan.seeds,
        replay_seeds=plan.replay_seeds,
        mode=plan.mode,
        mechanism=plan.mechanism,
        epsilon=plan.epsilon,
        k=plan.k,
        headers=headers,
    )
    shapes = {
        "healthz": replace(base, name="healthz", kind="path", path="/healthz", headers={}),
        "fresh": replace(base, name="fresh", replay_fraction=0.0),
        "replay": replace(base, name="replay", replay_fraction=1.0),
        "mixed": replace(base, name="mixed", replay_fraction=plan.mixed_replay_fraction),
        "batch": replace(base, name="batch", kind="batch", batch_size=plan.batch_size),
    }
    return [shapes[name] for name in plan.phases]


def store_replay_releases(base_url: str, workload: Workload) -> None:
    """One (charged) query per replay seed, so the replay phase finds stored releases."""
    with httpx.Client(base_url=base_url, headers=workload.headers, timeout=60) as client:
        for seed in workload.replay_seeds:
            response = client.get(workload.ppr_path(seed, fresh=False))
            if response.status_code in (401, 403, 429):
                raise KeyRefused(
                    f"the key was refused while preparing replays: GET {seed} answered "
                    f"{response.status_code} {_error_code(response)}; the load needs a service "
                    "account with a cap no run reaches (accounts create --type service "
                    "--cap 1000)"
                )
            if response.status_code != 200:
                raise ServiceError(
                    f"preparing replays: GET {seed} answered {response.status_code}: "
                    f"{response.text[:300]}"
                )


class KeyRefused(ServiceError):
    """The service refused the load test's key (unknown, revoked, out of budget)."""

    code = "key_refused"
    status = 403


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "-"


def run_phases(
    base_url: str,
    plan: RunPlan,
    key: str,
    *,
    on_result: Callable[[PhaseResult], None] | None = None,
) -> list[PhaseResult]:
    drive = run_wrk if plan.driver == "wrk" else run_httpx
    port = httpx.URL(base_url).port or 80  # whose server processes the CPU figures count
    results: list[PhaseResult] = []
    prepared = False
    for workload in workloads(plan, key):
        if workload.kind == "ppr" and workload.replay_fraction > 0 and not prepared:
            store_replay_releases(base_url, workload)
            prepared = True
        concurrency, timeout = plan.concurrency, 30.0
        if workload.kind == "batch":
            # A call carries many seeds and takes seconds: few in flight, a long timeout.
            concurrency = plan.batch_concurrency or plan.concurrency
            timeout = plan.batch_timeout_seconds
        if plan.warmup_seconds > 0 and workload.kind != "path":
            drive(base_url, workload, concurrency=concurrency, seconds=plan.warmup_seconds,
                  timeout_s=timeout)  # fmt: skip
        before = cpu_share.sample(port)
        result = drive(
            base_url, workload, concurrency=concurrency, seconds=plan.seconds, timeout_s=timeout
        )
        result.cpu_ms_per_request = cpu_share.per_request(
            before, cpu_share.sample(port), result.requests
        )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def sample_seeds(all_ids: list[str], count: int | None, rng: random.Random) -> tuple[str, ...]:
    if count is None or count >= len(all_ids):
        return tuple(all_ids)
    return tuple(rng.sample(all_ids, count))
