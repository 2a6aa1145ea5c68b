"""Admission: the ledger's atomic admit-and-charge, for one query or a group.

A query is admitted alone (one transaction), group-committed with the queries that reach the
worker while the previous admission transaction runs (``ledger_group_max`` > 1), or with the
whole group of :meth:`~service.serving.pipeline.group.GroupAnswers.answer_many` (rankings,
DP-IE embeddings) in one transaction per graph-wide cap in force. The checks are the
ledger's; here a ranking becomes its :class:`Admission` (quota, graph-wide cap, twin key,
degree release); another kind states its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from service.config import MechanismSettings
from service.errors import ServiceError
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import Admission, ChargeReceipt, DegreeCharge, GraphCap
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import DiffusionPlan
from service.privacy.laplace import count_release_curve
from service.privacy.modes import Mode
from service.serving.group_commit import GroupCommitter
from service.serving.pipeline.items import Pending, Prepared
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.planner import DiffusionPlanner
from service.serving.rankings import RankingPlan
from service.serving.refresh import replayable_after
from service.serving.schemas import Principal

#: A query of any kind prepared for admission (a ranking's :class:`Pending`, an embedding's).
P = TypeVar("P", bound=Prepared)


class Admitter:
    """Turns prepared queries into charges (or refusals) in the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        policy: AdmissionPolicy,
        mechanism: MechanismSettings,
        planner: DiffusionPlanner,
        group_max: int,
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.mechanism = mechanism
        self.planner = planner
        # Group commit (group_max > 1): concurrent admissions share one transaction;
        # 1: one transaction per query.
        self._admitting: GroupCommitter[tuple[Admission, GraphCap | None], ChargeReceipt] | None
        self._admitting = None
        if group_max > 1:
            self._admitting = GroupCommitter(self._admit_together, max_group=group_max)
        self._max_charge: dict[str, RdpCurve] = {}
        self._exposure_delta: tuple[float, float] | None = None  # (value, read at monotonic)

    # -- one query ------------------------------------------------------------------------

    def admit(self, p: Pending) -> ChargeReceipt:
        a = self.admission(p)
        if self._admitting is not None:
            return self._admitting.submit((a, self.graph_cap(p.graph)))
        return self._admit_alone(a, self.graph_cap(p.graph))

    def admission(self, p: Pending) -> Admission:
        principal = p.req.principal
        quota = self.quota_for(principal, p.account_id)
        return Admission(
            charged_account_id=p.account_id,
            principal_account_id=principal.account_id,
            seed=p.req.node,
            mechanism=str(p.mechanism["name"]),
            mode=p.req.mode.value,
            params=p.mechanism,
            query_curve=p.plan.curve,
            query_epsilon=p.plan.epsilon,
            graph_version=p.graph.version,
            request_id=p.req.request_id,
            idempotency_key=p.req.idempotency_key,
            release_key=p.key if p.join_twins else None,
            released_after=replayable_after(p.req.max_age_seconds),
            quota_epsilon=quota,
            degree=_degree_charge(p.plan),
        )

    def quota_for(self, principal: Principal, account_id: int) -> float | None:
        """The 24-hour quota to check when a service account charges another account."""
        if principal.type == "service" and account_id != principal.account_id:
            if principal.quota_epsilon is not None:
                return principal.quota_epsilon
            return self.policy.service_quota_epsilon
        return None

    def _admit_alone(self, a: Admission, graph_cap: GraphCap | None) -> ChargeReceipt:
        return self.ledger.admission.admit_and_charge(
            a, graph_cap=graph_cap, stale_after_seconds=self.policy.stale_after_seconds
        )

    def _admit_together(
        self, items: list[tuple[Admission, GraphCap | None]]
    ) -> list[ChargeReceipt | BaseException]:
        """One group of concurrent admissions: one transaction per graph-wide cap in force
        (normally one); a lone admission: the single-query transaction."""
        if len(items) == 1:
            admission, cap = items[0]
            try:
                return [self._admit_alone(admission, cap)]
            except ServiceError as exc:
                return [exc]
        out: list[ChargeReceipt | BaseException | None] = [None] * len(items)
        parts: dict[Any, list[int]] = {}
        for i, (_, cap) in enumerate(items):
            part = None if cap is None else (cap.cap_epsilon, cap.delta, id(cap.max_charge))
            parts.setdefault(part, []).append(i)
        for indices in parts.values():
            outcomes: list[ChargeReceipt | ServiceError] | list[Exception]
            try:
                outcomes = self.ledger.admission.admit_and_charge_many(
                    [items[i][0] for i in indices],
                    graph_cap=items[indices[0]][1],
                    stale_after_seconds=self.policy.stale_after_seconds,
                )
            except Exception as exc:
                outcomes = [exc] * len(indices)
            for i, outcome in zip(indices, outcomes, strict=True):
                out[i] = outcome
        return [outcome for outcome in out if outcome is not None]

    # -- a group of queries ---------------------------------------------------------------

    def admit_many(
        self,
        pending: list[tuple[int, P]],
        settle: Callable[[int, BaseException], None],
        admission: Callable[[P], Admission],
    ) -> list[tuple[int, P, ChargeReceipt]]:
        """Admit a group of prepared queries (of any kind: ``admission`` states each one's
        charge, :meth:`admission` a ranking's) in one transaction per graph version served
        (normally one); a refused query (or a failed transaction) is settled with its error."""
        graph_caps = {id(p.graph): self.graph_cap(p.graph) for _, p in pending}
        by_cap: dict[int, list[tuple[int, P]]] = {}
        for i, p in pending:
            by_cap.setdefault(id(p.graph), []).append((i, p))
        admitted: list[tuple[int, P, ChargeReceipt]] = []
        for graph_id, group in by_cap.items():
            try:
                receipts = self.ledger.admission.admit_and_charge_many(
                    [admission(p) for _, p in group],
                    graph_cap=graph_caps[graph_id],
                    stale_after_seconds=self.policy.stale_after_seconds,
                )
            except Exception as exc:
                for i, _ in group:
                    settle(i, exc)
                continue
            for (i, p), receipt in zip(group, receipts, strict=True):
                if isinstance(receipt, BaseException):
                    settle(i, receipt)
                else:
                    admitted.append((i, p, receipt))
        return admitted

    # -- the graph-wide cap ---------------------------------------------------------------

    def graph_cap(self, graph: Graph) -> GraphCap | None:
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


def _degree_charge(plan: DiffusionPlan | RankingPlan) -> DegreeCharge | None:
    """The degree release an answer of ``plan`` is built on (``blended``), as charged."""
    degrees = plan.degrees if isinstance(plan, RankingPlan) else None
    if degrees is None:
        return None
    return DegreeCharge(degrees.graph_version, degrees.plan.epsilon, degrees.curve)
