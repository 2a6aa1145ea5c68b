"""The two privacy models every mechanism offers."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """Which edges a released answer protects.

    ``PERSONALIZED``: the answer for seed s goes to user s only; edges incident to s are not
    protected, every other edge is (joint edge-level DP).
    ``EDGE``: every edge is protected, the seed's included (plain edge-level DP).
    """

    PERSONALIZED = "personalized"
    EDGE = "edge"
