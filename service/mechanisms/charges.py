"""What an account is charged for an answer of each ranking, in one place: the serving path
releases with these plans, and the budget planner composes these curves.

Per answer, at the query's epsilon (and the account's delta for the diffusion):

- ``noisy_diffusion``: the calibrated diffusion's curve (:func:`service.privacy.calibration.
  calibrate`: c = b / eta rounded up, so the curve converts to at most epsilon);
- ``common_neighbours``: the one-scale counts, Lap(2 / eps) rounded up (a Laplace curve);
- ``friends_of_friends`` and ``blended``: the two-scale counts (the friends' scale 2 / eps rounded
  up, the candidates' half of it; the same Laplace curve, docs/ranking.md);
- ``popular``: nothing (it ranks the graph version's degree release: post-processing).

Per graph version, once per account, with its first answer built on it (``blended`` and
``popular``): the degree release d + Lap(2 / eps_d) (``PPR_POPULAR_EPSILON``), a Laplace curve at
eps_d. It is also counted once in the graph-wide exposure.
"""

from __future__ import annotations

from functools import lru_cache

from service.mechanisms.registry import TWO_SCALE, RankingMechanism
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import calibrate
from service.privacy.laplace import (
    COMMON_NEIGHBOUR_SENSITIVITY,
    DEGREE_SENSITIVITY,
    LaplacePlan,
    TwoScalePlan,
    plan_laplace,
    plan_two_scale,
)
from service.privacy.modes import Mode

__all__ = [
    "BUILT_ON_DEGREES",
    "answer_curve",
    "count_release",
    "degree_release",
    "version_curve",
]

#: The rankings built on the graph version's degree release (charged once per version).
BUILT_ON_DEGREES = frozenset({RankingMechanism.BLENDED, RankingMechanism.POPULAR})


@lru_cache(maxsize=1024)
def count_release(name: RankingMechanism, epsilon: float) -> LaplacePlan | TwoScalePlan:
    """The calibrated count release behind a per-answer ``common_neighbours``,
    ``friends_of_friends`` or ``blended`` answer at ``epsilon``."""
    name = RankingMechanism(name)
    if name in TWO_SCALE:
        return plan_two_scale(float(epsilon))
    if name is RankingMechanism.COMMON_NEIGHBOURS:
        return plan_laplace(float(epsilon), COMMON_NEIGHBOUR_SENSITIVITY)
    raise ValueError(f"{name.value} draws no per-answer count release")


@lru_cache(maxsize=64)
def degree_release(epsilon: float) -> LaplacePlan:
    """The graph version's degree release at ``epsilon`` (``PPR_POPULAR_EPSILON``)."""
    return plan_laplace(float(epsilon), DEGREE_SENSITIVITY)


def answer_curve(
    name: RankingMechanism | str,
    epsilon: float,
    *,
    delta: float,
    steps: int,
    beta: float,
    mode: Mode | str,
) -> RdpCurve:
    """The curve one fresh answer of ``name`` at ``epsilon`` is charged (the degree release
    aside: :func:`version_curve`)."""
    name = RankingMechanism(name)
    if name is RankingMechanism.POPULAR:
        return RdpCurve.zero()
    if name is RankingMechanism.NOISY_DIFFUSION:
        return calibrate(float(epsilon), float(delta), int(steps), float(beta), Mode(mode)).curve
    return count_release(name, float(epsilon)).curve


def version_curve(name: RankingMechanism | str, popular_epsilon: float) -> RdpCurve:
    """The curve an account is charged once per graph version for answers of ``name``: the
    degree release for the rankings built on it, nothing for the others."""
    if RankingMechanism(name) in BUILT_ON_DEGREES:
        return degree_release(float(popular_epsilon)).curve
    return RdpCurve.zero()
