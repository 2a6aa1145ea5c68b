"""Composed privacy figures in API answers: a number, or null when it is infinite.

A composed figure (an account's spend, a service account's read figure, the graph-wide
exposure, a curve point) is infinite when the account's delta cannot cover the float
sampler's share of delta carried by releases drawn before the exact sampler
(docs/privacy.md, section 5). JSON has no infinity; such a figure is answered as ``null``
and the schema says so.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BeforeValidator


def _infinite_as_none(value: object) -> object:
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return None
    return value


#: A composed epsilon (or a ratio to one): a finite number, or null for an infinite figure.
ComposedFigure = Annotated[float | None, BeforeValidator(_infinite_as_none)]

__all__ = ["ComposedFigure"]
