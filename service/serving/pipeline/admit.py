"""The admit stage: the ledger's atomic admit-and-charge, the one way into admission.

:meth:`Admitter.admit` takes the prepare stage's :class:`PreparedGroup` (a lone query is a
group of one) and returns an :class:`AdmittedGroup`. Every kind of charge goes through it:

- ``popular``: the graph version's degree release, charged once per account and version
  (``quota_and_degree.admit_degree_release``, one transaction each, first);
- every other query: its :class:`Admission` (a kind states its own; :func:`ranking_admission`
  a ranking's), all of the group in one transaction per graph-wide cap in force
  (``admission.admit_and_charge_many``). A group of one is admitted in the single-query
  transaction (``admission.admit_and_charge``), group-committed with the lone queries that
  reach the worker while the previous admission transaction runs (``ledger_group_max`` > 1).

The checks are the ledger's: a refused query writes nothing (its refusal row aside).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.errors import ServiceError
from service.ledger.ledger import Ledger
from service.ledger.records import (
    Admission,
    ChargeReceipt,
    DegreeCharge,
    DegreeReceipt,
    GraphCap,
)
from service.privacy.calibration import DiffusionPlan
from service.serving.group_commit import GroupCommitter
from service.serving.pipeline.graph_caps import GraphCaps
from service.serving.pipeline.items import (
    Admitted,
    AdmittedGroup,
    P,
    Pending,
    PopularPending,
    PreparedGroup,
)
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.rankings import RankingPlan, degree_release_name
from service.serving.refresh import replayable_after

#: One query's admission and the graph-wide cap it is checked against.
_Ask = tuple[Admission, GraphCap | None]


class Admitter:
    """Turns prepared queries into charges (or refusals) in the ledger."""

    def __init__(
        self, ledger: Ledger, policy: AdmissionPolicy, caps: GraphCaps, group_max: int
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.caps = caps
        # Group commit (group_max > 1): concurrent lone admissions share one transaction.
        self._admitting: GroupCommitter[_Ask, ChargeReceipt] | None = None
        if group_max > 1:
            self._admitting = GroupCommitter(self._admit_together, max_group=group_max)

    def admit(
        self, group: PreparedGroup[P], admission: Callable[[P], Admission]
    ) -> AdmittedGroup[P]:
        """Admit a prepared group (``admission`` states what each query is charged, and to
        whom): each query's receipt, sorted by what it does next, or its refusal."""
        out: AdmittedGroup[P] = AdmittedGroup()
        for i, popular in group.popular:
            try:
                out.popular.append((i, popular, self._pay_degree_release(popular)))
            except Exception as exc:
                out.refused.append((i, exc))
        asked: list[tuple[int, P]] = []
        asks: list[_Ask] = []
        for i, p in group.to_admit:
            try:
                asks.append((admission(p), self.caps.for_graph(p.graph)))
            except Exception as exc:
                out.refused.append((i, exc))
                continue
            asked.append((i, p))
        admitted: list[Admitted[P]] = []
        for (i, p), receipt in zip(asked, self._charge(asks), strict=True):
            if isinstance(receipt, BaseException):
                out.refused.append((i, receipt))
            else:
                admitted.append((i, p, receipt))
        out.own, out.joined_earlier, out.joined_here = split_twins(admitted)
        return out

    def _pay_degree_release(self, p: PopularPending) -> DegreeReceipt:
        """``popular``: the version's degree release, charged to the account if it has not
        paid for it yet; an Idempotency-Key is bound in the same transaction."""
        degrees = p.degrees
        return self.ledger.quota_and_degree.admit_degree_release(
            charged_account_id=p.account_id,
            principal_account_id=p.req.principal.account_id,
            seed=p.req.node,
            mode=p.req.mode.value,
            degree=DegreeCharge(p.graph.version, degrees.plan.epsilon, degrees.curve),
            request_id=p.req.request_id,
            quota_epsilon=self.policy.quota_for(p.req.principal, p.account_id),
            idempotency_key=p.req.idempotency_key,
        )

    def _charge(self, asks: list[_Ask]) -> list[ChargeReceipt | BaseException]:
        if len(asks) == 1 and self._admitting is not None:
            try:
                return [self._admitting.submit(asks[0])]
            except Exception as exc:
                return [exc]
        return self._admit_together(asks)

    def _admit_together(self, items: list[_Ask]) -> list[ChargeReceipt | BaseException]:
        """One group of admissions: one transaction per graph-wide cap in force (normally
        one); a lone admission: the single-query transaction."""
        if not items:
            return []
        if len(items) == 1:
            admission, cap = items[0]
            try:
                return [
                    self.ledger.admission.admit_and_charge(
                        admission,
                        graph_cap=cap,
                        stale_after_seconds=self.policy.stale_after_seconds,
                    )
                ]
            except Exception as exc:
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


def ranking_admission(p: Pending, policy: AdmissionPolicy) -> Admission:
    """What a ranking is charged, and to whom: its quota, twin key and degree release."""
    principal = p.req.principal
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
        quota_epsilon=policy.quota_for(principal, p.account_id),
        degree=_degree_charge(p.plan),
        read=policy.read_for(principal, p.graph.version, degree_release_of(p.plan)),
    )


def split_twins(
    admitted: list[Admitted[P]],
) -> tuple[list[Admitted[P]], list[Admitted[P]], list[Admitted[P]]]:
    """A group's admitted queries: its own charges, those that joined a twin (or a key's
    charge) admitted before the group, and those that joined a twin admitted in this group
    (answered from its release once stored: waiting for it would wait for ourselves)."""
    own_ids = {r.charge_id for _, _, r in admitted if not (r.reused or r.joined)}
    own: list[Admitted[P]] = []
    earlier: list[Admitted[P]] = []
    here: list[Admitted[P]] = []
    for item in admitted:
        r = item[2]
        if not (r.reused or r.joined):
            own.append(item)
        else:
            (here if r.charge_id in own_ids else earlier).append(item)
    return own, earlier, here


def _degree_charge(plan: DiffusionPlan | RankingPlan) -> DegreeCharge | None:
    """The degree release an answer of ``plan`` is built on (``blended``), as charged."""
    degrees = plan.degrees if isinstance(plan, RankingPlan) else None
    if degrees is None:
        return None
    return DegreeCharge(degrees.graph_version, degrees.plan.epsilon, degrees.curve)


def degree_release_of(plan: DiffusionPlan | RankingPlan) -> str | None:
    """The graph release name of the degree vector an answer of ``plan`` is built on."""
    degrees = plan.degrees if isinstance(plan, RankingPlan) else None
    return None if degrees is None else degree_release_name(degrees.plan.scale)
