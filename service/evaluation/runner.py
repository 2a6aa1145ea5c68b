"""Ranking quality of every mechanism against exact PPR, over a sample of seeds (evaluation.md).

For each sampled seed (uniform over nodes of degree >= 1) the exact PPR is computed once and
reused for every mechanism and epsilon. Each mechanism's ranking is scored twice:

- ``ndcg`` / ``recall``: the papers' metric, the seed excluded from both lists;
- ``ndcg_beyond`` / ``recall_beyond``: the seed and its neighbours excluded from both lists
  (the private ranking is the top-k among non-neighbours).

Mechanisms: ``noisy_diffusion`` (the spec's Mechanism 1, calibrated by ``plan_diffusion``),
``pushflowcap`` (DP-PushFlowCap, sigma = 1e-6 by default), ``edge_flipping`` (only on graphs of
at most ``edge_flipping_max_nodes`` nodes; skipped with a note otherwise), the two baselines
beyond the neighbours of privacy-spec.md: ``popular`` (degrees + Lap(2 / eps_d), ONE release
for the whole run, as the service makes one per graph version; it does not depend on the
per-query epsilon) and ``common_neighbours`` (|N(s) & N(v)| + Lap(2 / eps) per query,
personalized mode only; skipped with a note in edge mode), ``friends_of_friends`` (the same
counts with Lap(2 / eps) on the seed's friends and Lap(1 / eps) on everyone else, friends first;
personalized only), ``blended`` (those two-scale counts and the degrees blended by a hold-out
check on the seed's own friends; personalized only; its degree release is the same one
``popular`` uses), and two baselines that use no
private data: ``neighbours_only`` (the seed's neighbours in random order, then random nodes)
and ``random``. The baselines that do not depend on epsilon are drawn once per seed and
reported under every epsilon. The row ``default`` repeats the service's default ranking
(``PPR_DEFAULT_MECHANISM`` as resolved for the mode) under that name.

Randomness: ``rng`` drives the seed sample and the two baselines (it may be seeded for a
reproducible sample: evaluation is not the serving path); the private mechanisms' noise always
comes from fresh OS-entropy generators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from service.errors import InvalidParameter
from service.evaluation.metrics import (
    json_interval,
    json_number,
    mean_ci,
    ndcg_at_k,
    private_ranking,
    recall_at_k,
)
from service.evaluation.options import DEFAULT_ETA, DEFAULT_POPULAR_EPSILON, MECHANISMS
from service.graph.model import Graph
from service.mechanisms.blended import blended_ranking
from service.mechanisms.common_neighbours import noisy_common_neighbours
from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
from service.mechanisms.edge_flipping import DEFAULT_MAX_NODES, edge_flipping_ppr
from service.mechanisms.exact import exact_ppr
from service.mechanisms.friends_of_friends import friends_of_friends
from service.mechanisms.popular import noisy_degrees
from service.mechanisms.pushflowcap import DEFAULT_SIGMA, add_laplace_noise, pushflowcap
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.registry import DEFAULT_MECHANISM, RankingMechanism, resolve_mechanism
from service.privacy.calibration import DiffusionPlan, plan_diffusion, validate_diffusion_parameters
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    plan_laplace,
    plan_two_scale,
)
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_ETA",
    "DEFAULT_MECHANISMS",
    "DEFAULT_POPULAR_EPSILON",
    "DEFAULT_ROW",
    "MECHANISMS",
    "EvaluationRow",
    "default_delta",
    "evaluate",
    "sample_seeds",
    "validate_parameters",
]

DEFAULT_MECHANISMS = MECHANISMS
#: The extra row that shows the service's default ranking (PPR_DEFAULT_MECHANISM, resolved for
#: the mode as the service resolves it: a personalized-only default is noisy_diffusion in edge
#: mode). Its numbers are those of the mechanism it resolves to, from the same draws.
DEFAULT_ROW = "default"
#: Mechanisms that exist in personalized mode only (unbounded sensitivity in edge mode).
PERSONALIZED_ONLY = frozenset({"common_neighbours", "friends_of_friends", "blended"})

CI = tuple[float, float]


@dataclass(frozen=True)
class EvaluationRow:
    """Mean metrics of one mechanism at one epsilon, with 95% t-intervals over the seeds."""

    mechanism: str
    epsilon: float
    ndcg: float
    ndcg_ci: CI
    recall: float
    recall_ci: CI
    ndcg_beyond: float
    ndcg_beyond_ci: CI
    recall_beyond: float
    recall_beyond_ci: CI
    seeds: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; NaN (undefined) becomes None, intervals become [low, high]."""

        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "ndcg": json_number(self.ndcg),
            "ndcg_ci": json_interval(self.ndcg_ci),
            "recall": json_number(self.recall),
            "recall_ci": json_interval(self.recall_ci),
            "ndcg_beyond": json_number(self.ndcg_beyond),
            "ndcg_beyond_ci": json_interval(self.ndcg_beyond_ci),
            "recall_beyond": json_number(self.recall_beyond),
            "recall_beyond_ci": json_interval(self.recall_beyond_ci),
            "seeds": self.seeds,
        }


def default_delta(graph: Graph) -> float:
    """delta = min(1e-6, 1 / |E|): the service's default delta of new accounts."""
    return min(1e-6, 1.0 / max(graph.m, 1))


def validate_parameters(
    epsilons: Sequence[float],
    seeds_count: int,
    k: int,
    eta: float,
    delta: float | None,
    beta: float,
    steps: int,
    mechanisms: Sequence[str],
    sigma: float = DEFAULT_SIGMA,
    popular_epsilon: float = DEFAULT_POPULAR_EPSILON,
) -> None:
    """Raise :class:`InvalidParameter` naming the first bad parameter (``delta`` None: default)."""
    if len(epsilons) == 0:
        raise InvalidParameter("epsilon", "give at least one epsilon")
    for eps in epsilons:
        validate_diffusion_parameters(epsilon=eps)
    validate_diffusion_parameters(steps=steps, beta=beta, eta=eta)
    if delta is not None:
        validate_diffusion_parameters(delta=delta)
    for name, value in (("seeds", seeds_count), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameter(name, f"must be an integer >= 1, got {value!r}")
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma > 0):
        raise InvalidParameter("sigma", f"must be a finite number > 0, got {sigma!r}")
    if not (
        isinstance(popular_epsilon, int | float)
        and math.isfinite(popular_epsilon)
        and popular_epsilon > 0
    ):
        raise InvalidParameter(
            "popular_epsilon", f"must be a finite number > 0, got {popular_epsilon!r}"
        )
    if len(mechanisms) == 0:
        raise InvalidParameter("mechanisms", "give at least one mechanism")
    unknown = [m for m in mechanisms if m not in MECHANISMS]
    if unknown:
        raise InvalidParameter(
            "mechanisms", f"unknown {', '.join(map(repr, unknown))}; known: {', '.join(MECHANISMS)}"
        )


def sample_seeds(graph: Graph, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct nodes of degree >= 1, uniformly (all of them if there are fewer)."""
    eligible = np.flatnonzero(graph.degrees >= 1)
    if eligible.shape[0] == 0:
        raise InvalidParameter("graph", "has no node of degree >= 1 to use as a seed")
    size = min(count, eligible.shape[0])
    return np.sort(rng.choice(eligible, size=size, replace=False))


def _score(
    scores: np.ndarray, exact: np.ndarray, k: int, only_seed: np.ndarray, beyond: np.ndarray
) -> tuple[float, float, float, float]:
    """(ndcg, recall, ndcg_beyond, recall_beyond) of one released vector."""
    head = private_ranking(scores, k, only_seed)
    tail = private_ranking(scores, k, beyond)
    return (
        ndcg_at_k(head, exact, k, only_seed),
        recall_at_k(head, exact, k, only_seed),
        ndcg_at_k(tail, exact, k, beyond),
        recall_at_k(tail, exact, k, beyond),
    )


def _neighbours_first(graph: Graph, seed: int, rng: np.random.Generator) -> np.ndarray:
    """Scores ranking the seed's neighbours in random order, then every other node at random."""
    scores = rng.random(graph.n)
    scores[graph.neighbors(seed)] += 1.0
    return scores


def evaluate(
    graph: Graph,
    epsilons: Sequence[float],
    seeds_count: int = 20,
    k: int = 100,
    eta: float = DEFAULT_ETA,
    delta: float | None = None,
    beta: float = 0.8,
    steps: int = 100,
    mechanisms: Sequence[str] = DEFAULT_MECHANISMS,
    mode: Mode | str = Mode.PERSONALIZED,
    rng: np.random.Generator | None = None,
    *,
    sigma: float = DEFAULT_SIGMA,
    popular_epsilon: float = DEFAULT_POPULAR_EPSILON,
    edge_flipping_max_nodes: int = DEFAULT_MAX_NODES,
    progress: Callable[[str], None] | None = None,
    notes: list[str] | None = None,
    default_mechanism: str = DEFAULT_MECHANISM.value,
) -> list[EvaluationRow]:
    """Mean NDCG@k / Recall@k (and the beyond-neighbours variants) per mechanism and epsilon.

    ``delta`` defaults to min(1e-6, 1 / |E|), as in the service; ``steps`` is the diffusion's
    K and PushFlowCap's R.
    Rows are ordered by epsilon, then by the order of ``mechanisms``. Reasons for skipped
    mechanisms are appended to ``notes`` (when given) and sent to ``progress``.
    """
    validate_parameters(
        epsilons, seeds_count, k, eta, delta, beta, steps, mechanisms, sigma, popular_epsilon
    )
    try:
        mode = Mode(mode)
    except ValueError:
        raise InvalidParameter("mode", f"must be one of {[m.value for m in Mode]}") from None
    delta = default_delta(graph) if delta is None else delta
    mechanisms = list(dict.fromkeys(mechanisms))
    epsilons = [float(e) for e in dict.fromkeys(epsilons)]
    rng = rng if rng is not None else np.random.default_rng()

    def note(text: str) -> None:
        if notes is not None:
            notes.append(text)
        if progress is not None:
            progress(text)

    if "edge_flipping" in mechanisms and graph.n > edge_flipping_max_nodes:
        note(
            f"edge_flipping skipped: O(n^2) and the graph has {graph.n} nodes "
            f"(limit {edge_flipping_max_nodes})"
        )
        mechanisms.remove("edge_flipping")
    if mode is Mode.EDGE:
        for name in [m for m in mechanisms if m in PERSONALIZED_ONLY]:
            note(f"{name} skipped: personalized mode only (unbounded sensitivity in edge mode)")
            mechanisms.remove(name)
    reported = list(mechanisms)
    resolved = DEFAULT_ROW
    if DEFAULT_ROW in mechanisms:
        resolved = resolve_mechanism(None, mode, default_mechanism).value
        note(f"default = {resolved} (the service's default in {mode.value} mode)")
        mechanisms.remove(DEFAULT_ROW)
        if resolved not in mechanisms:
            mechanisms.append(resolved)

    plans: dict[float, DiffusionPlan] = {}
    if RankingMechanism.NOISY_DIFFUSION in mechanisms:
        plans = {eps: plan_diffusion(eps, delta, steps, beta, eta, mode) for eps in epsilons}

    degrees_released: np.ndarray | None = None
    degree_plan = plan_laplace(popular_epsilon, DEGREE_SENSITIVITY)
    if "popular" in mechanisms or "blended" in mechanisms:
        # one graph-wide release shared by every seed, as the service makes one per version
        degrees_released = noisy_degrees(graph, degree_plan, fresh_generator())
    cn_plans = {eps: plan_laplace(eps, COMMON_NEIGHBOUR_SENSITIVITY) for eps in epsilons}
    two_scale_plans = {eps: plan_two_scale(eps) for eps in epsilons}

    seeds = sample_seeds(graph, seeds_count, rng)
    # results[(mechanism, eps)] = rows of (ndcg, recall, ndcg_beyond, recall_beyond)
    results: dict[tuple[str, float], list[tuple[float, float, float, float]]] = {
        (m, eps): [] for m in mechanisms for eps in epsilons
    }

    for number, seed_value in enumerate(seeds, start=1):
        seed = int(seed_value)
        exact = exact_ppr(graph, seed, beta)
        only_seed = np.array([seed], dtype=np.int64)
        beyond = np.concatenate([only_seed, graph.neighbors(seed).astype(np.int64)])

        score = partial(_score, exact=exact, k=k, only_seed=only_seed, beyond=beyond)

        free: dict[str, tuple[float, float, float, float]] = {}
        if "neighbours_only" in mechanisms:
            free["neighbours_only"] = score(_neighbours_first(graph, seed, rng))
        if "random" in mechanisms:
            free["random"] = score(rng.random(graph.n))
        if degrees_released is not None and "popular" in mechanisms:
            free["popular"] = score(degrees_released)
        capped = (
            pushflowcap(graph, seed, beta, steps, sigma, mode)
            if "pushflowcap" in mechanisms
            else None
        )
        prefixes: dict[int, np.ndarray] = {}

        for eps in epsilons:
            for mechanism in mechanisms:
                if mechanism in free:
                    values = free[mechanism]
                elif mechanism == RankingMechanism.NOISY_DIFFUSION:
                    config = plans[eps].config
                    m = config.noise_free_steps
                    if m not in prefixes:
                        prefixes[m] = noise_free_prefix(graph, seed, mode, beta, eta, m)
                    released = noisy_diffusion(
                        graph, seed, config, rng=fresh_generator(), prefix=prefixes[m]
                    )
                    values = score(released)
                elif mechanism == "common_neighbours":
                    released = noisy_common_neighbours(
                        graph, seed, cn_plans[eps], fresh_generator(), mode
                    )
                    values = score(released)
                elif mechanism == "friends_of_friends":
                    released = friends_of_friends(
                        graph, seed, two_scale_plans[eps], fresh_generator(), mode
                    )
                    values = score(released)
                elif mechanism == "blended":
                    assert degrees_released is not None
                    blended = blended_ranking(
                        graph, seed, two_scale_plans[eps], degrees_released, degree_plan.scale,
                        fresh_generator(), mode,
                    )  # fmt: skip
                    values = score(blended.scores)
                elif mechanism == "pushflowcap":
                    assert capped is not None
                    values = score(add_laplace_noise(capped, sigma, eps, fresh_generator()))
                else:  # edge_flipping
                    flipped = edge_flipping_ppr(
                        graph, seed, beta, eps, mode, fresh_generator(),
                        max_nodes=edge_flipping_max_nodes,
                    )  # fmt: skip
                    values = score(flipped)
                results[(mechanism, eps)].append(values)
        if progress is not None:
            progress(f"seed {number}/{len(seeds)} done")

    rows: list[EvaluationRow] = []
    for eps in epsilons:
        for mechanism in reported:
            source = resolved if mechanism == DEFAULT_ROW else mechanism
            table = np.array(results[(source, eps)], dtype=np.float64).reshape(-1, 4)
            summaries = [mean_ci(table[:, j]) for j in range(4)]
            rows.append(
                EvaluationRow(
                    mechanism=mechanism,
                    epsilon=eps,
                    ndcg=summaries[0][0],
                    ndcg_ci=summaries[0][1],
                    recall=summaries[1][0],
                    recall_ci=summaries[1][1],
                    ndcg_beyond=summaries[2][0],
                    ndcg_beyond_ci=summaries[2][1],
                    recall_beyond=summaries[3][0],
                    recall_beyond_ci=summaries[3][1],
                    seeds=int(seeds.shape[0]),
                )
            )
    return rows
