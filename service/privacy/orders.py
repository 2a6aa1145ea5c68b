"""The fixed grid of Renyi orders every stored RDP curve is evaluated on.

The grid is part of the ledger's schema: curves are stored as vectors on it, tagged with
``GRID_VERSION``. Changing the grid means a new version and a migration that re-evaluates or
conservatively maps old rows; never a silent reinterpretation.

At eps ~ 0.1 and delta ~ 1e-6 the optimal order for a single query is above 1000, so the grid
reaches 1e6 (log-spaced past 64). Alpha = infinity (pure DP) is carried separately.
"""

from __future__ import annotations

import hashlib

import numpy as np

GRID_VERSION = 1

_DENSE = (
    1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0,
    6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0,
)  # fmt: skip

#: The orders (all > 1, strictly increasing, finite). Infinity is handled as the ``pure`` part.
ORDERS: np.ndarray = np.concatenate([np.array(_DENSE), np.geomspace(64.0, 1e6, 68)])
ORDERS.setflags(write=False)


def grid_fingerprint() -> str:
    """A short hash of the grid's exact values, stored beside the version as a guard."""
    return hashlib.sha256(ORDERS.tobytes()).hexdigest()[:16]
