"""Composed costs quoted in the README and docs/privacy.md ("Who learns what", section 5): n
answers at eps 0.1 each, composed by the service's own accountant and converted at delta 1e-6.

    .venv/bin/python benchmarks/composed_costs.py

Two kinds of answer compose differently: ``noisy_diffusion`` (the default mechanism; its
corrected RDP curve at the default beta 0.8 and K 100, ``personalized``) and a count release
(``common_neighbours``, ``friends_of_friends``, ``blended``'s counts, the degree release behind
``popular``: the Laplace curve with the sampler's share of delta, section 5). A coalition's
figure is the same composition over every answer its members received (16 per account here).
Deterministic: no noise is drawn.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.privacy.accountant import RdpCurve
from service.privacy.calibration import plan_diffusion
from service.privacy.laplace import count_release_curve
from service.privacy.modes import Mode

EPSILON, DELTA = 0.1, 1e-6
ANSWERS = (1, 10, 16, 100)
ACCOUNTS = (2, 10, 4039)  # 4,039: every user of ego-Facebook
PER_ACCOUNT = 16


def _composed(curve: RdpCurve, count: int) -> str:
    return f"{(curve * count).epsilon(DELTA):.3f}"


def main() -> int:
    diffusion = plan_diffusion(EPSILON, DELTA, 100, 0.8, 1e-7, Mode.PERSONALIZED).curve
    counts = count_release_curve(EPSILON)
    print(f"# answers at eps {EPSILON} each, composed and converted at delta {DELTA:g}")
    print("| answers | noisy_diffusion (personalized, K 100) | count releases |")
    print("| --- | --- | --- |")
    for n in ANSWERS:
        print(f"| {n} | {_composed(diffusion, n)} | {_composed(counts, n)} |")
    degree = count_release_curve(EPSILON)  # the degree release at eps_d 0.1, paid once
    print(f"\n10 count answers plus the degree release (eps_d {EPSILON}): "
          f"{(counts * 10 + degree).epsilon(DELTA):.3f}")  # fmt: skip
    print(f"\n# a coalition of accounts, {PER_ACCOUNT} answers at eps {EPSILON} each")
    print("| accounts | noisy_diffusion | count releases |")
    print("| --- | --- | --- |")
    for k in ACCOUNTS:
        n = k * PER_ACCOUNT
        print(f"| {k} | {_composed(diffusion, n)} | {_composed(counts, n)} |")
    if counts.sampler_tv > 0:
        print(
            f"\n# inf: the count releases' sampler share ({counts.sampler_tv:g} per answer) "
            "times 1 + e^eps used up delta (docs/privacy.md, section 5)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
