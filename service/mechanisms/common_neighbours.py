"""``common_neighbours`` (personalized mode only): c(v) = |N(s) & N(v)| + Lap(2 / eps).

With the seed's own edges public to the seed, an edge {a, b} with a, b != s changes c(b) by 1
iff a is in N(s), and c(a) by 1 iff b is in N(s), and nothing else: l1 sensitivity 2, so one
release is pure eps-DP for the protected edges (docs/ranking.md; brute-forced in
tests/test_ranking_sensitivity.py). In `edge` mode an edge {s, a} changes c on all of N(a):
unbounded, so the mechanism is refused there.
"""

from __future__ import annotations

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.mechanisms.operator import walk_operator
from service.mechanisms.randomness import fresh_generator
from service.privacy.laplace import COMMON_NEIGHBOUR_SENSITIVITY, LaplacePlan
from service.privacy.modes import Mode

__all__ = ["common_neighbour_counts", "noisy_common_neighbours", "require_personalized"]


def require_personalized(mode: Mode | str, mechanism: str) -> None:
    if Mode(mode) is not Mode.PERSONALIZED:
        raise InvalidParameter(
            "mechanism",
            f"{mechanism} uses the seed's own edges, which edge mode protects "
            "(its sensitivity there is unbounded); use mode=personalized",
        )


def common_neighbour_counts(graph: Graph, seed: int) -> np.ndarray:
    """c(v) = |N(seed) & N(v)| for every node v (exact, float64; c(seed) = d(seed))."""
    if not 0 <= seed < graph.n:
        raise InvalidParameter("seed", f"internal index {seed} is outside [0, {graph.n})")
    indicator = np.zeros(graph.n, dtype=np.float64)
    indicator[graph.neighbors(seed)] = 1.0
    # A @ indicator on the graph's own index arrays (exact: sums of ones), without building
    # a float64 data array of 8 bytes per stored entry in every worker
    return walk_operator(graph).adjacency_product(indicator)


def noisy_common_neighbours(
    graph: Graph,
    seed: int,
    plan: LaplacePlan,
    rng: np.random.Generator | None = None,
    mode: Mode | str = Mode.PERSONALIZED,
) -> np.ndarray:
    """c + Lap(plan.scale)^n. ``rng`` defaults to a fresh OS-entropy generator."""
    require_personalized(mode, "common_neighbours")
    if plan.sensitivity < COMMON_NEIGHBOUR_SENSITIVITY:
        raise InvalidParameter(
            "sensitivity",
            f"common-neighbour counts have sensitivity {COMMON_NEIGHBOUR_SENSITIVITY}",
        )
    counts = common_neighbour_counts(graph, seed)
    rng = rng if rng is not None else fresh_generator()
    return counts + rng.laplace(0.0, plan.scale, graph.n)
