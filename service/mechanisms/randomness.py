"""Where the noise's randomness comes from.

Every release draws from a generator freshly seeded from the operating system's entropy
source. Nothing in the serving path accepts a seed; tests may pass their own generator to the
mechanism functions directly.
"""

from __future__ import annotations

import numpy as np


def fresh_generator() -> np.random.Generator:
    """A new generator seeded with 128 bits from the OS entropy source (``secrets``)."""
    return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence()))
