"""Draws per second of the exact rounded-Laplace sampler next to numpy's float sampler.

For gamma = grid / scale = 1/256 (a count release's grid) and gamma ~ 1e-9 (a fine grid),
``rounded_laplace`` (service/mechanisms/exact_laplace.py: raw 64-bit words, exact integer
comparisons) against ``laplace_noise`` (numpy's float64 ziggurat exponential and sign words),
best of ``--repeats`` runs of ``--count`` draws each, on a fresh OS-entropy generator, plus the
raw words each exact draw consumed on average.

    .venv/bin/python benchmarks/exact_laplace_speed.py [--count 2000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from service.mechanisms.exact_laplace import dyadic_scale, gamma_ratio, rounded_laplace
from service.mechanisms.randomness import fresh_generator, laplace_noise


class CountingWords(np.random.Generator):
    """A generator that counts the raw words drawn through ``bit_generator.random_raw``."""

    words = 0

    def __init__(self) -> None:
        super().__init__(np.random.PCG64DXSM())
        outer = self
        inner = super().bit_generator

        class Counter:
            lock = inner.lock

            def random_raw(self, size: int) -> np.ndarray:
                outer.words += int(size)
                return inner.random_raw(size)

        self._counter = Counter()

    @property
    def bit_generator(self) -> np.random.BitGenerator:
        return self._counter  # type: ignore[return-value]


def best_rate(draw: object, count: int, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        draw(count)  # type: ignore[operator]
        best = max(best, count / (time.perf_counter() - start))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rounded_laplace(fresh_generator(), 1, 3, 10)  # compile (or load the cache) first
    cases = {
        "1/256": (1, 256),
        "1e-9": gamma_ratio(2.0**-30, dyadic_scale(2.0**-30 * 1e9)),
    }
    print(f"{args.count:,} draws, best of {args.repeats}")
    print("| sampler | gamma | draws/s | raw words drawn per draw |")
    print("| --- | --- | --- | --- |")
    for label, (s, t) in cases.items():
        rng = fresh_generator()
        rate = best_rate(
            lambda n, s=s, t=t, rng=rng: rounded_laplace(rng, s, t, n), args.count, args.repeats
        )
        counting = CountingWords()
        rounded_laplace(counting, s, t, args.count)
        per_draw = counting.words / args.count
        print(f"| exact rounded_laplace | {label} ({s}/{t}) | {rate:,.0f} | {per_draw:.2f} |")
    rng = fresh_generator()
    rate = best_rate(lambda n: laplace_noise(rng, 1.0, n), args.count, args.repeats)
    print(f"| numpy ziggurat laplace_noise (float) | - | {rate:,.0f} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
