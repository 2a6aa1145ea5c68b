"""The baselines' published parameters, importable without their numerical code: the
``evaluate`` command's options default to them (``--help`` imports no numpy)."""

from __future__ import annotations

#: PushFlowCap's sigma in the paper's experimental setting (Section 6): 1e-6.
PUSHFLOWCAP_SIGMA = 1e-6
#: Largest graph (nodes) the O(n^2) edge-flipping baseline accepts by default.
EDGE_FLIPPING_MAX_NODES = 5000
