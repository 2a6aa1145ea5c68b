"""The classification evaluation's `free_noisy_diffusion` row, its two paths side by side.

On one graph (``--generate NODES,EDGES``, the generator's graph with seed 0, or ``--graph
FILE``), an `edge`-mode noisy diffusion release at ``--epsilon`` (delta 1/|E|, K 100, beta 0.8,
eta 1e-7, as the evaluation plans it) for ``--seeds`` seeds:

* ``per seed``: what the row ran before: ``noise_free_prefix`` then ``noisy_diffusion``, one
  seed after the other (each step a one-column product over the walk operator's threads);
* ``block B``: the same releases as blocks of B cold jobs through the engine's block path
  (``run_jobs``), as :func:`service.evaluation.embeddings.free_diffusion_embeddings` runs them.

Each seed's generator is seeded the same on both paths (here only: the evaluation draws from the
OS), and every block column is checked ``np.array_equal`` to the per-seed release before the
figures are printed. Prints wall and CPU (all threads) ms per seed, and the load average.

    .venv/bin/python benchmarks/free_diffusion_blocks.py --generate 10312,333983 --blocks 16 32 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list
from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
from service.mechanisms.engine import DiffusionJob, run_jobs
from service.privacy.calibration import plan_diffusion
from service.privacy.modes import Mode


def load() -> str:
    one = os.getloadavg()[0]
    return f"{one:.2f}{' (busy)' if one > 1.5 else ''}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--generate", metavar="NODES,EDGES")
    source.add_argument("--graph", type=Path)
    parser.add_argument("--seeds", type=int, default=64, help="seeds timed on each path")
    parser.add_argument("--blocks", type=int, nargs="*", default=[16, 32, 64])
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    if args.generate:
        nodes, edges = (int(x) for x in args.generate.split(","))
        graph = generate_graph(nodes, edges, seed=0)
    else:
        graph = load_edge_list(args.graph)
    config = plan_diffusion(args.epsilon, 1.0 / graph.m, 100, 0.8, 1e-7, Mode.EDGE).config
    pick = np.random.default_rng(12345)
    seeds = [int(s) for s in pick.choice(graph.n, size=args.seeds, replace=False)]
    print(f"graph: {graph.n} nodes, {graph.m} edges; K {config.steps}, L {config.noisy_steps}; "
          f"load before {load()}")  # fmt: skip
    print(f"{'path':<12} {'wall ms':>10} {'cpu ms':>10} {'seeds':>6}  (per seed)")
    run_jobs(graph, [DiffusionJob(seeds[0], config, np.random.default_rng(0))])  # compile

    wall, cpu = time.perf_counter(), time.process_time()
    alone = []
    for i, s in enumerate(seeds):
        prefix = noise_free_prefix(graph, s, Mode.EDGE, config.beta, config.eta,
                                   config.noise_free_steps)  # fmt: skip
        alone.append(noisy_diffusion(graph, s, config, rng=np.random.default_rng(i), prefix=prefix))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{'per seed':<12} {wall / len(seeds) * 1e3:>10.1f} {cpu / len(seeds) * 1e3:>10.1f} "
          f"{len(seeds):>6}  load {load()}")  # fmt: skip

    for width in args.blocks:
        jobs = [DiffusionJob(s, config, np.random.default_rng(i), keep_prefix=False)
                for i, s in enumerate(seeds)]  # fmt: skip
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(jobs), width):
            run_jobs(graph, jobs[start : start + width])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for job, want in zip(jobs, alone, strict=True):
            if not np.array_equal(job.future.result().scores, want):
                print(f"block {width}: a release differs from the per-seed one", file=sys.stderr)
                return 1
        print(f"{f'block {width}':<12} {wall / len(seeds) * 1e3:>10.1f} "
              f"{cpu / len(seeds) * 1e3:>10.1f} {len(seeds):>6}  load {load()}")  # fmt: skip
    print(f"every block column equal to its per-seed release; load after {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
