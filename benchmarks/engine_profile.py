"""Where a block of the batched engine spends its time, phase by phase (wall and CPU).

Runs blocks of B queries on ``run_jobs`` (the engine's block code) on a generated graph (or an
edge list), warm (noise-free prefix given: the L noisy steps only) and cold (all K steps), and
times each phase of a block step by wrapping the engine's functions:

* ``sparse step``: clip + the CSR block product, with the noisy columns' xi1 + xi2 added in
  the product's pass over the rows (``thresholded_step``), both threads;
* ``noise draws``: each noisy column's n exact draws of the pair sum's law (one integer
  xi1 + xi2 a node, in grid units) from its own word stream (``_draw_noise``), columns split
  over both threads;
* ``admit``: building the block from the start vectors.

CPU time is the process's (all threads), so on an idle 2-core machine wall ~ CPU / 2 for the
parallel phases; on a loaded machine compare CPU times. Usage:

    python benchmarks/engine_profile.py --generate 100000,2000000 --batch 32 --repeats 3
    python benchmarks/engine_profile.py --graph ../shared/data/facebook_combined.txt --epsilon 0.01

``--graph FILE`` profiles an edge list the service would load (the HTTP benchmarks' graph)
instead of a generated one.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import service.mechanisms.engine as engine
from service.errors import GraphLoadError
from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list
from service.mechanisms.randomness import fresh_generator
from service.privacy.calibration import DiffusionConfig, plan_diffusion
from service.privacy.modes import Mode

Samples = dict[str, list[tuple[float, float]]]


def _wrap(samples: Samples, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            samples.setdefault(name, []).append(
                (time.perf_counter() - wall, time.process_time() - cpu)
            )

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--generate", default="100000,2000000", metavar="NODES,EDGES")
    source.add_argument(
        "--graph", metavar="FILE", help="an edge list to profile instead of a generated graph"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.1)
    args = parser.parse_args()
    if args.graph is not None:
        try:
            graph = load_edge_list(args.graph)
        except GraphLoadError as exc:
            parser.error(str(exc))
    else:
        nodes, edges = (int(p) for p in args.generate.split(","))
        graph = generate_graph(nodes, edges, seed=0)
    delta = min(1e-6, 1.0 / graph.m)
    config = plan_diffusion(args.epsilon, delta, 100, 0.8, 1e-7, Mode.EDGE).config
    seeds = np.random.default_rng(12345).choice(graph.n, args.batch, replace=False)
    m = config.noise_free_steps
    free = DiffusionConfig(mode=config.mode, beta=config.beta, steps=m, eta=config.eta,
                           noise_scale=0.0, noisy_steps=0)  # fmt: skip
    prefix_jobs = [engine.DiffusionJob(int(s), free, None, keep_prefix=False) for s in seeds]
    engine.run_jobs(graph, prefix_jobs)
    prefixes = [job.future.result().scores for job in prefix_jobs]

    samples: Samples = {}
    engine.thresholded_step = _wrap(samples, "sparse step + noise add", engine.thresholded_step)
    block_cls: Any = engine._Block
    block_cls._draw_noise = _wrap(samples, "noise draws", block_cls._draw_noise)
    block_cls.admit = _wrap(samples, "admit", block_cls.admit)

    print(f"graph {graph.n} nodes, {graph.m} edges; K {config.steps}, L {config.noisy_steps}, "
          f"B {args.batch}")  # fmt: skip
    for kind in ("warm", "cold"):
        samples.clear()
        totals: list[tuple[float, float]] = []
        for _ in range(args.repeats):
            jobs = [
                engine.DiffusionJob(int(s), config, fresh_generator(),
                                    p if kind == "warm" else None, keep_prefix=kind == "cold")
                for s, p in zip(seeds, prefixes, strict=True)
            ]  # fmt: skip
            wall, cpu = time.perf_counter(), time.process_time()
            engine.run_jobs(graph, jobs)
            totals.append((time.perf_counter() - wall, time.process_time() - cpu))
        wall_q, cpu_q = (
            float(np.median([t[i] for t in totals])) * 1e3 / args.batch for i in (0, 1)
        )
        with open("/proc/loadavg") as loadavg:
            load = loadavg.read().split()[0]
        print(f"{kind}: per query wall {wall_q:.2f} ms, CPU {cpu_q:.2f} ms (load {load})")
        order = ["admit", "noise draws", "sparse step + noise add"]
        for name, values in sorted(samples.items(), key=lambda item: order.index(item[0])):
            arr = np.asarray(values) * 1e3
            calls = len(values) / args.repeats
            wall, cpu = float(np.median(arr[:, 0])), float(np.median(arr[:, 1]))
            print(f"  {name:26s} calls/block {calls:6.1f}  per call wall {wall:7.2f} CPU "
                  f"{cpu:7.2f} ms  per query wall {wall * calls / args.batch:6.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
