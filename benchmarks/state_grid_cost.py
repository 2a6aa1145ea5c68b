"""What the diffusion's state grid costs in noise (docs/privacy.md, "The diffusion on a grid").

For graph sizes n, public degree bounds D and calibrated scales b (as b / eta), prints the grid
g the plan chooses, gamma = g / b'', and the extra noise ``b'' / b - 1`` split into its parts:
the float64 distortion margin kappa, the float64 kernel's error on any state (s_float / rho), the
grid's rounding (``(1 + beta) n g / rho``) and the rounding of b'' to 8 significant bits.

    .venv/bin/python benchmarks/state_grid_cost.py [--eta 1e-7] [--beta 0.8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.privacy.floating import float64_distortion_margin
from service.privacy.state_grid import float_contraction_slack, step_noise_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eta", type=float, default=1e-7)
    parser.add_argument("--beta", type=float, default=0.8)
    args = parser.parse_args()
    eta, beta = args.eta, args.beta
    rho = 2 * beta * eta
    print(f"eta {eta:g}, beta {beta:g}, rho {rho:g}")
    print("| n | D | b / eta | grid g | gamma = g / b'' | kappa | s_float / rho "
          "| grid / rho | b'' / b - 1 |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, degree in ((4_039, 10_000), (20_000, 10_000), (100_000, 10_000), (10**6, 10_000),
                      (10**6, 1_000), (10**7, 1_000)):  # fmt: skip
        for c in (80.0, 800.0):
            b = eta * c
            plan = step_noise_plan(b, n=n, max_degree=degree, eta=eta, beta=beta)
            kappa = float64_distortion_margin(degree, eta, beta)
            s_float = float_contraction_slack(n, degree, eta, beta)
            grid_part = (plan.slack - s_float) / rho
            print(f"| {n:,} | {degree:,} | {c:g} | {plan.grid:.3g} | {plan.gamma:.3g} "
                  f"| {kappa:.2g} | {s_float / rho:.2g} | {grid_part:.2g} "
                  f"| {plan.scale / b - 1:.4f} |")  # fmt: skip


if __name__ == "__main__":
    main()
