"""add_within_graph_cap (service/ledger/exposure_shards.py), the graph-wide cap on the exact
total, on plain shard records: no database."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from service.ledger.budget_rule import ADMISSION_RTOL
from service.ledger.exposure_shards import add_within_graph_cap
from service.ledger.locked_rows import AdmissionWrites, LockedShard
from service.ledger.records import GraphBudgetExhausted, GraphCap
from service.ledger.tables import utcnow
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve

DELTA = 1e-6


def _shards(*curves: RdpCurve) -> list[LockedShard]:
    rows = [
        SimpleNamespace(
            shard=i, rdp=c.to_json(), pure_epsilon=c.pure, charges=1, updated_at=utcnow()
        )
        for i, c in enumerate(curves)
    ]
    return [LockedShard(row) for row in rows]


def _cap(cap_epsilon: float) -> GraphCap:
    return GraphCap(cap_epsilon, DELTA, max_charge=laplace_curve(1.0))


def test_a_curve_that_fits_with_every_shard_is_added_to_the_target() -> None:
    spent, curve = laplace_curve(0.2), laplace_curve(0.1)
    rows = _shards(spent, spent)
    at = (spent + spent + curve).epsilon(DELTA)
    cap = _cap(at * (1 + 2 * ADMISSION_RTOL))
    assert add_within_graph_cap(rows, rows[1], curve, cap, AdmissionWrites()) == 1
    assert rows[1].charges == 2 and RdpCurve.from_json(rows[1].rdp) == spent + curve
    assert rows[0].charges == 1 and RdpCurve.from_json(rows[0].rdp) == spent


@pytest.mark.parametrize("over", [1.0, 1.0 - ADMISSION_RTOL, 0.5])
def test_a_curve_at_or_over_the_cap_with_every_shard_is_refused_changing_nothing(
    over: float,
) -> None:
    spent, curve = laplace_curve(0.2), laplace_curve(0.1)
    rows = _shards(spent, spent)
    at = (spent + spent + curve).epsilon(DELTA)
    with pytest.raises(GraphBudgetExhausted) as refused:
        add_within_graph_cap(rows, rows[0], curve, _cap(at * over), AdmissionWrites())
    assert refused.value.details["exposure_epsilon"] == (spent + spent).epsilon(DELTA)
    assert [r.charges for r in rows] == [1, 1]
    assert all(RdpCurve.from_json(r.rdp) == spent for r in rows)
