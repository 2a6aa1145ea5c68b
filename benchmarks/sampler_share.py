"""What the float sampler's share of delta costs an account (docs/privacy.md, section 5).

For k count answers at one epsilon, the account's epsilon at delta 1e-6 composed from count
releases drawn now (``count_release_curve``: exact sampler, no share, the Laplace curves alone)
and from count releases drawn with the float sampler before it (the same curves carrying the
``2e-11`` share per answer that their stored charges keep).

    .venv/bin/python benchmarks/sampler_share.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.privacy.curves import laplace_curve
from service.privacy.laplace import count_release_curve
from service.privacy.sampler import FLOAT_COUNT_RELEASE_TV

DELTA = 1e-6


def main() -> int:
    print(f"| answers | eps | exact sampler, now (delta {DELTA:g}) | float sampler, before |")
    print("| --- | --- | --- | --- |")
    for eps in (0.1, 0.01):
        for k in (1, 10, 16, 100, 1000, 10_000):
            now = (count_release_curve(eps) * k).epsilon(DELTA)
            before = (laplace_curve(eps).with_sampler_tv(FLOAT_COUNT_RELEASE_TV) * k).epsilon(DELTA)
            print(f"| {k:,} | {eps:g} | {now:.10g} | {before:.10g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
