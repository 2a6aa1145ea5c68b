"""Draws per second of the exact rounded-Laplace sampler next to numpy's float sampler.

For gamma = grid / scale = 2^-43 (the noisy diffusion's state grid on a large graph), ~1e-9
(a fine grid), 1/256 (a count release's grid), 1, 5/2 and 7, ``rounded_laplace``
(service/mechanisms/exact_laplace.py: raw 64-bit words, exact integer comparisons) against
``laplace_noise`` (numpy's float64 ziggurat exponential and sign words), best of ``--repeats``
runs of ``--count`` draws each, on a fresh OS-entropy generator, plus the raw words each exact
draw consumed on average. Rates are per second of wall-clock time and per second of this
process's CPU time (the latter is less sensitive to other load on the machine); the rows "per
call" draw ``--count`` in calls of ``--call`` draws (2n for a noisy diffusion step on n nodes:
the engine's calls before it drew the pair sum). The rows ``rounded_laplace_pair_sum`` draw the
pair sum round((L1 + L2) / gamma), one draw where the noisy diffusion took two Laplace draws
(a pair's rate is to be set beside half the Laplace rate); the rows "from a word stream" draw
it as the engine does (``pair_sum_from_stream``: an SFC64 word stream stepped in the compiled
kernel, clamped, in calls of ``--stream-call`` draws, one column's noisy step), and the rows
"columns in one call" draw ``--columns`` such columns in one call of ``pair_sums_from_streams``,
as a thread of the engine draws a block's step (one stream a column). The script
measures whichever checkout it sits in, so the same file copied into an older checkout
measures that one (the pair-sum rows are skipped where the sampler does not exist).

    .venv/bin/python benchmarks/exact_laplace_speed.py [--count 2000000] [--repeats 3] \
        [--call 200000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from service.mechanisms import exact_laplace
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


def best_rate(draw: object, count: int, repeats: int) -> tuple[float, float]:
    """The best draws per wall-clock second and per CPU second over ``repeats`` runs."""
    best_wall = best_cpu = 0.0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        draw(count)  # type: ignore[operator]
        best_wall = max(best_wall, count / (time.perf_counter() - wall))
        best_cpu = max(best_cpu, count / max(time.process_time() - cpu, 1e-9))
    return best_wall, best_cpu


def in_calls(rng: np.random.Generator, s: int, t: int, call: int) -> object:
    def draw(count: int) -> None:
        for start in range(0, count, call):
            rounded_laplace(rng, s, t, min(call, count - start))

    return draw


def stream_calls(from_stream: Any, s: int, t: int, call: int) -> object:
    """Draws in calls of ``call`` from one word stream, as one column's noisy steps."""
    from service.mechanisms.word_stream import stream_from

    stream = stream_from(fresh_generator())
    out = np.empty(call, dtype=np.int64)

    def draw(count: int) -> None:
        for start in range(0, count, call):
            from_stream(stream, s, t, out[: min(call, count - start)], 2**62)

    return draw


def columns_calls(from_streams: Any, s: int, t: int, call: int, columns: int) -> object:
    """Draws in calls of ``columns`` columns of ``call`` draws, each column from its own word
    stream, as one engine thread's share of a block's noisy step."""
    from service.mechanisms.word_stream import stream_from

    rng = fresh_generator()
    streams = np.stack([stream_from(rng) for _ in range(columns)])
    out = np.empty((columns, call), dtype=np.int64)
    rows = np.arange(columns, dtype=np.int64)

    def draw(count: int) -> None:
        for _ in range(0, count, call * columns):
            from_streams(streams, s, t, out, rows, 2**62)

    return draw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--call", type=int, default=200_000)
    parser.add_argument("--stream-call", type=int, default=4039)
    parser.add_argument("--columns", type=int, default=32)
    args = parser.parse_args(argv)
    rounded_laplace(fresh_generator(), 1, 3, 10)  # compile (or load the cache) first
    cases = {
        "2^-43": (1, 2**43),
        "1e-9": gamma_ratio(2.0**-30, dyadic_scale(2.0**-30 * 1e9)),
        "1/256": (1, 256),
        "1": (1, 1),
        "5/2": (5, 2),
        "7": (7, 1),
    }
    print(f"{args.count:,} draws, best of {args.repeats}")
    print("| sampler | gamma | draws/s | draws/CPU-s | raw words drawn per draw |")
    print("| --- | --- | --- | --- | --- |")
    for label, (s, t) in cases.items():
        rng = fresh_generator()
        wall, cpu = best_rate(
            lambda n, s=s, t=t, rng=rng: rounded_laplace(rng, s, t, n), args.count, args.repeats
        )
        counting = CountingWords()
        rounded_laplace(counting, s, t, args.count)
        per_draw = counting.words / args.count
        print(
            f"| exact rounded_laplace | {label} ({s}/{t}) | {wall:,.0f} | {cpu:,.0f} "
            f"| {per_draw:.2f} |"
        )
    for label in ("2^-43", "1/256"):
        s, t = cases[label]
        wall, cpu = best_rate(
            in_calls(fresh_generator(), s, t, args.call), args.count, args.repeats
        )
        print(
            f"| exact rounded_laplace, {args.call:,} per call | {label} ({s}/{t}) "
            f"| {wall:,.0f} | {cpu:,.0f} | - |"
        )
    pair_sum = getattr(exact_laplace, "rounded_laplace_pair_sum", None)
    for label in ("2^-43", "1e-9", "1/256") if pair_sum is not None else ():
        s, t = cases[label]
        rng = fresh_generator()
        wall, cpu = best_rate(lambda n, s=s, t=t, rng=rng: pair_sum(rng, s, t, n), args.count,
                              args.repeats)  # fmt: skip
        counting = CountingWords()
        pair_sum(counting, s, t, args.count)
        print(
            f"| exact rounded_laplace_pair_sum (a pair a draw) | {label} ({s}/{t}) | {wall:,.0f} "
            f"| {cpu:,.0f} | {counting.words / args.count:.2f} |"
        )
    from_stream = getattr(exact_laplace, "pair_sum_from_stream", None)
    for label in ("2^-43", "1e-9") if from_stream is not None else ():
        s, t = cases[label]
        wall, cpu = best_rate(
            stream_calls(from_stream, s, t, args.stream_call), args.count, args.repeats
        )
        print(
            f"| exact pair sum from a word stream, {args.stream_call:,} per call | {label} "
            f"({s}/{t}) | {wall:,.0f} | {cpu:,.0f} | - |"
        )
    from_streams = getattr(exact_laplace, "pair_sums_from_streams", None)
    block = args.stream_call * args.columns
    count = max(1, args.count // block) * block  # whole calls
    for label in ("2^-43", "1e-9") if from_streams is not None else ():
        s, t = cases[label]
        wall, cpu = best_rate(
            columns_calls(from_streams, s, t, args.stream_call, args.columns), count, args.repeats
        )
        print(
            f"| exact pair sum, {args.columns} columns of {args.stream_call:,} in one call "
            f"| {label} ({s}/{t}) | {wall:,.0f} | {cpu:,.0f} | - |"
        )
    rng = fresh_generator()
    wall, cpu = best_rate(lambda n: laplace_noise(rng, 1.0, n), args.count, args.repeats)
    print(f"| numpy ziggurat laplace_noise (float) | - | {wall:,.0f} | {cpu:,.0f} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
