"""Privacy audit at scale: the regression suite's cases with 200k draws per graph.

For every case of ``tests/privacy_audit.py`` (every served release and mode, worst-case
neighbouring pairs), the empirical lower bound on epsilon of the real release and of its
control (the noise scale divided by the case's ``bench_factor``, smaller than the test's),
printed as one table: mechanism, mode, neighbouring pair, draws per graph, the claim, the
pair's exact pure loss, the empirical lower bound at the stated confidence, the control's
factor and lower bound, and whether the control was caught (its bound above the claim). The
served releases that are post-processing of audited ones are listed under the table with the
audited release that covers them.

    .venv/bin/python benchmarks/privacy_audit.py                      # every case, 200k draws
                                                  # (about 13 CPU-minutes, and about 17 more for
                                                  # blended's row, one query a draw; the run
                                                  # prints its own)
    .venv/bin/python benchmarks/privacy_audit.py --only noisy_diffusion/edge --draws 50000
    .venv/bin/python benchmarks/privacy_audit.py --list               # the cases, no draws

The events are chosen on ``--selection`` further draws per graph; the bounds are one-sided
Clopper-Pearson at level alpha / (2 * events) each, so each row's bound holds with confidence
1 - ``--alpha``. Noise comes from a fresh OS-entropy generator per run (its entropy is printed).
CPU only, no network, no database. Not part of the test suite. A case that raises is reported
as an ERROR row and the run goes on. Exit status: 0 when every real release stays at or under
its claim and every control is caught, 1 otherwise (with ``--alpha`` 1e-3 and 29 cases, a
correct release still shows a violation with probability at most 2.9 percent), 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.privacy_audit import CASES, AuditCase, AuditResult, CaseSpec, NeighbourPair, audit

#: Served releases that are post-processing of audited ones, and the audited cases that cover
#: them (the exactness of the composition is tested in tests/test_ranking_sensitivity.py and
#: tests/test_embedding_api.py).
POST_PROCESSING = (
    ("blended", "personalized", "friends_of_friends' counts and popular's degrees; claim "
     "eps + eps_d, the sum of the two audited releases (its lazy top, blended_top, is also "
     "audited directly by its own row)"),
    ("friends_of_friends ranking", "personalized", "friends_of_friends' two-scale counts"),
    ("embeddings/free", "edge, personalized", "the stored noisy_diffusion release it embeds"),
)  # fmt: skip

HEADER = (
    "| mechanism | mode | pair | draws per graph (+selection) | claimed eps (delta) "
    "| pair's exact pure loss | empirical lower bound | control (noise / factor) "
    "| control's lower bound | control caught |"
)


def _format(value: float) -> str:
    return "-inf" if value == -np.inf else f"{value:.3f}"


def _audit(
    case: AuditCase, pair: NeighbourPair, args: argparse.Namespace, rng: np.random.Generator
) -> AuditResult:
    return audit(
        pair, claimed_epsilon=case.claimed_epsilon, delta=case.delta, draws=args.draws,
        selection_draws=args.selection, rng=rng, alpha=args.alpha,
    )  # fmt: skip


def _mode(spec: CaseSpec) -> str:
    return spec.mode if spec.steps is None else f"{spec.mode}, K={spec.steps}"


def _run_case(
    spec: CaseSpec, args: argparse.Namespace, rng: np.random.Generator
) -> tuple[str, bool]:
    """The case's table row, and whether it held (real under the claim, control caught)."""
    started = time.perf_counter()
    case = spec.build(spec.bench_factor)
    real, control = (_audit(case, pair, args, rng) for pair in (case.real, case.control))
    loss = "n/a" if case.pair_loss is None else f"{case.pair_loss:.3f}"
    caught = control.epsilon_lb > case.claimed_epsilon
    row = (
        f"| {case.mechanism} | {_mode(spec)} | {case.pair} | {args.draws} (+{args.selection}) "
        f"| {case.claimed_epsilon:.4f} ({case.delta:g}) | {loss} | {_format(real.epsilon_lb)} "
        f"| {spec.bench_factor:g}x | {_format(control.epsilon_lb)} | {'yes' if caught else 'NO'} |"
    )
    print(row, flush=True)
    print(
        f"#   {time.perf_counter() - started:.0f} s; real: {real.event}, p {real.p_hat:.5f} "
        f"q {real.q_hat:.5f}; control: {control.event}, p {control.p_hat:.5f} "
        f"q {control.q_hat:.5f}",
        flush=True,
    )
    held = real.epsilon_lb <= case.claimed_epsilon
    if not held:
        print(f"#   VIOLATION: {spec.name} shows more than its claim", flush=True)
    if not caught:
        print(f"#   control not caught at {spec.bench_factor:g}x", flush=True)
    return row, held and caught


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--draws", type=int, default=200_000, help="evaluation draws per graph")
    parser.add_argument("--selection", type=int, default=50_000, help="selection draws per graph")
    parser.add_argument("--alpha", type=float, default=1e-3, help="1 - confidence of each bound")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    args = parser.parse_args(argv)
    if args.draws < 1 or args.selection < 1 or not 0.0 < args.alpha < 1.0:
        print("privacy_audit: --draws and --selection must be >= 1, --alpha in (0, 1)")
        return 2
    specs = [spec for spec in CASES if args.only in spec.name]
    if not specs:
        print(f"privacy_audit: no case name contains {args.only!r} (see --list)")
        return 2
    if args.list:
        print("\n".join(spec.name for spec in specs))
        return 0
    entropy = secrets.randbits(128)
    rng = np.random.Generator(np.random.PCG64DXSM(entropy))
    print(
        f"# {len(specs)} cases, {args.draws} draws per graph (+{args.selection} to choose the "
        f"events), confidence {1 - args.alpha} per bound, entropy {entropy}",
        flush=True,
    )
    print(HEADER, flush=True)
    rows = [HEADER, "| " + " | ".join(["---"] * 10) + " |"]
    failed: list[str] = []
    started = time.perf_counter()
    for spec in specs:
        try:
            row, held = _run_case(spec, args, rng)
        except Exception:  # a broken case is reported, the others still run
            traceback.print_exc()
            row, held = f"| {spec.mechanism} | {_mode(spec)} | {spec.pair} | ERROR |", False
            print(row, flush=True)
        rows.append(row)
        if not held:
            failed.append(spec.name)
    print()
    print("\n".join(rows))
    print()
    for mechanism, mode, covered in POST_PROCESSING:
        print(f"# {mechanism} ({mode}): post-processing of {covered}")
    cpu = time.process_time()
    print(f"# {time.perf_counter() - started:.0f} s wall, {cpu:.0f} s CPU in this process")
    if failed:
        print(f"# NOT HELD ({len(failed)}): {', '.join(failed)}")
        return 1
    print(f"# all {len(specs)} cases held: every real release at or under its claim, "
          "every control caught")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
