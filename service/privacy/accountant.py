"""RDP curves as immutable values: composition and conversion to (epsilon, delta).

A curve is the mechanism's Renyi-DP guarantee on the fixed order grid (:mod:`orders`) plus its
pure-DP value (alpha = infinity). Composition adds curves order by order. Conversion takes the
minimum over orders of the improved bound (Balle et al. 2020; Canonne, Kamath, Steinke 2020)

    eps = r(alpha) + ln(1 - 1/alpha) - ln(delta * alpha) / (alpha - 1)

and the pure value, whichever is smaller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from service.privacy.orders import GRID_VERSION, ORDERS


def rdp_to_epsilon(rdp: np.ndarray, pure: float, delta: float) -> float:
    """Smallest epsilon the curve certifies at ``delta`` (vectorised over the grid)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    rdp = np.asarray(rdp, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = rdp + np.log1p(-1.0 / ORDERS) - (np.log(delta) + np.log(ORDERS)) / (ORDERS - 1.0)
    best = float(np.min(eps))
    return max(0.0, min(best, float(pure)))


@dataclass(frozen=True, eq=False)
class RdpCurve:
    """A Renyi-DP curve on :data:`ORDERS` plus the pure (alpha = infinity) epsilon."""

    rdp: np.ndarray
    pure: float

    def __post_init__(self) -> None:
        rdp = np.array(self.rdp, dtype=np.float64)
        if rdp.shape != ORDERS.shape:
            raise ValueError(f"curve has {rdp.shape} values, grid has {ORDERS.shape}")
        if np.any(rdp < 0) or np.any(np.isnan(rdp)) or not self.pure >= 0:
            raise ValueError("an RDP curve is non-negative and not NaN")
        rdp.setflags(write=False)
        object.__setattr__(self, "rdp", rdp)
        object.__setattr__(self, "pure", float(self.pure))

    @classmethod
    def zero(cls) -> RdpCurve:
        return cls(np.zeros_like(ORDERS), 0.0)

    def __add__(self, other: RdpCurve) -> RdpCurve:
        return RdpCurve(self.rdp + other.rdp, self.pure + other.pure)

    def __mul__(self, times: int) -> RdpCurve:
        """``times`` identical compositions."""
        if times < 0:
            raise ValueError("a curve composes a non-negative number of times")
        return RdpCurve(self.rdp * times, self.pure * times)

    __rmul__ = __mul__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RdpCurve):
            return NotImplemented
        return bool(np.array_equal(self.rdp, other.rdp)) and self.pure == other.pure

    def __hash__(self) -> int:
        return hash((self.rdp.tobytes(), self.pure))

    def epsilon(self, delta: float) -> float:
        return rdp_to_epsilon(self.rdp, self.pure, delta)

    def to_json(self) -> dict[str, Any]:
        """Serialisable form, tagged with the grid version it was evaluated on."""
        return {"grid_version": GRID_VERSION, "rdp": self.rdp.tolist(), "pure": self.pure}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RdpCurve:
        if data.get("grid_version") != GRID_VERSION:
            raise ValueError(
                f"curve stored on order grid version {data.get('grid_version')}, "
                f"this code uses {GRID_VERSION}: run the migration that converts it"
            )
        return cls(np.asarray(data["rdp"], dtype=np.float64), float(data["pure"]))


def compose(curves: list[RdpCurve]) -> RdpCurve:
    total = RdpCurve.zero()
    for curve in curves:
        total = total + curve
    return total
