"""Microseconds a Binomial(u, 1/2) draw: the popcount of u raw bits against the exact rejection
sampler, and the rejection sampler's float product done with numpy instead of the numba kernel.

For u = 2^lo .. 2^hi (``--lo``, ``--hi``), on a fresh OS-entropy generator, best of
``--repeats`` runs of ``--count`` draws each (fewer popcounts at large u, ``--popcount-words``
raw words in all a run): ``binomial_half_popcount`` (u / 64 raw words and numpy's popcount),
``binomial_half_rejection`` (service/mechanisms/exact_binomial.py: the staircase envelope, the
float product in the numba kernel with its early rejection, the exact integer path when a
float test does not settle), and the same proposals accepted by a numpy product of the |d|
factors (``np.prod`` of an ``np.arange`` quotient, compared with the uniform as a float:
timing only, not exact). Also the acceptance rate ``4^M / C(2M, M) / (4 s)`` and the
expected attempts a draw, its inverse. The script measures whichever checkout it sits in.

    .venv/bin/python benchmarks/exact_binomial_speed.py [--lo 10] [--hi 25] [--count 2000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from service.mechanisms.exact_binomial import (
    POPCOUNT_LIMIT,
    acceptance_rate,
    binomial_half_popcount,
    binomial_half_rejection,
    step_width,
)
from service.mechanisms.randomness import fresh_generator


def numpy_product(rng: np.random.Generator, u: int) -> int:
    """The rejection sampler's proposals, accepted with a numpy product (timing only)."""
    m = u // 2
    s = step_width(m)
    while True:
        words = rng.bit_generator.random_raw(3)
        first = int(words[0])
        negative = first & 1
        level = 0
        rest = first >> 1
        while rest & 1:
            level += 1
            rest >>= 1
        a = level * s + int(words[1]) % s + negative
        if a > m:
            continue
        j = np.arange(1, a + 1, dtype=np.float64)
        accept = float(np.prod((m - j + 1.0) / (m + j))) * 2.0**level
        if int(words[2]) * 2.0**-64 < accept:
            return m + (-a if negative else a)


def best_us(
    draw: Callable[[np.random.Generator, int], int], u: int, count: int, repeats: int
) -> float:
    rng = fresh_generator()
    draw(rng, u)
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(count):
            draw(rng, u)
        best = min(best, (time.perf_counter() - started) / count)
    return 1e6 * best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lo", type=int, default=10)
    parser.add_argument("--hi", type=int, default=25)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--popcount-words", type=int, default=1 << 24)
    args = parser.parse_args(argv)
    limit = POPCOUNT_LIMIT.bit_length() - 1
    print(f"binomial_half: the popcount up to u = {POPCOUNT_LIMIT} (2^{limit}), rejection above")
    print("| u | popcount us | rejection (numba) us | rejection (numpy product) us | "
          "attempts a draw | acceptance rate |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for k in range(args.lo, args.hi + 1):
        u = 1 << k
        pop_count = max(5, min(args.count, args.popcount_words // max(1, u // 64)))
        pop = best_us(binomial_half_popcount, u, pop_count, args.repeats)
        rej = best_us(binomial_half_rejection, u, args.count, args.repeats)
        nump = best_us(numpy_product, u, max(50, args.count // 10), args.repeats)
        rate = acceptance_rate(u // 2)
        print(f"| 2^{k} | {pop:.1f} | {rej:.1f} | {nump:.1f} | {1 / rate:.2f} | {rate:.3f} |",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
