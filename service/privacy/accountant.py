"""RDP curves as immutable values: composition and conversion to (epsilon, delta).

A curve is the mechanism's Renyi-DP guarantee on the fixed order grid (:mod:`orders`) plus its
pure-DP value (alpha = infinity). Composition adds curves order by order. Conversion takes the
minimum over orders of the improved bound (Balle et al. 2020; Canonne, Kamath, Steinke 2020)

    eps = r(alpha) + ln(1 - 1/alpha) - ln(delta * alpha) / (alpha - 1)

and the pure value, whichever is smaller.

A curve also carries ``sampler_tv``: the summed probability that the float64 sampler's released
values differ from those of an exact Laplace sampler coupled with it (each count release adds
its own, :func:`service.privacy.sampler.count_release_tv`; composition adds them). The
transcript of every release an account received then equals the ideal (exact-noise) transcript
except with probability at most T = ``sampler_tv`` (a union bound over the releases, adaptively:
each coupling holds given the releases before it). If the ideal transcript is (eps, delta')-DP
(the RDP conversion at delta'), the real one is (eps, delta' + (1 + e^eps) T)-DP:
P[R(G) in S] <= P[I(G) in S] + T <= e^eps P[I(G') in S] + delta' + T
<= e^eps P[R(G') in S] + delta' + (1 + e^eps) T. So :meth:`RdpCurve.epsilon` converts at
delta' = delta - (1 + e^eps) T, for the smallest eps that satisfies it (docs/privacy.md,
section 5, "The sampler's share of delta"). Summing the releases' own stated deltas
(1 + e^eps_i) 2 tau instead would understate it: eps_i is one release's, eps the composition's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.privacy.orders import GRID_VERSION, ORDERS

#: The conversion's terms that depend on the order only, computed once (every order is finite
#: and above 1, so none is infinite and no division is by 0): the conversion below does the
#: same floating-point operations, in the same order, as computing them every time.
_LOG1P_TERM = np.log1p(-1.0 / ORDERS)
_LOG_ORDERS = np.log(ORDERS)
_ORDERS_MINUS_ONE = ORDERS - 1.0
assert np.all(np.isfinite(_LOG1P_TERM)) and np.all(_ORDERS_MINUS_ONE > 0.0)


def _delta_term(delta: float) -> np.ndarray:
    """``(log(delta) + log(alpha)) / (alpha - 1)`` over the grid, for one delta."""
    term: np.ndarray = (np.log(delta) + _LOG_ORDERS) / _ORDERS_MINUS_ONE
    return term


@functools.lru_cache(maxsize=64)
def _kept_delta_term(delta: float) -> np.ndarray:
    """:func:`_delta_term`, kept (read-only): a ledger converts at the few deltas its accounts
    have. Not for :func:`sound_epsilon`'s iterates, each a delta of its own."""
    term = _delta_term(delta)
    term.setflags(write=False)
    return term


def _epsilon_at(rdp: np.ndarray, pure: float, term: np.ndarray) -> float:
    """The conversion with delta's term given (the same floating-point operations as computing
    it in place)."""
    eps = np.asarray(rdp, dtype=np.float64) + _LOG1P_TERM - term
    best = float(np.min(eps))
    return max(0.0, min(best, float(pure)))


def rdp_to_epsilon(rdp: np.ndarray, pure: float, delta: float) -> float:
    """Smallest epsilon the curve certifies at ``delta`` (vectorised over the grid)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return _epsilon_at(rdp, pure, _kept_delta_term(delta))


#: Fixed-point iterations of :func:`sound_epsilon` before it gives up (returns infinity).
_FIXED_POINT_ITERATIONS = 200


def sound_epsilon(rdp: np.ndarray, pure: float, sampler_tv: float, delta: float) -> float:
    """The smallest eps with ``rdp_to_epsilon(rdp, pure, delta - (1 + e^eps) sampler_tv) <= eps``
    (module docstring): the curve's epsilon at ``delta`` once the sampler's share is taken out.
    Infinity when no eps leaves a positive delta for the curve."""
    if sampler_tv <= 0.0:
        return rdp_to_epsilon(rdp, pure, delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")

    def converted(eps: float) -> float:
        # (1 + e^eps) T, computed so that a huge eps gives an infinite share, not an overflow
        share = sampler_tv * (1.0 + math.exp(min(eps, 700.0)))
        left = delta - share
        # 0 < left < delta < 1: converted with its own term, not kept (every iterate's differs)
        return math.inf if not left > 0.0 else _epsilon_at(rdp, pure, _delta_term(left))

    # converted() is non-decreasing in eps: iterate up from below to the least fixed point
    eps = converted(0.0)
    for _ in range(_FIXED_POINT_ITERATIONS):
        if math.isinf(eps):
            return math.inf
        candidate = eps * (1.0 + 1e-9) + 1e-15  # a point just above the iterate
        if converted(candidate) <= candidate:
            return candidate
        eps = converted(candidate)
    return math.inf


@dataclass(frozen=True, eq=False)
class RdpCurve:
    """A Renyi-DP curve on :data:`ORDERS` plus the pure (alpha = infinity) epsilon, and the
    sampler's summed coupling failure ``sampler_tv`` (module docstring)."""

    rdp: np.ndarray
    pure: float
    sampler_tv: float = 0.0

    def __post_init__(self) -> None:
        rdp = np.array(self.rdp, dtype=np.float64)
        if rdp.shape != ORDERS.shape:
            raise ValueError(f"curve has {rdp.shape} values, grid has {ORDERS.shape}")
        if not (rdp >= 0.0).all() or not self.pure >= 0:  # NaN >= 0 is False: refused too
            raise ValueError("an RDP curve is non-negative and not NaN")
        if not 0.0 <= self.sampler_tv < math.inf:
            raise ValueError("a sampler coupling failure is a finite non-negative probability")
        rdp.setflags(write=False)
        object.__setattr__(self, "rdp", rdp)
        object.__setattr__(self, "pure", float(self.pure))
        object.__setattr__(self, "sampler_tv", float(self.sampler_tv))

    @classmethod
    def zero(cls) -> RdpCurve:
        return cls(np.zeros_like(ORDERS), 0.0)

    def __add__(self, other: RdpCurve) -> RdpCurve:
        if not isinstance(other, RdpCurve):
            return NotImplemented
        # the sum of two checked curves passes the checks (non-negative values, possibly
        # infinite, add to non-negative values, never NaN): built without checking again
        tv = self.sampler_tv + other.sampler_tv
        if tv == math.inf:  # pragma: no cover - two finite probabilities' sum overflowing
            return RdpCurve(self.rdp + other.rdp, self.pure + other.pure, tv)  # refused
        rdp = self.rdp + other.rdp
        rdp.setflags(write=False)
        total = object.__new__(RdpCurve)
        object.__setattr__(total, "rdp", rdp)
        object.__setattr__(total, "pure", self.pure + other.pure)
        object.__setattr__(total, "sampler_tv", tv)
        return total

    def __mul__(self, times: int) -> RdpCurve:
        """``times`` identical compositions."""
        if times < 0:
            raise ValueError("a curve composes a non-negative number of times")
        return RdpCurve(self.rdp * times, self.pure * times, self.sampler_tv * times)

    __rmul__ = __mul__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RdpCurve):
            return NotImplemented
        return (
            bool(np.array_equal(self.rdp, other.rdp))
            and self.pure == other.pure
            and self.sampler_tv == other.sampler_tv
        )

    def __hash__(self) -> int:
        return hash((self.rdp.tobytes(), self.pure, self.sampler_tv))

    def with_sampler_tv(self, sampler_tv: float) -> RdpCurve:
        """This curve with ``sampler_tv`` added to its sampler share."""
        return RdpCurve(self.rdp, self.pure, self.sampler_tv + sampler_tv)

    def epsilon(self, delta: float) -> float:
        """What the curve certifies at ``delta``, the sampler's share taken out of it."""
        return sound_epsilon(self.rdp, self.pure, self.sampler_tv, delta)

    def to_json(self) -> dict[str, Any]:
        """Serialisable form, tagged with the grid version it was evaluated on (``sampler_tv``
        only when there is one, so that curves without it keep their stored form)."""
        data: dict[str, Any] = {
            "grid_version": GRID_VERSION, "rdp": self.rdp.tolist(), "pure": self.pure
        }  # fmt: skip
        if self.sampler_tv:
            data["sampler_tv"] = self.sampler_tv
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RdpCurve:
        if data.get("grid_version") != GRID_VERSION:
            raise ValueError(
                f"curve stored on order grid version {data.get('grid_version')}, "
                f"this code uses {GRID_VERSION}: run the migration that converts it"
            )
        return cls(
            np.asarray(data["rdp"], dtype=np.float64),
            float(data["pure"]),
            float(data.get("sampler_tv", 0.0)),
        )


def curve_key(data: dict[str, Any]) -> str:
    """A key that tells stored curves apart (for caches of parsed curves)."""
    return repr(data.get("rdp")) + repr(data.get("pure")) + repr(data.get("sampler_tv"))


def compose(curves: list[RdpCurve]) -> RdpCurve:
    total = RdpCurve.zero()
    for curve in curves:
        total = total + curve
    return total
