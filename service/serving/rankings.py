"""Serving the rankings beyond the diffusion: ``popular``, ``common_neighbours``, ``blended``.

- :class:`DegreeReleases` makes the graph version's single DP degree release (d + Lap(2/eps_d),
  rounded to its score grid) durable through the ledger's ``graph_releases`` (charged once, to
  the graph-wide exposure only, by whichever worker process asks first) and keeps it in the
  process and in the shared cache: once released it is public-safe, and every query of the
  version, in every process, reuses the same bytes.
- :class:`RankingPlan` is a per-query Laplace release calibrated by the accountant (pure eps-DP,
  its RDP curve on the ledger's grid), charged through the same ``admit_and_charge`` as a
  diffusion query.
- :func:`draw_ranking` draws the query's noise (OS entropy) and post-processes it; released
  scores are rounded to ``score_grid`` of the noise behind them and ranked as rounded.

Proofs of the sensitivities and of what is charged to whom: docs/ranking.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from service.cache.caches import ReleasedDegreeCache
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import GraphCap
from service.mechanisms.blended import blend
from service.mechanisms.common_neighbours import noisy_common_neighbours
from service.mechanisms.popular import degrees_from_bytes, degrees_to_bytes, noisy_degrees
from service.mechanisms.postprocess import round_to_grid, score_grid
from service.mechanisms.randomness import fresh_generator
from service.mechanisms.registry import RankingMechanism
from service.privacy.accountant import RdpCurve
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    LaplacePlan,
    plan_laplace,
)
from service.privacy.modes import Mode

__all__ = [
    "DegreeReleases",
    "RankingDraw",
    "RankingPlan",
    "ReleasedDegrees",
    "degree_release_name",
    "draw_ranking",
    "laplace_plan",
    "plan_ranking",
]


@lru_cache(maxsize=1024)
def laplace_plan(epsilon: float, sensitivity: float) -> LaplacePlan:
    """The accountant's calibration of a pure eps-DP Laplace release (scale rounded up)."""
    return plan_laplace(epsilon, sensitivity)


def degree_release_name(scale: float) -> str:
    """The ledger's name of a degree release at noise scale ``scale``: a different scale (a
    changed ``PPR_POPULAR_EPSILON``) is a different release, charged on its own."""
    return f"popular_degrees:b={scale!r}"


@dataclass(frozen=True)
class ReleasedDegrees:
    """One graph version's released noisy degrees (already on their grid) and their plan."""

    graph_version: str
    values: np.ndarray
    plan: LaplacePlan

    @property
    def grid(self) -> float:
        return score_grid(self.plan.scale)


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
        self.plan = laplace_plan(float(epsilon), DEGREE_SENSITIVITY)
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
                hit = ReleasedDegrees(graph.version, self._fetch(graph, cap), self.plan)
                self._local = {graph.version: hit}  # the current version only
            return hit

    def _fetch(self, graph: Graph, cap: GraphCap | None) -> np.ndarray:
        scale = self.plan.scale
        if self.cache is not None:
            cached = self.cache.get(graph.version, scale, graph.n)
            if cached is not None:
                return cached
        grid = score_grid(scale)

        def draw() -> bytes:
            released = round_to_grid(noisy_degrees(graph, self.plan, fresh_generator()), grid)
            return degrees_to_bytes(released)

        payload = self.ledger.graph_release(
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
    """A per-query Laplace ranking (``common_neighbours`` or ``blended``): what admission charges
    (``curve``, ``epsilon``) and what the release needs (the version's degree release for
    ``blended``)."""

    name: RankingMechanism
    mode: Mode
    laplace: LaplacePlan
    degrees: ReleasedDegrees | None = None

    @property
    def curve(self) -> RdpCurve:
        return self.laplace.curve

    @property
    def epsilon(self) -> float:
        return self.laplace.epsilon

    def describe(self) -> dict[str, Any]:
        """The answer's ``mechanism`` block (the released ``score_grid`` is added after the
        draw for ``blended``, whose scores are in their own units)."""
        block: dict[str, Any] = {
            "name": self.name.value,
            "mode": self.mode.value,
            "epsilon": self.laplace.epsilon,
            "delta": 0.0,
            "sensitivity": self.laplace.sensitivity,
            "noise_scale": self.laplace.scale,
        }
        if self.name is RankingMechanism.COMMON_NEIGHBOURS:
            block["score_grid"] = score_grid(self.laplace.scale)
        if self.degrees is not None:
            block.update(degree_block(self.degrees))
        return block


def degree_block(degrees: ReleasedDegrees) -> dict[str, Any]:
    """The degree release's part of a ``mechanism`` block."""
    return {
        "degree_epsilon": degrees.plan.epsilon,
        "degree_noise_scale": degrees.plan.scale,
        "degree_release": "one per graph version, charged once to the graph-wide exposure",
    }


def plan_ranking(
    name: RankingMechanism, epsilon: float, mode: Mode, degrees: ReleasedDegrees | None
) -> RankingPlan:
    if name is RankingMechanism.BLENDED and degrees is None:
        raise ValueError("blended needs the version's degree release")
    plan = laplace_plan(float(epsilon), COMMON_NEIGHBOUR_SENSITIVITY)
    kept = degrees if name is RankingMechanism.BLENDED else None
    return RankingPlan(name, Mode(mode), plan, kept)


@dataclass(frozen=True)
class RankingDraw:
    """Released scores (higher is better), the grid to round them to, and what the answer
    states beyond the plan."""

    scores: np.ndarray
    grid: float
    extra: dict[str, Any]


def draw_ranking(
    graph: Graph, seed: int, plan: RankingPlan, rng: np.random.Generator
) -> RankingDraw:
    """Draw this query's noisy common-neighbour counts with ``rng`` (a fresh OS-entropy
    generator in the service) and post-process them.

    The counts are rounded to their grid as soon as they are drawn; ``blended`` then combines
    them with the stored degree release (post-processing) and states the grid of its own
    score units.
    """
    b = plan.laplace.scale
    counts = noisy_common_neighbours(graph, seed, plan.laplace, rng, plan.mode)
    counts = round_to_grid(counts, score_grid(b))
    if plan.name is RankingMechanism.COMMON_NEIGHBOURS:
        return RankingDraw(counts, score_grid(b), {})
    assert plan.degrees is not None
    ranking = blend(graph, seed, counts, plan.degrees.values, b, plan.degrees.plan.scale)
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
