"""What the Laplace sampler adds to a release's delta (docs/privacy.md, "The Laplace sampler
and its stated delta").

Now: nothing. Every count release (``popular``, ``common_neighbours``, ``friends_of_friends``,
the counts of ``blended``) and every DP-IE embedding draws its noise with the exact
rounded-Laplace sampler (:mod:`service.mechanisms.exact_laplace`): coordinate i is released
as ``c_i + g N_i`` with ``N_i = round(L_i / gamma)`` drawn exactly (uniform integers and exact
comparisons only), gamma = ``g / b'`` and ``b' = dyadic_scale(b) >= b``. That is exactly the law
of ``round_g(c_i + b' L_i)`` with L_i ~ Lap(1): post-processing of the exact Laplace mechanism
at a scale at least the planned one, so the release is pure eps-DP at the planned epsilon with
delta 0. Its curve carries no sampler share (``sampler_tv`` 0) and it states delta 0.

Before: these releases drew ``b S E`` with ``E`` numpy's float64 ziggurat exponential, whose law
is not exactly Exp(1) (a lattice in the layers, a tail bounded at r + 53 ln 2 = 44.4, float64
rounding of ``b E``). A coupling with an exact Exp(1) draw put the rounded released values in
different cells with probability at most :data:`TAU_PER_COORDINATE` per coordinate
(``benchmarks/laplace_sampler_bound.py``: 6.0e-12), on at most :data:`CHANGED_COORDINATES`
coordinates per count release: such a release carried the sampler share
:data:`FLOAT_COUNT_RELEASE_TV` in its curve, which the accountant takes out of delta
(:mod:`service.privacy.accountant`). Charges made then keep their stored share (it is still
true of them; migration 0010 put it on older rows), so an account's composed figure stays
sound; new releases add nothing to it.
"""

from __future__ import annotations

import math

#: Upper bound (rounded up from 5.98e-12) on P(round_g(b S E) != round_g(b S E*)) for one
#: coordinate drawn with the float64 sampler, cells at least 1/1024 of the scale wide.
TAU_PER_COORDINATE = 1e-11
#: Most released coordinates one protected edge changes, for every count release (two
#: degrees; two common-neighbour counts; two friend or one candidate count).
CHANGED_COORDINATES = 2
#: The sampler share a count release drawn with the float64 sampler carried (2e-11).
FLOAT_COUNT_RELEASE_TV = CHANGED_COORDINATES * TAU_PER_COORDINATE


def count_release_tv() -> float:
    """The sampler share one count release adds to an account's ``sampler_tv``
    (:class:`service.privacy.accountant.RdpCurve`): 0, its noise is drawn exactly."""
    return 0.0


def count_release_delta(epsilon: float) -> float:
    """The delta a pure ``epsilon``-DP count release states: 0 (exact sampler, module
    docstring), whatever ``epsilon``."""
    del epsilon
    return 0.0


def stored_release_delta(epsilon: float, sampler_tv: float) -> float:
    """The delta a stored pure ``epsilon``-DP release states given the sampler share its curve
    carries: ``(1 + e^eps) sampler_tv`` (a release drawn with the float sampler before:
    ``sampler_tv`` 2e-11), 0 for one drawn exactly."""
    return (1.0 + math.exp(epsilon)) * sampler_tv if sampler_tv > 0.0 else 0.0


def vector_release_delta(epsilon: float, coordinates: int) -> float:
    """The delta a pure ``epsilon``-DP release of a ``coordinates``-vector (DP-IE) states: 0,
    its noise is drawn exactly on a grid the vector was snapped to first
    (:mod:`service.embeddings.dp`)."""
    del epsilon, coordinates
    return 0.0
