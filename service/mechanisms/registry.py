"""The rankings the service can release, which privacy models offer them, and the default.

- ``noisy_diffusion``: the spec's Mechanism 1 (both modes; per-query (eps, delta) charge).
- ``popular``: the graph version's one DP degree release, ranked (both modes; no per-query
  charge: the release is charged once to the graph-wide exposure).
- ``common_neighbours``: |N(s) & N(v)| + Lap(2 / eps) per query (personalized only; the spec's
  baseline).
- ``friends_of_friends``: the same counts with two scales split by the seed's own friends,
  Lap(2 / eps) on the friends and Lap(1 / eps) on everyone else, ranked with the friends first
  (personalized only; same charge as ``common_neighbours``; docs/ranking.md).
- ``blended``: the two-scale counts and the DP degrees blended by a hold-out check on the
  seed's own friends (personalized only; docs/ranking.md).

``common_neighbours``, ``friends_of_friends`` and ``blended`` read the seed's own edges, which
edge mode protects: their sensitivity there is unbounded, so they are refused in that mode. A
configured default that is personalized-only falls back to ``noisy_diffusion`` in edge mode.
"""

from __future__ import annotations

from enum import StrEnum

from service.errors import InvalidParameter
from service.privacy.modes import Mode

__all__ = [
    "DEFAULT_MECHANISM",
    "EDGE_FALLBACK",
    "PERSONALIZED_ONLY",
    "TWO_SCALE",
    "RankingMechanism",
    "resolve_mechanism",
]


class RankingMechanism(StrEnum):
    NOISY_DIFFUSION = "noisy_diffusion"
    POPULAR = "popular"
    COMMON_NEIGHBOURS = "common_neighbours"
    FRIENDS_OF_FRIENDS = "friends_of_friends"
    BLENDED = "blended"


#: Mechanisms that exist in personalized mode only (unbounded sensitivity in edge mode).
PERSONALIZED_ONLY = frozenset(
    {
        RankingMechanism.COMMON_NEIGHBOURS,
        RankingMechanism.FRIENDS_OF_FRIENDS,
        RankingMechanism.BLENDED,
    }
)
#: Per-query rankings released from the two-scale common-neighbour counts.
TWO_SCALE = frozenset({RankingMechanism.FRIENDS_OF_FRIENDS, RankingMechanism.BLENDED})
#: The service's default ranking (``PPR_DEFAULT_MECHANISM``).
DEFAULT_MECHANISM = RankingMechanism.FRIENDS_OF_FRIENDS
#: What a personalized-only default becomes in edge mode.
EDGE_FALLBACK = RankingMechanism.NOISY_DIFFUSION


def resolve_mechanism(
    requested: RankingMechanism | str | None, mode: Mode, default: RankingMechanism | str
) -> RankingMechanism:
    """The mechanism a query uses: the requested one (422 if the mode does not offer it), else
    the configured default, or ``noisy_diffusion`` in edge mode if the default is
    personalized-only."""
    mode = Mode(mode)
    if requested is None:
        chosen = RankingMechanism(default)
        if mode is Mode.EDGE and chosen in PERSONALIZED_ONLY:
            return EDGE_FALLBACK
        return chosen
    try:
        chosen = RankingMechanism(requested)
    except ValueError:
        known = ", ".join(m.value for m in RankingMechanism)
        raise InvalidParameter("mechanism", f"unknown {requested!r}; one of {known}") from None
    if mode is Mode.EDGE and chosen in PERSONALIZED_ONLY:
        raise InvalidParameter(
            "mechanism",
            f"{chosen.value} is offered in personalized mode only: it reads the seed's own "
            "edges, which edge mode protects (its sensitivity there is unbounded); use "
            "mode=personalized, or mechanism=noisy_diffusion or popular in edge mode",
        )
    return chosen
