"""The graph-wide cap on exposure, as admission checks it and as the degree release is made.

Both the prepare stage (a version's degree release is refused past the cap when it is made)
and the admit stage (every charge is checked against it) read the cap here, so neither holds
the other.
"""

from __future__ import annotations

import time

import numpy as np

from service.config import MechanismSettings
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import GraphCap
from service.privacy.accountant import RdpCurve
from service.privacy.laplace import count_release_curve
from service.privacy.modes import Mode
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.planner import DiffusionPlanner


class GraphCaps:
    """The graph-wide cap in force for a graph version (None: no cap)."""

    def __init__(
        self,
        ledger: Ledger,
        policy: AdmissionPolicy,
        mechanism: MechanismSettings,
        planner: DiffusionPlanner,
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.mechanism = mechanism
        self.planner = planner
        self._max_charge: dict[str, RdpCurve] = {}
        self._exposure_delta: tuple[float, float] | None = None  # (value, read at monotonic)

    def for_graph(self, graph: Graph) -> GraphCap | None:
        cap = self.policy.graph_cap_epsilon
        if cap is None:
            return None
        return GraphCap(cap, self._current_exposure_delta(), self._max_charge_curve(graph))

    def _current_exposure_delta(self) -> float:
        if self.policy.exposure_delta is not None:
            return self.policy.exposure_delta
        cached = self._exposure_delta
        if cached is None or time.monotonic() - cached[1] > 10.0:
            cached = (self.ledger.reports.smallest_delta(), time.monotonic())
            self._exposure_delta = cached
        return cached[0]

    def _max_charge_curve(self, graph: Graph) -> RdpCurve:
        """Order by order, the largest curve a query at the largest epsilon can have (at the
        graph's default delta). A charge above it is still admitted exactly, only slower."""
        hit = self._max_charge.get(graph.version)
        if hit is None:
            m = self.mechanism
            delta = m.account_delta
            curves = [
                self.planner.plan(m.epsilon_max, delta, m.steps, m.beta, m.eta, mode).curve
                for mode in Mode
            ] + [count_release_curve(m.epsilon_max)]
            hit = RdpCurve(
                np.max([c.rdp for c in curves], axis=0),
                max(c.pure for c in curves),
                max(c.sampler_tv for c in curves),
            )
            self._max_charge = {graph.version: hit}
        return hit
