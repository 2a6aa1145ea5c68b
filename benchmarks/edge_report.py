"""The per-edge exposure report on a real graph: how long it takes, and where edges sit.

Seeds a fresh SQLite ledger with ``--releases`` recorded noisy-diffusion charges (random seeds,
half ``personalized`` and half ``edge``, the service's defaults: beta 0.8, K 100, eta 1e-7,
epsilon ``--epsilon`` at delta ``--delta``, the noisy steps the calibration chooses) on the
graph, then

* times ``ledger edge-report``'s computation (:func:`service.edge_report.report.edge_report`)
  for ``--timed`` random edges, and
* prints the distribution of the ratio per-edge eps / worst-case eps of ONE personalized
  release for ``--edges`` random edges x ``--seeds`` random seeds (the spec's measurement).

    .venv/bin/python benchmarks/edge_report.py --graph GRAPH_FILE
    .venv/bin/python benchmarks/edge_report.py --graph GRAPH_FILE --releases 1000 --timed 3

The figures are data-dependent (pDP): this is an operator's measurement, not a release.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session

from service.edge_report.report import edge_report
from service.edge_report.shifts import prefix_shifts, toggled_graph
from service.graph.loader import load_edge_list
from service.graph.model import Graph
from service.ledger import Ledger, upgrade
from service.ledger.periods import day_start
from service.ledger.tables import Charge
from service.mechanisms.registry import RankingMechanism
from service.privacy.calibration import DiffusionPlan, plan_diffusion
from service.privacy.modes import Mode
from service.privacy.per_edge import ReleaseParameters, per_instance_curve, worst_case_curve


def _params(plan: DiffusionPlan) -> ReleaseParameters:
    c = plan.config
    return ReleaseParameters(c.mode, c.beta, c.steps, c.eta, c.noise_scale, c.noisy_steps)


def _seed_ledger(url: str, graph: Graph, plans: list[DiffusionPlan], releases: int) -> Ledger:
    upgrade(url)
    ledger = Ledger.from_url(url)
    account = ledger.accounts.create_account("service", cap_epsilon=1e6, delta=1e-6)
    public = ledger.graph_versions.public_graph_version(graph.fingerprint)
    rng = np.random.default_rng()
    seeds = rng.choice(graph.n, size=releases, replace=releases > graph.n)
    now = datetime.now(UTC)
    with Session(ledger.engine) as session, session.begin():
        for i, seed in enumerate(seeds):
            plan = plans[i % len(plans)]
            c = plan.config
            session.add(
                Charge(
                    created_at=now,
                    period_start=day_start(now),  # as every charge records (its UTC day)
                    charged_account_id=account.account_id,
                    principal_account_id=account.account_id,
                    seed=graph.external_ids(np.array([seed]))[0],
                    mechanism=RankingMechanism.NOISY_DIFFUSION.value,
                    mode=c.mode.value,
                    params={
                        "name": RankingMechanism.NOISY_DIFFUSION.value,
                        "mode": c.mode.value,
                        "epsilon": plan.epsilon,
                        "delta": plan.delta,
                        "beta": c.beta,
                        "steps": c.steps,
                        "noisy_steps": c.noisy_steps,
                        "eta": c.eta,
                        "noise_scale": c.noise_scale,
                    },
                    epsilon=plan.epsilon,
                    rdp=plan.curve.to_json(),
                    pure_epsilon=plan.curve.pure,
                    grid_version=1,
                    graph_version=public,
                    request_id=f"bench-{i}",
                    state="released",
                )
            )
    return ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--releases", type=int, default=1000)
    parser.add_argument("--timed", type=int, default=3, help="edges whose report is timed")
    parser.add_argument("--edges", type=int, default=48, help="edges in the ratio sample")
    parser.add_argument("--seeds", type=int, default=3, help="seeds in the ratio sample")
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--delta", type=float, default=3e-6)
    args = parser.parse_args()

    graph = load_edge_list(args.graph)
    plans = [plan_diffusion(args.epsilon, args.delta, 100, 0.8, 1e-7, m) for m in Mode]
    src, dst = graph.edge_arrays()
    rng = np.random.default_rng()
    out: dict[str, object] = {
        "graph": {"nodes": graph.n, "edges": graph.m},
        "epsilon": args.epsilon, "delta": args.delta,
        "noisy_steps": plans[0].config.noisy_steps,
    }  # fmt: skip

    # one personalized release: the ratio over sampled edges and seeds
    params = _params(plans[0])
    worst = worst_case_curve(params).epsilon(args.delta)
    ratios, near = [], []
    for k in rng.choice(src.shape[0], size=args.edges, replace=False):
        u, v = int(src[k]), int(dst[k])
        toggled = toggled_graph(graph, u, v)
        seeds = [int(s) for s in rng.choice(graph.n, size=args.seeds) if s not in (u, v)]
        for s, shifts in zip(seeds, prefix_shifts(
            graph, toggled, seeds, mode=params.mode, beta=params.beta, eta=params.eta,
            noise_free_steps=params.noise_free_steps,
        ), strict=True):  # fmt: skip
            ratio = per_instance_curve(shifts, params).epsilon(args.delta) / worst
            ratios.append(ratio)
            nbrs = set(graph.neighbors(s).tolist())
            if u in nbrs and v in nbrs:
                near.append(ratio)
    q = np.quantile(ratios, [0.0, 0.1, 0.5, 0.9, 1.0])
    out["one_release"] = {
        "worst_case_epsilon": worst,
        "pairs": len(ratios),
        "ratio_min_p10_median_p90_max": [round(float(x), 4) for x in q],
        "ratio_floor": 1.0 - 0.8 ** (params.noisy_steps - 1),
        "pairs_with_both_endpoints_friends_of_the_seed": len(near),
    }

    # the report over the recorded releases, timed
    with tempfile.TemporaryDirectory() as tmp:
        ledger = _seed_ledger(f"sqlite:///{tmp}/ledger.db", graph, plans, args.releases)
        try:
            seconds, totals = [], []
            for k in rng.choice(src.shape[0], size=args.timed, replace=False):
                u, v = graph.external_ids(np.array([src[k], dst[k]]))
                start = time.perf_counter()
                report = edge_report(ledger, graph, u, v, delta=args.delta)
                seconds.append(time.perf_counter() - start)
                totals.append(report["total"]["ratio"])
        finally:
            ledger.dispose()
    out["report"] = {
        "releases": args.releases,
        "seconds_per_edge": [round(s, 2) for s in seconds],
        "median_seconds": round(statistics.median(seconds), 2),
        "composed_ratio": [round(r, 4) for r in totals],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
