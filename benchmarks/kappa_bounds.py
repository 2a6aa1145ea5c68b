"""kappa (the float64 margin of the diffusion's noise) at each graph's own largest degree and at
candidate public bounds (docs/privacy.md, "kappa: the float64 margin from a public bound").

    .venv/bin/python benchmarks/kappa_bounds.py [--facebook ../shared/data/facebook_combined.txt]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from service.graph.demo import demo_graph
from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list
from service.privacy.floating import float64_distortion_margin

ETA, BETA = 1e-7, 0.8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--facebook", type=Path, default=Path("../shared/data/facebook_combined.txt")
    )
    args = parser.parse_args()
    graphs = {
        "demo": demo_graph(),
        "generated 100k/2M (seed 0)": generate_graph(100_000, 2_000_000, seed=0),
    }
    if args.facebook.is_file():
        graphs["ego-Facebook"] = load_edge_list(args.facebook)
    print(f"{'graph':28s} {'nodes':>8s} {'edges':>9s} {'max degree':>10s} {'kappa(own)':>11s}")
    for name, graph in graphs.items():
        kappa = float64_distortion_margin(graph.stats.degree_max, ETA, BETA)
        print(f"{name:28s} {graph.n:8d} {graph.m:9d} {graph.stats.degree_max:10d} {kappa:11.3g}")
    for bound in (1_000, 5_000, 10_000, 20_000, 50_000, 100_000):
        print(f"bound {bound:>7d}: kappa {float64_distortion_margin(bound, ETA, BETA):.3g}")


if __name__ == "__main__":
    main()
