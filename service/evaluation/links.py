"""Link prediction: do the rankings find the friends a user has not made yet? (``evaluate --task
links``)

Protocol, stated exactly:

- **Split.** A uniformly random 10% (``hidden_fraction``) of the graph's undirected edges,
  rounded down, is hidden, chosen by a generator seeded with ``split_seed`` (default 0: the same
  split every run). Every mechanism serves from the graph of the remaining edges, on the same
  nodes: counts, diffusions and the one degree release (eps_d, for ``popular`` and ``blended``)
  are computed on it.
- **Seeds.** Nodes with at least one hidden edge and at least one remaining edge (so a
  personalized ranking has the seed's friends to work from), ``seeds`` of them drawn uniformly
  without replacement by a generator seeded with ``sample_seed`` (all of them if fewer).
- **Scoring.** For seed s the candidates are its non-friends: every node but s and its remaining
  neighbours; the relevant ones are its hidden neighbours (all candidates). Each ranking's top k
  among the candidates is scored by recall@k = hits / |hidden(s)| and NDCG@k with binary gains,
  sum over hits at rank i (from 0) of 1/log2(i + 2), divided by the same sum over the first
  min(k, |hidden(s)|) ranks. Ties (exact counts, unreachable nodes) are broken uniformly at random
  (a fresh key per candidate from the evaluation's generator), never by node order.
- **Rows.** The private rankings at each epsilon (``blended``, ``noisy_diffusion``,
  ``friends_of_friends``, ``common_neighbours``, DP-PushFlowCap), ``popular`` (one degree release
  at eps_d: it does not depend on the per-answer epsilon), the non-private references ``exact_ppr``
  (PPR on the remaining graph) and ``common_neighbours_exact`` (|N(s) & N(v)|), and ``random``.
  ``default`` repeats the service's default ranking. Means with 95% t-intervals over the seeds.

Randomness: the split, the seed sample and the tie-breaking come from seeded generators (an
evaluation, not the serving path); every private mechanism's noise comes from fresh OS-entropy
generators, as in :mod:`service.evaluation.runner`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import InvalidParameter
from service.evaluation.metrics import json_interval, json_number, mean_ci
from service.evaluation.options import DEFAULT_ETA, DEFAULT_POPULAR_EPSILON, LINK_ROWS
from service.evaluation.runner import default_delta
from service.graph.build import build_graph
from service.graph.model import Graph
from service.mechanisms.blended import blended_ranking
from service.mechanisms.common_neighbours import common_neighbour_counts, noisy_common_neighbours
from service.mechanisms.diffusion import noise_free_prefix, noisy_diffusion
from service.mechanisms.exact import exact_ppr
from service.mechanisms.friends_of_friends import friends_of_friends
from service.mechanisms.popular import noisy_degrees
from service.mechanisms.pushflowcap import DEFAULT_SIGMA, add_laplace_noise, pushflowcap
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.registry import (
    DEFAULT_MECHANISM,
    PERSONALIZED_ONLY,
    RankingMechanism,
    resolve_mechanism,
)
from service.privacy.calibration import (
    DiffusionPlan,
    plan_diffusion,
    validate_diffusion_parameters,
)
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    plan_laplace,
    plan_two_scale,
)
from service.privacy.modes import Mode

__all__ = [
    "HIDDEN_FRACTION",
    "LinkRow",
    "LinkSplit",
    "evaluate_links",
    "link_metrics",
    "split_edges",
]

#: Share of the edges hidden from the mechanisms.
HIDDEN_FRACTION = 0.1
#: Rows that do not depend on the per-answer epsilon (reported once).
EPSILON_FREE = frozenset({"popular", "exact_ppr", "common_neighbours_exact", "random"})

CI = tuple[float, float]


@dataclass(frozen=True)
class LinkSplit:
    """The graph the mechanisms serve from, and what was hidden from it."""

    train: Graph
    #: Hidden edges as internal index pairs (u < v).
    hidden: np.ndarray
    split_seed: int

    def hidden_neighbours(self) -> dict[int, np.ndarray]:
        """Each node's hidden neighbours (nodes with none are absent)."""
        u, v = self.hidden[:, 0], self.hidden[:, 1]
        ends = np.concatenate([u, v])
        others = np.concatenate([v, u])
        order = np.argsort(ends, kind="stable")
        ends, others = ends[order], others[order]
        nodes, starts = np.unique(ends, return_index=True)
        groups = np.split(others, starts[1:])
        return {int(node): np.sort(group) for node, group in zip(nodes, groups, strict=True)}


@dataclass(frozen=True)
class LinkRow:
    """Mean recall@k and NDCG@k of the hidden edges for one ranking (at one epsilon)."""

    mechanism: str
    epsilon: float | None
    recall: float
    recall_ci: CI
    ndcg: float
    ndcg_ci: CI
    seeds: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "recall": json_number(self.recall),
            "recall_ci": json_interval(self.recall_ci),
            "ndcg": json_number(self.ndcg),
            "ndcg_ci": json_interval(self.ndcg_ci),
            "seeds": self.seeds,
        }


@dataclass(frozen=True)
class LinkReport:
    """The rows and what they were measured on."""

    rows: list[LinkRow]
    nodes: int
    edges: int
    hidden_edges: int
    eligible_seeds: int
    seeds: int
    split_seed: int
    k: int
    notes: list[str] = field(default_factory=list)


def split_edges(
    graph: Graph, hidden_fraction: float = HIDDEN_FRACTION, split_seed: int = 0
) -> LinkSplit:
    """Hide floor(``hidden_fraction`` x |E|) edges chosen uniformly by a generator seeded with
    ``split_seed``; the rest is the graph served from (same nodes, same internal indices)."""
    if not 0.0 < hidden_fraction < 1.0:
        raise InvalidParameter("hidden_fraction", f"must be in (0, 1), got {hidden_fraction}")
    u, v = graph.edge_arrays()
    count = math.floor(hidden_fraction * u.shape[0])
    if count < 1:
        raise InvalidParameter("graph", f"{u.shape[0]} edges: too few to hide any")
    rng = np.random.default_rng(split_seed)
    chosen = np.zeros(u.shape[0], dtype=bool)
    chosen[rng.choice(u.shape[0], size=count, replace=False)] = True
    ids = [str(i) for i in graph.node_ids]
    train = build_graph(u[~chosen], v[~chosen], ids, source=f"{graph.stats.source} (train)")
    if train.n != graph.n or list(train.node_ids) != ids:  # pragma: no cover - canonical order
        raise AssertionError("the training graph must keep the node indices")
    hidden = np.stack([u[chosen], v[chosen]], axis=1).astype(np.int64)
    return LinkSplit(train=train, hidden=hidden, split_seed=split_seed)


def _top_among(
    scores: np.ndarray, candidates: np.ndarray, k: int, tie_keys: np.ndarray
) -> np.ndarray:
    """The ``k`` candidates with the largest scores, best first, ties broken by ``tie_keys``
    (random)."""
    values = np.asarray(scores, dtype=np.float64)[candidates]
    order = np.lexsort((tie_keys[candidates], -values))
    return candidates[order[:k]]


def link_metrics(ranked: np.ndarray, relevant: np.ndarray, k: int) -> tuple[float, float]:
    """(recall@k, NDCG@k) of a ranking (best first) against the relevant set (binary gains)."""
    if relevant.shape[0] == 0:
        return math.nan, math.nan
    top = np.asarray(ranked[:k], dtype=np.int64)
    hit = np.isin(top, relevant)
    discounts = 1.0 / np.log2(np.arange(k) + 2.0)
    dcg = float(discounts[: top.shape[0]][hit].sum())
    ideal = float(discounts[: min(k, relevant.shape[0])].sum())
    return float(hit.sum()) / relevant.shape[0], dcg / ideal


def validate_link_parameters(
    epsilons: Sequence[float], seeds: int, k: int, mechanisms: Sequence[str]
) -> None:
    for eps in epsilons:
        validate_diffusion_parameters(epsilon=eps)
    for name, value in (("seeds", seeds), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameter(name, f"must be an integer >= 1, got {value!r}")
    unknown = [m for m in mechanisms if m not in LINK_ROWS]
    if unknown or not mechanisms:
        raise InvalidParameter(
            "mechanisms", f"unknown {', '.join(map(repr, unknown))}; known: {', '.join(LINK_ROWS)}"
        )


@dataclass
class _SeedReleases:
    """Fresh releases of the private rankings for one seed on the remaining graph (the
    diffusion's noise-free prefix and PushFlowCap's capped vector are computed once)."""

    graph: Graph
    seed: int
    mode: Mode
    beta: float
    steps: int
    eta: float
    sigma: float
    diffusion_plans: Mapping[float, DiffusionPlan]
    degrees: np.ndarray | None
    degree_scale: float
    _prefixes: dict[int, np.ndarray] = field(default_factory=dict)
    _capped: np.ndarray | None = None

    def release(self, name: str, eps: float) -> np.ndarray:
        g, s, mode = self.graph, self.seed, self.mode
        if name == RankingMechanism.NOISY_DIFFUSION:
            config = self.diffusion_plans[eps].config
            m = config.noise_free_steps
            if m not in self._prefixes:
                self._prefixes[m] = noise_free_prefix(g, s, mode, self.beta, self.eta, m)
            return noisy_diffusion(g, s, config, rng=fresh_generator(), prefix=self._prefixes[m])
        if name == "common_neighbours":
            plan = plan_laplace(eps, COMMON_NEIGHBOUR_SENSITIVITY)
            return noisy_common_neighbours(g, s, plan, fresh_generator(), mode)
        if name == "friends_of_friends":
            return friends_of_friends(g, s, plan_two_scale(eps), fresh_generator(), mode)
        if name == "blended":
            assert self.degrees is not None
            return blended_ranking(
                g, s, plan_two_scale(eps), self.degrees, self.degree_scale, fresh_generator(), mode
            ).scores
        if name == "pushflowcap":
            if self._capped is None:
                self._capped = pushflowcap(g, s, self.beta, self.steps, self.sigma, mode)
            return add_laplace_noise(self._capped, self.sigma, eps, fresh_generator())
        raise AssertionError(f"not a private ranking: {name}")  # pragma: no cover


def evaluate_links(
    graph: Graph,
    epsilons: Sequence[float],
    *,
    seeds: int = 200,
    k: int = 20,
    mechanisms: Sequence[str] = LINK_ROWS,
    mode: Mode | str = Mode.PERSONALIZED,
    beta: float = 0.8,
    steps: int = 100,
    eta: float = DEFAULT_ETA,
    delta: float | None = None,
    sigma: float = DEFAULT_SIGMA,
    popular_epsilon: float = DEFAULT_POPULAR_EPSILON,
    hidden_fraction: float = HIDDEN_FRACTION,
    split_seed: int = 0,
    sample_seed: int | None = None,
    own_epsilons: Mapping[str, float] | None = None,
    default_mechanism: str = DEFAULT_MECHANISM.value,
    progress: Callable[[str], None] | None = None,
) -> LinkReport:
    """Recall@k and NDCG@k of the hidden edges among each seed's non-friends, per ranking and
    epsilon (module docstring). ``own_epsilons`` adds, for each private ranking it names, a row
    at that ranking's own epsilon (e.g. what the budget planner allows it)."""
    own = dict(own_epsilons or {})
    validate_link_parameters([*epsilons, *own.values()], seeds, k, mechanisms)
    mode = Mode(mode)
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if progress is not None:
            progress(text)

    wanted = list(dict.fromkeys(mechanisms))
    resolved = resolve_mechanism(None, mode, default_mechanism).value
    if "default" in wanted:
        note(f"default = {resolved} (the service's default in {mode.value} mode)")
    if mode is Mode.EDGE:
        for name in [m for m in wanted if m in PERSONALIZED_ONLY]:
            note(f"{name} skipped: personalized mode only")
            wanted.remove(name)
    computed = [m for m in wanted if m != "default"]
    if "default" in wanted and resolved not in computed:
        computed.append(resolved)

    split = split_edges(graph, hidden_fraction, split_seed)
    train = split.train
    delta = default_delta(train) if delta is None else delta
    hidden = split.hidden_neighbours()
    eligible = np.array(sorted(n for n in hidden if train.degrees[n] >= 1), dtype=np.int64)
    if eligible.shape[0] == 0:
        raise InvalidParameter("graph", "no node has both a hidden and a remaining edge")
    rng = np.random.default_rng(sample_seed)
    chosen = np.sort(rng.choice(eligible, size=min(seeds, eligible.shape[0]), replace=False))
    note(
        f"split {split_seed}: {split.hidden.shape[0]} of {graph.m} edges hidden; "
        f"{chosen.shape[0]} of {eligible.shape[0]} eligible seeds"
    )

    # (mechanism, epsilon) pairs: every private ranking at every epsilon, the epsilon-free rows
    # once, and the own-epsilon rows
    pairs: list[tuple[str, float | None]] = []
    for each in epsilons:
        pairs += [(m, float(each)) for m in computed if m not in EPSILON_FREE]
    for m, own_eps in own.items():
        if m in computed and m not in EPSILON_FREE and (m, float(own_eps)) not in pairs:
            pairs.append((m, float(own_eps)))
    pairs += [(m, None) for m in computed if m in EPSILON_FREE]
    diffusion_plans = {
        e: plan_diffusion(e, delta, steps, beta, eta, mode)
        for m, e in pairs
        if m == RankingMechanism.NOISY_DIFFUSION and e is not None
    }
    degree_plan = plan_laplace(popular_epsilon, DEGREE_SENSITIVITY)
    degrees = None
    if {"popular", "blended"} & set(computed):
        degrees = noisy_degrees(train, degree_plan, fresh_generator())  # one release per run
    results: dict[tuple[str, float | None], list[tuple[float, float]]] = {p: [] for p in pairs}

    for number, seed_value in enumerate(chosen, start=1):
        seed = int(seed_value)
        relevant = hidden[seed]
        excluded = np.zeros(train.n, dtype=bool)
        excluded[seed] = True
        excluded[train.neighbors(seed)] = True
        candidates = np.flatnonzero(~excluded)
        tie_keys = rng.random(train.n)
        releases = _SeedReleases(
            train, seed, mode, beta, steps, eta, sigma, diffusion_plans, degrees, degree_plan.scale
        )
        for name, eps in pairs:
            if name == "exact_ppr":
                values = exact_ppr(train, seed, beta)
            elif name == "common_neighbours_exact":
                values = common_neighbour_counts(train, seed)
            elif name == "random":
                values = rng.random(train.n)
            elif name == "popular":
                assert degrees is not None
                values = degrees
            else:
                assert eps is not None
                values = releases.release(name, eps)
            ranked = _top_among(values, candidates, k, tie_keys)
            results[(name, eps)].append(link_metrics(ranked, relevant, k))
        if progress is not None and number % 50 == 0:
            progress(f"seed {number}/{chosen.shape[0]} done")

    def row(name: str, source: str, at: float | None) -> LinkRow:
        table = np.asarray(results[(source, at)], dtype=np.float64).reshape(-1, 2)
        recall, recall_ci = mean_ci(table[:, 0])
        ndcg, ndcg_ci = mean_ci(table[:, 1])
        return LinkRow(name, at, recall, recall_ci, ndcg, ndcg_ci, int(chosen.shape[0]))

    rows: list[LinkRow] = []
    for name, at in pairs:
        if name in wanted:
            rows.append(row(name, name, at))
        if name == resolved and "default" in wanted:
            rows.append(row("default", name, at))
    return LinkReport(
        rows=rows,
        nodes=graph.n,
        edges=graph.m,
        hidden_edges=int(split.hidden.shape[0]),
        eligible_seeds=int(eligible.shape[0]),
        seeds=int(chosen.shape[0]),
        split_seed=split_seed,
        k=k,
        notes=notes,
    )
