"""The built-in demo graph the embedded default serves when no edge list is configured.

A deterministic synthetic social network from :func:`service.graph.generate.generate_graph`:
:data:`DEMO_NODES` users in about 200 communities (degree-corrected stochastic block model with
power-law degrees, no isolated user) plus triangle-closing edges, so friend-of-friend
recommendations are meaningful (average local clustering about 0.25). External ids are the
integers ``"0"`` .. ``"9999"`` as strings. It takes well under a second to build, is built
once per process, and always has the same ``version``.
"""

from __future__ import annotations

import functools

from service.graph.generate import generate_graph
from service.graph.model import Graph

DEMO_NODES = 10_000
DEMO_EDGES = 80_000
DEMO_SEED = 20_240_611
DEMO_SOURCE = "demo"


@functools.cache
def demo_graph() -> Graph:
    """The demo graph (cached: every call in a process returns the same object)."""
    return generate_graph(DEMO_NODES, DEMO_EDGES, DEMO_SEED, source=DEMO_SOURCE)
