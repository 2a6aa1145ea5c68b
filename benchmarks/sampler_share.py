"""What the float sampler's share of delta costs an account (docs/privacy.md, section 5).

For k count answers at one epsilon, the account's epsilon at delta 1e-6 composed from the
Laplace curves alone (the accounting before the share) and with the share taken out of delta
(``count_release_curve``: the same curve carrying ``2e-11`` per answer).

    .venv/bin/python benchmarks/sampler_share.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.privacy.curves import laplace_curve
from service.privacy.laplace import count_release_curve

DELTA = 1e-6


def main() -> int:
    print(f"| answers | eps | before (delta {DELTA:g}) | after |")
    print("| --- | --- | --- | --- |")
    for eps in (0.1, 0.01):
        for k in (1, 10, 16, 100, 1000, 10_000):
            before = (laplace_curve(eps) * k).epsilon(DELTA)
            after = (count_release_curve(eps) * k).epsilon(DELTA)
            print(f"| {k:,} | {eps:g} | {before:.10g} | {after:.10g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
