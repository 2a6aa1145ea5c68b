"""Serving the rankings beyond the diffusion: ``popular``, ``common_neighbours``,
``friends_of_friends``, ``blended``.

- :class:`DegreeReleases` makes the graph version's single DP degree release (d + Lap(2/eps_d),
  rounded to its score grid) durable through the ledger's ``graph_releases`` (charged once, to
  the graph-wide exposure only, by whichever worker process asks first) and keeps it in the
  process and in the shared cache: once released it is public-safe, and every query of the
  version, in every process, reuses the same bytes.
- :class:`RankingPlan` is a per-query Laplace release calibrated by the accountant (pure eps-DP,
  its RDP curve on the ledger's grid), charged through the same ``admit_and_charge`` as a
  diffusion query: one-scale counts for ``common_neighbours``, the two-scale counts
  (Lap(2/eps) on the seed's friends, Lap(1/eps) on the rest; the same curve) for
  ``friends_of_friends`` and ``blended``.
- :func:`draw_ranking` draws the query's noise (OS entropy) and post-processes it; released
  scores are rounded to ``score_grid`` of the noise behind them and ranked as rounded.
  :func:`draw_ranked` is its ranked top (what the service stores), drawn lazily, with the same
  law, in time that does not grow with the graph (:mod:`service.mechanisms.lazy_top_k`, and
  :mod:`service.mechanisms.lazy_blend` for ``blended``; docs/privacy.md, "The lazy top-k").

Proofs of the sensitivities and of what is charged to whom: docs/ranking.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.cache.caches import ReleasedDegreeCache
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import GraphCap
from service.mechanisms.blended import SERVED_DEPTH, blend, degree_standard
from service.mechanisms.charges import count_release, degree_release
from service.mechanisms.common_neighbours import (
    common_neighbours_top,
    noisy_common_neighbours,
    two_scale_common_neighbours,
)
from service.mechanisms.friends_of_friends import friends_first, friends_of_friends_top
from service.mechanisms.lazy_blend import blended_top
from service.mechanisms.popular import degrees_from_bytes, degrees_to_bytes, noisy_degrees
from service.mechanisms.postprocess import count_grid, round_to_grid, score_grid
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.registry import RankingMechanism
from service.privacy.accountant import RdpCurve
from service.privacy.laplace import (
    CANDIDATE_COUNT_SENSITIVITY,
    FRIEND_COUNT_SENSITIVITY,
    LaplacePlan,
    TwoScalePlan,
)
from service.privacy.modes import Mode
from service.privacy.sampler import count_release_delta, stored_release_delta

__all__ = [
    "DegreeReleases",
    "RankingDraw",
    "RankingPlan",
    "ReleasedDegrees",
    "counts_grid",
    "degree_release_name",
    "draw_ranked",
    "draw_ranking",
    "plan_ranking",
]


def degree_release_name(scale: float) -> str:
    """The ledger's name of a degree release at noise scale ``scale``: a different scale (a
    changed ``PPR_POPULAR_EPSILON``) is a different release, charged on its own."""
    return f"popular_degrees:b={scale!r}"


@dataclass(frozen=True)
class ReleasedDegrees:
    """One graph version's released noisy degrees (already on their grid), their plan, and the
    curve the ledger stored with the release: the plan's (drawn exactly, no sampler share), or
    for a release drawn with the float sampler before, the plan's with its share. Accounts
    are charged ``curve`` for it and answers state ``delta`` from it."""

    graph_version: str
    values: np.ndarray
    plan: LaplacePlan
    stored_curve: RdpCurve | None = None

    @property
    def grid(self) -> float:
        return count_grid(self.plan.scale)

    @property
    def curve(self) -> RdpCurve:
        return self.stored_curve if self.stored_curve is not None else self.plan.curve

    @property
    def delta(self) -> float:
        return stored_release_delta(self.plan.epsilon, self.curve.sampler_tv)


class DegreeReleases:
    """The version's one DP degree release: process memory, then the shared cache, then the
    ledger (which draws and charges it exactly once per version and scale, across processes)."""

    def __init__(
        self,
        ledger: Ledger,
        epsilon: float,
        cache: ReleasedDegreeCache | None = None,
        *,
        wait_seconds: float = 30.0,
    ) -> None:
        self.ledger = ledger
        self.plan = degree_release(float(epsilon))
        self.cache = cache
        self.wait_seconds = wait_seconds
        self._local: dict[str, ReleasedDegrees] = {}
        self._lock = threading.Lock()

    def get(self, graph: Graph, cap: GraphCap | None = None) -> ReleasedDegrees:
        """The version's release; making it is refused if it would pass the graph-wide ``cap``
        (403 ``graph_budget_exhausted``), reading an existing one never is."""
        hit = self._local.get(graph.version)
        if hit is not None:
            return hit
        with self._lock:  # one ledger round trip per process and version
            hit = self._local.get(graph.version)
            if hit is None:
                values = self._fetch(graph, cap)
                stored = self.ledger.graph_releases.graph_release_curve(
                    graph.version, degree_release_name(self.plan.scale)
                )
                hit = ReleasedDegrees(graph.version, values, self.plan, stored)
                degree_standard(values, self.plan.scale)  # blended's, once per version
                self._local = {graph.version: hit}  # the current version only
            return hit

    def _fetch(self, graph: Graph, cap: GraphCap | None) -> np.ndarray:
        scale = self.plan.scale
        if self.cache is not None:
            cached = self.cache.get(graph.version, scale, graph.n)
            if cached is not None:
                return cached
        grid = count_grid(scale)

        def draw() -> bytes:
            released = round_to_grid(
                noisy_degrees(graph, self.plan, fresh_generator(), grid=grid), grid
            )
            return degrees_to_bytes(released)

        payload = self.ledger.graph_releases.graph_release(
            graph.version,
            degree_release_name(scale),
            epsilon=self.plan.epsilon,
            curve=self.plan.curve,
            draw=draw,
            wait_seconds=self.wait_seconds,
            cap=cap,
        )
        released = degrees_from_bytes(payload, graph.n)
        if self.cache is not None:
            self.cache.put(graph.version, scale, released)
        return released


@dataclass(frozen=True)
class RankingPlan:
    """A per-query Laplace ranking (``common_neighbours``, ``friends_of_friends`` or ``blended``):
    what admission charges (``curve``, ``epsilon``) and what the release needs (the counts'
    noise plan; the version's degree release for ``blended``)."""

    name: RankingMechanism
    mode: Mode
    release: LaplacePlan | TwoScalePlan
    degrees: ReleasedDegrees | None = None

    @property
    def curve(self) -> RdpCurve:
        return self.release.curve

    @property
    def epsilon(self) -> float:
        return self.release.epsilon

    def describe(self) -> dict[str, Any]:
        """The answer's ``mechanism`` block (the released ``score_grid`` is added after the
        draw for ``blended``, whose scores are in their own units)."""
        block: dict[str, Any] = {
            "name": self.name.value,
            "mode": self.mode.value,
            "epsilon": self.release.epsilon,
            "delta": count_release_delta(self.release.epsilon),
        }
        if isinstance(self.release, TwoScalePlan):
            block.update(
                {
                    "sensitivity": FRIEND_COUNT_SENSITIVITY,
                    "noise_scale": self.release.friend_scale,
                    "friend_noise_scale": self.release.friend_scale,
                    "candidate_sensitivity": CANDIDATE_COUNT_SENSITIVITY,
                    "candidate_noise_scale": self.release.candidate_scale,
                }
            )
        else:
            block["sensitivity"] = self.release.sensitivity
            block["noise_scale"] = self.release.scale
        if self.name is not RankingMechanism.BLENDED:
            block["score_grid"] = counts_grid(self.release)
        if self.degrees is not None:
            block.update(degree_block(self.degrees))
        return block


def counts_grid(release: LaplacePlan | TwoScalePlan) -> float:
    """The grid released counts are drawn on: :func:`count_grid` of their smallest noise
    scale (at most 1, so that the integer counts are multiples of it)."""
    if isinstance(release, TwoScalePlan):
        return count_grid(min(release.candidate_scale, release.friend_scale))
    return count_grid(release.scale)


def degree_block(degrees: ReleasedDegrees) -> dict[str, Any]:
    """The degree release's part of a ``mechanism`` block."""
    return {
        "degree_epsilon": degrees.plan.epsilon,
        "degree_delta": degrees.delta,
        "degree_noise_scale": degrees.plan.scale,
        "degree_release": (
            "one per graph version: counted once in the graph-wide exposure, and charged to "
            "each account once per version, with its first answer built on it"
        ),
    }


def plan_ranking(
    name: RankingMechanism, epsilon: float, mode: Mode, degrees: ReleasedDegrees | None
) -> RankingPlan:
    if name is RankingMechanism.BLENDED and degrees is None:
        raise ValueError("blended needs the version's degree release")
    release = count_release(name, float(epsilon))  # what admission charges (mechanisms.charges)
    kept = degrees if name is RankingMechanism.BLENDED else None
    return RankingPlan(name, Mode(mode), release, kept)


@dataclass(frozen=True)
class RankingDraw:
    """Released scores (higher is better), the grid to round them to, and what the answer
    states beyond the plan."""

    scores: np.ndarray
    grid: float
    extra: dict[str, Any]


def draw_ranking(
    graph: Graph,
    seed: int,
    plan: RankingPlan,
    rng: np.random.Generator,
    *,
    depth: int = SERVED_DEPTH,
) -> RankingDraw:
    """Draw this query's noisy common-neighbour counts for every node with ``rng`` (a fresh
    OS-entropy generator in the service) and post-process them: the full draw, which
    :func:`draw_ranked` samples the ranked top of.

    The counts are rounded to their grid as soon as they are drawn; ``friends_of_friends``
    ranks them with the seed's friends first; ``blended`` combines them with the stored degree
    release (post-processing; ``depth``: the candidates served, whose blends set its shift) and
    states the grid of its own score units.
    """
    grid = counts_grid(plan.release)
    if isinstance(plan.release, TwoScalePlan):
        drawn = two_scale_common_neighbours(graph, seed, plan.release, rng, plan.mode, grid=grid)
    else:
        drawn = noisy_common_neighbours(graph, seed, plan.release, rng, plan.mode, grid=grid)
    counts = round_to_grid(drawn, grid)
    if plan.name is RankingMechanism.COMMON_NEIGHBOURS:
        return RankingDraw(counts, grid, {})
    if plan.name is RankingMechanism.FRIENDS_OF_FRIENDS:
        return RankingDraw(friends_first(graph, seed, counts), grid, {})
    assert plan.degrees is not None and isinstance(plan.release, TwoScalePlan)
    ranking = blend(
        graph, seed, counts, plan.degrees.values, plan.release.candidate_scale,
        plan.degrees.plan.scale, depth=depth,
    )  # fmt: skip
    grid = score_grid(ranking.score_noise_scale)
    return RankingDraw(
        ranking.scores,
        grid,
        {
            "score_grid": grid,
            "weight": ranking.weight,
            "reliability_counts": ranking.reliability_counts,
            "reliability_degrees": ranking.reliability_degrees,
            "counts_signal": ranking.counts_signal,
        },
    )


def draw_ranked(
    graph: Graph, seed: int, plan: RankingPlan, rng: np.random.Generator, top: int
) -> tuple[np.ndarray, np.ndarray, float, dict[str, Any]]:
    """The ranked top ``top`` of :func:`draw_ranking` (without the seed), as
    :func:`service.mechanisms.postprocess.ranked_indices` ranks it: (indices, scores, grid,
    extra), drawn lazily: its output has exactly the law of ranking the full draw
    (docs/privacy.md, "The lazy top-k"; for ``blended``, of ranking
    ``draw_ranking(..., depth=top - d(seed))``)."""
    grid = counts_grid(plan.release)
    if plan.name is RankingMechanism.COMMON_NEIGHBOURS:
        assert isinstance(plan.release, LaplacePlan)
        best, scores = common_neighbours_top(
            graph, seed, plan.release, top, rng, plan.mode, grid=grid
        )
        return best, scores, grid, {}
    if plan.name is RankingMechanism.FRIENDS_OF_FRIENDS:
        assert isinstance(plan.release, TwoScalePlan)
        best, scores = friends_of_friends_top(
            graph, seed, plan.release, top, rng, plan.mode, grid=grid
        )
        return best, scores, grid, {}
    assert plan.degrees is not None and isinstance(plan.release, TwoScalePlan)
    lazy = blended_top(
        graph, seed, plan.release, plan.degrees.values, plan.degrees.plan.scale, top, rng,
        plan.mode, grid=grid,
    )  # fmt: skip
    extra = {
        "score_grid": lazy.grid,
        "weight": lazy.weight,
        "reliability_counts": lazy.reliability_counts,
        "reliability_degrees": lazy.reliability_degrees,
        "counts_signal": lazy.counts_signal,
    }
    return lazy.indices, lazy.scores, lazy.grid, extra
