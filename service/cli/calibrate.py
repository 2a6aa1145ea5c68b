"""``calibrate``: the noise scale and noisy steps for a per-query (epsilon, delta) target."""

from __future__ import annotations

import argparse
import math
from typing import Any

from service.cli.arg_types import open_unit_float, positive_float
from service.cli.common import add_mechanism_arguments, print_json, print_table


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="noise scale for a target epsilon",
        description="Calibrate the noisy diffusion: the smallest noise scale b (rounded up) whose "
        "RDP curve converts to at most EPSILON at DELTA, and the number of noisy steps.",
    )
    parser.add_argument("--epsilon", type=positive_float, required=True)
    parser.add_argument("--delta", type=open_unit_float, required=True)
    add_mechanism_arguments(parser, eta=1.0)
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from service.privacy.calibration import calibrate, plan_diffusion

    plan = plan_diffusion(args.epsilon, args.delta, args.steps, args.beta, args.eta, args.mode)
    c = calibrate(args.epsilon, args.delta, args.steps, args.beta, args.mode).c
    config = plan.config
    payload: dict[str, Any] = {
        "mode": config.mode.value,
        "beta": config.beta,
        "steps": config.steps,
        "eta": config.eta,
        "delta": plan.delta,
        "target_epsilon": args.epsilon,
        "epsilon": plan.epsilon,
        "noise_scale": config.noise_scale,
        "noise_ratio": None if math.isinf(c) else c,
        "noisy_steps": config.noisy_steps,
        "pure_epsilon": plan.curve.pure,
    }
    if args.json:
        print_json(payload)
    else:
        print_table(["field", "value"], [[k, f"{v}"] for k, v in payload.items()])
    return 0
