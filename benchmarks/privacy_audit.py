"""Privacy audit at scale: the regression suite's cases with 200k draws per graph.

For every case of ``tests/privacy_audit.py`` (every served release and mode, worst-case
neighbouring pairs), the empirical lower bound on epsilon of the real release and of its
control (the noise scale divided by the case's ``bench_factor``, smaller than the test's),
printed as a table: mechanism, mode, pair, the claim, the pair's exact pure loss, the empirical
lower bound at the stated confidence, and the control's.

    .venv/bin/python benchmarks/privacy_audit.py                      # every case, 200k draws
    .venv/bin/python benchmarks/privacy_audit.py --only noisy_diffusion/edge --draws 50000

The events are chosen on ``--selection`` further draws per graph; the bounds are one-sided
Clopper-Pearson at level alpha / (2 * events) each, so each row's bound holds with confidence
1 - ``--alpha``. Noise comes from a fresh OS-entropy generator per run (its entropy is printed).
CPU only, no network, no database. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.privacy_audit import CASES, AuditCase, AuditResult, NeighbourPair, audit


def _format(value: float) -> str:
    return "-inf" if value == -np.inf else f"{value:.3f}"


def _audit(
    case: AuditCase, pair: NeighbourPair, args: argparse.Namespace, rng: np.random.Generator
) -> AuditResult:
    return audit(
        pair, claimed_epsilon=case.claimed_epsilon, delta=case.delta, draws=args.draws,
        selection_draws=args.selection, rng=rng, alpha=args.alpha,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200_000, help="evaluation draws per graph")
    parser.add_argument("--selection", type=int, default=50_000, help="selection draws per graph")
    parser.add_argument("--alpha", type=float, default=1e-3, help="1 - confidence of each bound")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args(argv)
    if args.draws < 1 or args.selection < 1 or not 0.0 < args.alpha < 1.0:
        print("privacy_audit: --draws and --selection must be >= 1, --alpha in (0, 1)")
        return 2
    entropy = secrets.randbits(128)
    rng = np.random.Generator(np.random.PCG64DXSM(entropy))
    print(
        f"# {args.draws} draws per graph (+{args.selection} to choose the events), confidence "
        f"{1 - args.alpha} per bound, entropy {entropy}",
        flush=True,
    )
    header = (
        "| mechanism | mode | pair | claimed eps (delta) | pair's exact pure loss "
        "| empirical lower bound | control (noise / factor) | control's lower bound |"
    )
    rows = [header, "| " + " | ".join(["---"] * 8) + " |"]
    print(header, flush=True)
    for spec in CASES:
        if args.only not in spec.name:
            continue
        started = time.perf_counter()
        case = spec.build(spec.bench_factor)

        real, control = (_audit(case, pair, args, rng) for pair in (case.real, case.control))
        loss = "n/a" if case.pair_loss is None else f"{case.pair_loss:.3f}"
        mode = case.mode if spec.steps is None else f"{case.mode}, K={spec.steps}"
        row = (
            f"| {case.mechanism} | {mode} | {case.pair} | {case.claimed_epsilon:.4f} "
            f"({case.delta:g}) | {loss} | {_format(real.epsilon_lb)} | {spec.bench_factor:g}x "
            f"| {_format(control.epsilon_lb)} |"
        )
        rows.append(row)
        print(row, flush=True)
        print(
            f"#   {time.perf_counter() - started:.0f} s; real: {real.event}, p {real.p_hat:.5f} "
            f"q {real.q_hat:.5f}; control: {control.event}, p {control.p_hat:.5f} "
            f"q {control.q_hat:.5f}",
            flush=True,
        )
        if real.epsilon_lb > case.claimed_epsilon:
            print(f"#   VIOLATION: {case.name} shows more than its claim", flush=True)
        if control.epsilon_lb <= case.claimed_epsilon:
            print(f"#   control not caught at {spec.bench_factor}x", flush=True)
    print()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
