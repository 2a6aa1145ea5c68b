"""What the float64 Laplace sampler adds to a count release's delta (docs/privacy.md, "The
Laplace sampler and its stated delta").

Every count release (``popular``, ``common_neighbours``, ``friends_of_friends``, the counts of
``blended``) draws through :func:`service.mechanisms.randomness.laplace_noise`: ``b S E`` with
``E`` numpy's float64 ziggurat exponential. Its law is not exactly Exp(1): a lattice (points
``k x_i 2^-53`` in the layers), a bounded tail (``r - log1p(-U)``, U on a 2^-53 grid, so E stops
at r + 53 ln 2 = 44.4) and float64 rounding of ``b E``. Each released coordinate is
``c + round_g(b S E)`` with ``g`` a power of two at most b / 256 and at least 1/1024 of the
coordinate's scale (``round_g`` of the noise first, then the exact addition of the integer
count, so the noise's law does not depend on ``c``). A coupling of E with an exact Exp(1) draw E*
puts the two rounded values in different cells with probability at most
:data:`TAU_PER_COORDINATE` (``benchmarks/laplace_sampler_bound.py`` computes each term from the
ziggurat's tables: 6.0e-12). One edge changes at most :data:`CHANGED_COORDINATES` released
coordinates, the others have the same law under both graphs; so a release that is pure
eps-DP with exact Laplace noise is (eps, (1 + e^eps) * 2 * tau)-DP as drawn. That is the delta
each count answer states. Composed over an account's answers, the ledger keeps the sum of the
releases' ``2 tau`` in the curve (``sampler_tv``) and converts at
``delta - (1 + e^eps) * sum`` (:mod:`service.privacy.accountant`).
"""

from __future__ import annotations

import math

#: Upper bound (rounded up from 5.98e-12) on P(round_g(b S E) != round_g(b S E*)) for one
#: coordinate, cells at least 1/1024 of the scale wide.
TAU_PER_COORDINATE = 1e-11
#: Most released coordinates one protected edge changes, for every count release (two
#: degrees; two common-neighbour counts; two friend or one candidate count).
CHANGED_COORDINATES = 2


def count_release_tv() -> float:
    """The probability that one count release, as drawn, differs from its exact-noise twin on
    the coordinates a protected edge changes: its share of an account's ``sampler_tv``
    (:class:`service.privacy.accountant.RdpCurve`)."""
    return CHANGED_COORDINATES * TAU_PER_COORDINATE


def count_release_delta(epsilon: float) -> float:
    """The delta a pure ``epsilon``-DP count release states: what the sampler adds."""
    return (1.0 + math.exp(epsilon)) * count_release_tv()


def vector_release_delta(epsilon: float, coordinates: int) -> float:
    """The delta a pure ``epsilon``-DP Laplace release of a vector states when one edge may
    change all ``coordinates`` of it (DP-IE's k coordinates): the coupling bound
    :data:`TAU_PER_COORDINATE` once per coordinate that may change, as
    :func:`count_release_delta` counts :data:`CHANGED_COORDINATES`."""
    return (1.0 + math.exp(epsilon)) * coordinates * TAU_PER_COORDINATE
