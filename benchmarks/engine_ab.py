"""Interleaved A/B of the batched engine: another checkout's engine and this one, in one process.

The baseline's engine modules (``service/mechanisms/{engine,operator,kernels,randomness}.py`` of
``--baseline``, e.g. the main checkout) are imported under another package name beside this
checkout's, so both run on the same graph object, the same seeds and the same prefixes, turn
about, with the naive reference timed in the same rounds. It first checks that both engines
release bit-identical vectors from the same generators (warm edge-mode and cold personalized
columns in one block, PCG64DXSM generators as in serving). Per query: block wall time / B and
process CPU time / B (all threads; compare CPU on a loaded machine, wall on an idle one).

    python benchmarks/engine_ab.py --baseline /work/main --batch 32 --rounds 8
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import service.mechanisms.engine as current
from service.graph.generate import generate_graph
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.reference import naive_noisy_diffusion
from service.privacy.calibration import DiffusionConfig, plan_diffusion
from service.privacy.modes import Mode

MODULES = ("engine", "operator", "kernels", "randomness")


def load_baseline(checkout: Path) -> Any:
    """The baseline's engine module, its siblings imported from the baseline too."""
    package = Path(tempfile.mkdtemp(prefix="engine_ab_")) / "baseline_mechanisms"
    package.mkdir()
    (package / "__init__.py").write_text("")
    pattern = re.compile(r"service\.mechanisms\.(" + "|".join(MODULES) + r")\b")
    for name in MODULES:
        source = (checkout / "service" / "mechanisms" / f"{name}.py").read_text()
        (package / f"{name}.py").write_text(pattern.sub(r"baseline_mechanisms.\1", source))
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("baseline_mechanisms.engine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the project")
    parser.add_argument("--generate", default="100000,2000000", metavar="NODES,EDGES")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    nodes, edges = (int(p) for p in args.generate.split(","))
    graph = generate_graph(nodes, edges, seed=0)
    config = plan_diffusion(0.1, min(1e-6, 1 / graph.m), 100, 0.8, 1e-7, Mode.EDGE).config
    pick = np.random.default_rng(12345)
    seeds = [int(s) for s in pick.choice(np.flatnonzero(graph.degrees > 0), 5, replace=False)]
    block_seeds = [seeds[i % len(seeds)] for i in range(args.batch)]
    free = DiffusionConfig(mode=config.mode, beta=config.beta, steps=config.noise_free_steps,
                           eta=config.eta, noise_scale=0.0, noisy_steps=0)  # fmt: skip
    prefix_jobs = [current.DiffusionJob(s, free, None, keep_prefix=False) for s in block_seeds]
    current.run_jobs(graph, prefix_jobs)
    prefixes = [job.future.result().scores for job in prefix_jobs]

    personal = plan_diffusion(0.1, min(1e-6, 1 / graph.m), 20, 0.8, 1e-7, Mode.PERSONALIZED)

    def releases(module: Any) -> np.ndarray:
        """Warm edge-mode columns and cold personalized ones in one block, each drawing from
        its own PCG64DXSM generator (the serving kind) of a fixed seed."""
        jobs = [module.DiffusionJob(s, config, np.random.Generator(np.random.PCG64DXSM(9 + i)),
                                    p, keep_prefix=False)
                for i, (s, p) in enumerate(zip(block_seeds, prefixes, strict=True))]  # fmt: skip
        jobs += [module.DiffusionJob(s, personal.config,
                                     np.random.Generator(np.random.PCG64DXSM(99 + i)))
                 for i, s in enumerate(seeds)]  # fmt: skip
        module.run_jobs(graph, jobs)
        return np.concatenate([job.future.result().scores for job in jobs])

    if not np.array_equal(releases(baseline), releases(current)):
        raise SystemExit("the two engines release different vectors from the same generators")
    print("baseline and current engines: bit-identical releases from the same generators")

    def block(module: Any, warm: bool) -> Callable[[], None]:
        def run() -> None:
            jobs = [module.DiffusionJob(s, config, fresh_generator(), p if warm else None,
                                        keep_prefix=not warm)
                    for s, p in zip(block_seeds, prefixes, strict=True)]  # fmt: skip
            module.run_jobs(graph, jobs)

        return run

    cases = {
        (side, kind): block(module, kind == "warm")
        for kind in ("warm", "cold")
        for side, module in (("baseline", baseline), ("current", current))
    }
    samples: dict[Any, list[tuple[float, float]]] = {key: [] for key in [*cases, "naive"]}
    for run in cases.values():  # compile / warm the caches
        run()
    for _ in range(args.rounds):
        for key, run in cases.items():
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            per = (
                (time.perf_counter() - wall) / args.batch,
                (time.process_time() - cpu) / args.batch,
            )
            samples[key].append(per)
        wall, cpu = time.perf_counter(), time.process_time()
        naive_noisy_diffusion(
            graph, seeds[0], beta=config.beta, steps=config.steps, eta=config.eta,
            noise_scale=config.noise_scale, mode=config.mode,
        )  # fmt: skip
        samples["naive"].append((time.perf_counter() - wall, time.process_time() - cpu))
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().split()[0]
    naive = np.median(np.asarray(samples["naive"]) * 1e3, axis=0)
    print(f"batch {args.batch}, {args.rounds} rounds, load {load}; naive reference p50 wall "
          f"{naive[0]:.1f} ms, CPU {naive[1]:.1f} ms")  # fmt: skip
    print("| engine | seeds | p50 wall ms/query | x naive | p50 CPU ms/query | x naive (CPU) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (side, kind), values in ((k, v) for k, v in samples.items() if k != "naive"):
        wall_ms, cpu_ms = np.median(np.asarray(values) * 1e3, axis=0)
        print(f"| {side} | {kind} | {wall_ms:.2f} | {naive[0] / wall_ms:.1f} | {cpu_ms:.2f} | "
              f"{naive[1] / cpu_ms:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
