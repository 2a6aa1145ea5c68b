"""The float sampler's share of delta stays taken out of every account's delta (issue 19,
the closing note's open point 1), and new count releases add none.

A count release drawn with the float64 sampler (before the exact sampler) differed from its
exact-noise twin with probability at most ``FLOAT_COUNT_RELEASE_TV`` (2e-11) on the
coordinates one edge changes. Over an account's releases these add (a union bound); the
accountant keeps the sum in the curve (``sampler_tv``) and converts at
``delta - (1 + e^eps) * sum``. Charges made then keep that share: admission, budgets, the read
figure and the graph-wide exposure still certify (eps, delta) for what was drawn. The ledger
tests below charge such float-era curves (:func:`float_era`). Count releases now draw exactly
(service/mechanisms/exact_laplace.py) and carry no share.

On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from service.ledger import BudgetExhausted, DegreeCharge, Ledger, upgrade
from service.ledger.database import alembic_config
from service.ledger.records import Admission
from service.privacy.accountant import RdpCurve, rdp_to_epsilon
from service.privacy.curves import laplace_curve
from service.privacy.laplace import count_release_curve, plan_laplace, plan_two_scale
from service.privacy.sampler import (
    FLOAT_COUNT_RELEASE_TV,
    count_release_delta,
    count_release_tv,
    vector_release_delta,
)
from service.serving.rankings import degree_release_name

DELTA = 1e-6


def float_era(epsilon: float) -> RdpCurve:
    """What a count release at ``epsilon`` drawn with the float sampler was charged."""
    return laplace_curve(epsilon).with_sampler_tv(FLOAT_COUNT_RELEASE_TV)


def admission(account_id: int, curve: RdpCurve, *, request_id: str, principal: int | None = None,
              degree: DegreeCharge | None = None) -> Admission:  # fmt: skip
    return Admission(
        charged_account_id=account_id,
        principal_account_id=account_id if principal is None else principal,
        seed="1",
        mechanism="friends_of_friends" if degree is None else "blended",
        mode="personalized",
        params={"name": "friends_of_friends"},
        query_curve=curve,
        query_epsilon=curve.pure,
        graph_version="v1",
        request_id=request_id,
        degree=degree,
    )


def sound(curve: RdpCurve, delta: float) -> bool:
    """Whether ``curve.epsilon(delta)`` is a certificate: the ideal mechanisms' epsilon at
    delta minus the sampler's share at that epsilon is no larger."""
    eps = curve.epsilon(delta)
    left = delta - (1.0 + math.exp(eps)) * curve.sampler_tv
    return left > 0 and rdp_to_epsilon(curve.rdp, curve.pure, left) <= eps


# -- the conversion ------------------------------------------------------------------------


def test_count_plans_drawn_exactly_carry_no_share() -> None:
    assert count_release_tv() == 0.0 and FLOAT_COUNT_RELEASE_TV == 2e-11
    assert plan_laplace(0.1, 2.0).curve.sampler_tv == 0.0  # degrees, common neighbours
    assert plan_two_scale(0.1).curve.sampler_tv == 0.0  # friends_of_friends, blended
    assert count_release_curve(0.1) == laplace_curve(0.1)
    assert count_release_delta(0.1) == 0.0 and vector_release_delta(0.1, 256) == 0.0
    # so composed figures are those of the Laplace curves: finite far beyond the old limit
    assert math.isfinite((count_release_curve(0.1) * 1000).epsilon(DELTA))
    assert (float_era(0.1) * 1000).epsilon(DELTA) == math.inf


def test_the_conversion_takes_the_share_out_of_delta_at_the_composed_epsilon() -> None:
    q = float_era(0.1)
    for answers in (1, 10, 16, 100):
        total = q * answers
        ideal = laplace_curve(0.1) * answers
        assert total.sampler_tv == pytest.approx(answers * 2e-11)
        assert sound(total, DELTA)
        assert total.epsilon(DELTA) > ideal.epsilon(DELTA)  # the old figure understated it
        # ... and tight: no more than converting at delta minus a slightly larger share
        left = DELTA - (1 + math.exp(total.epsilon(DELTA) * 1.001)) * total.sampler_tv
        assert total.epsilon(DELTA) <= ideal.epsilon(left) * (1 + 1e-8)
    # past the point where (1 + e^eps) * share reaches delta nothing finite is certified:
    # 1,000 answers at 0.1 compose to eps 20.07 for ideal noise, and e^20 * 2e-8 > 1e-6
    assert (laplace_curve(0.1) * 1000).epsilon(DELTA) < 20.1
    assert (q * 1000).epsilon(DELTA) == math.inf
    # summing the releases' own one-release deltas would understate: each used its own eps
    k = 100
    stated = k * (1 + math.exp(0.1)) * FLOAT_COUNT_RELEASE_TV
    naive = (laplace_curve(0.1) * k).epsilon(DELTA - stated)
    assert (float_era(0.1) * k).epsilon(DELTA) > naive
    # no curve without a share changes
    assert laplace_curve(0.3).epsilon(DELTA) == rdp_to_epsilon(laplace_curve(0.3).rdp, 0.3, DELTA)


def test_a_share_that_leaves_no_delta_certifies_nothing() -> None:
    assert RdpCurve(laplace_curve(0.1).rdp, 0.1, 5e-7).epsilon(1e-6) == math.inf
    assert math.isfinite(RdpCurve(laplace_curve(0.1).rdp, 0.1, 4e-7).epsilon(1e-6))


def test_the_share_round_trips_and_old_curves_read_as_none() -> None:
    curve = float_era(0.2) * 3
    assert RdpCurve.from_json(json.loads(json.dumps(curve.to_json()))) == curve
    old = laplace_curve(0.2).to_json()
    assert "sampler_tv" not in old and RdpCurve.from_json(old).sampler_tv == 0.0
    assert curve != laplace_curve(0.2) * 3


# -- the ledger: admission, budgets, reads, exposure ------------------------------------------


def test_admission_refuses_when_the_sampler_share_leaves_no_delta(ledger: Ledger) -> None:
    """An account whose delta the shares exhaust is refused, whatever its epsilon cap: on the
    old accounting (the Laplace curve alone) every one of these answers was admitted."""
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=50.0, delta=1e-10
    ).account_id
    q = float_era(0.1)
    admitted = 0
    with pytest.raises(BudgetExhausted):
        for i in range(10):
            ledger.admission.admit_and_charge(admission(user, q, request_id=f"r{i}"))
            admitted += 1
    # (1 + e^eps) * k * 2e-11 < 1e-10 needs k <= 2 at these epsilons
    assert admitted == 2
    budget = ledger.budgets.budget(user)
    assert budget.charges == 2 and budget.spent_epsilon == (q * 2).epsilon(1e-10)
    assert sound(q * 2, 1e-10) and ledger.reports.verify().ok


def test_budgets_reads_and_exposure_convert_with_the_share(ledger: Ledger) -> None:
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=100.0, delta=DELTA
    ).account_id
    service = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    q = float_era(0.2)
    d_plan = plan_laplace(0.1, 2.0)
    degree = DegreeCharge("v1", d_plan.epsilon, d_plan.curve)
    ids = [
        ledger.admission.admit_and_charge(
            admission(user, q, request_id="a", principal=service, degree=degree)
        ),
        ledger.admission.admit_and_charge(admission(user, q, request_id="b", principal=service)),
    ]
    expected = q + q + d_plan.curve
    # two float-era count charges keep their shares; the exact degree release adds none
    assert expected.sampler_tv == pytest.approx(2 * 2e-11)
    assert ids[-1].budget.spent_epsilon == pytest.approx(expected.epsilon(DELTA), rel=1e-12)
    assert ledger.budgets.budget(user).spent_epsilon > (laplace_curve(0.2) * 2 + laplace_curve(
        d_plan.epsilon
    )).epsilon(DELTA)  # fmt: skip
    name = degree_release_name(d_plan.scale)
    ledger.graph_releases.graph_release("v1", name, epsilon=d_plan.epsilon, curve=d_plan.curve,
                         draw=lambda: b"released")  # fmt: skip
    view = ledger.read_figures.record_reads(
        service, charge_ids=[a.charge_id for a in ids], graph_release=("v1", name)
    )
    reads = q + q + d_plan.curve
    assert view.epsilon == pytest.approx(reads.epsilon(DELTA), rel=1e-12)
    assert ledger.read_figures.read_view(service).epsilon == pytest.approx(
        reads.epsilon(DELTA), rel=1e-12
    )
    exposure = ledger.reports.exposure(delta=DELTA)  # the two queries and the release once
    assert exposure.epsilon == pytest.approx((q + q + d_plan.curve).epsilon(DELTA), rel=1e-12)
    assert exposure.shards_epsilon == pytest.approx(exposure.epsilon, rel=1e-9)
    report = ledger.reports.verify()
    assert report.ok, report.mismatches


def test_a_refund_takes_its_share_back(ledger: Ledger) -> None:
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=5.0, delta=DELTA
    ).account_id
    q = float_era(0.1)
    first = ledger.admission.admit_and_charge(admission(user, q, request_id="a"))
    ledger.admission.admit_and_charge(admission(user, q, request_id="b"))
    ledger.settlement.refund(first.charge_id, reason="test")
    assert ledger.budgets.budget(user).spent_epsilon == pytest.approx(q.epsilon(DELTA), rel=1e-12)
    report = ledger.reports.verify()
    assert report.ok, report.mismatches


def _revision_before_share() -> str:
    """The revision the sampler-share migration follows (it changes data only, so a ledger at
    0010's schema with the old rows is a ledger at that revision)."""
    path = Path(__file__).resolve().parents[1] / "migrations" / "versions" / "0010_sampler_share.py"
    match = re.search(r'^down_revision: str \| None = "([^"]+)"', path.read_text(), re.M)
    assert match is not None
    return match.group(1)


def test_an_old_ledgers_count_charges_get_their_share_on_upgrade(ledger_url: str) -> None:
    """Rows written by the code before carry the Laplace curve alone; after ``db upgrade``
    their shares are in every composed row and the ledger verifies."""
    upgrade(ledger_url)
    old = Ledger.from_url(ledger_url)
    try:
        user = old.accounts.create_account(
            "user", node_id="1", cap_epsilon=5.0, delta=DELTA
        ).account_id
        service = old.accounts.create_account("service", cap_epsilon=5.0, delta=DELTA).account_id
        bare = laplace_curve(0.2)  # what the code before charged
        d_bare = laplace_curve(0.1)
        a = old.admission.admit_and_charge(admission(user, bare, request_id="a", principal=service,
                                degree=DegreeCharge("v1", 0.1, d_bare)))  # fmt: skip
        b = old.admission.admit_and_charge(admission(user, bare, request_id="b"))
        old.settlement.refund(b.charge_id, reason="test")
        name = degree_release_name(20.0)
        old.graph_releases.graph_release("v1", name, epsilon=0.1, curve=d_bare, draw=lambda: b"x")
        old.read_figures.record_reads(service, charge_ids=[a.charge_id], graph_release=("v1", name))
        before = old.budgets.budget(user).spent_epsilon
        assert before == pytest.approx((bare + d_bare).epsilon(DELTA), rel=1e-12)
    finally:
        old.dispose()
    # the schema of 0010 (the revisions after it change the schema, not these rows)
    command.downgrade(alembic_config(ledger_url), "0010_sampler_share")
    engine = create_engine(ledger_url)
    with engine.begin() as conn:  # as a ledger of the revision before this one
        conn.execute(
            text("UPDATE alembic_version SET version_num = :v"), {"v": _revision_before_share()}
        )
    engine.dispose()
    upgrade(ledger_url)
    after = Ledger.from_url(ledger_url)
    try:
        with_share = bare.with_sampler_tv(2e-11) + d_bare.with_sampler_tv(2e-11)
        assert after.budgets.budget(user).spent_epsilon == pytest.approx(
            with_share.epsilon(DELTA), rel=1e-12
        )
        assert after.budgets.budget(user).spent_epsilon > before
        assert after.read_figures.read_view(service).epsilon == pytest.approx(
            with_share.epsilon(DELTA), rel=1e-12
        )
        report = after.reports.verify()
        assert report.ok, report.mismatches
    finally:
        after.dispose()


def test_a_stored_float_era_degree_release_keeps_its_share(ledger: Ledger) -> None:
    """A graph version whose degree release was drawn with the float sampler before keeps
    serving those bytes: its answers state that release's delta and accounts are charged its
    curve with the share. A release drawn now states 0 and carries none."""
    import numpy as np

    from service.graph.build import build_graph
    from service.mechanisms.popular import degrees_to_bytes
    from service.serving.graph_identity import as_served
    from service.serving.rankings import DegreeReleases, degree_block

    graph = as_served(build_graph([0, 1, 2], [1, 2, 3]), ledger.graph_versions, max_degree_bound=10)
    releases = DegreeReleases(ledger, 0.1)
    plan = releases.plan
    old = np.array([1.0, 2.0, 2.0, 1.0])
    ledger.graph_releases.graph_release(
        graph.version, degree_release_name(plan.scale), epsilon=plan.epsilon,
        curve=float_era(plan.epsilon), draw=lambda: degrees_to_bytes(old),
    )  # fmt: skip
    got = releases.get(graph)
    assert np.array_equal(got.values, old)
    assert got.curve.sampler_tv == FLOAT_COUNT_RELEASE_TV
    assert got.delta == pytest.approx((1 + math.exp(plan.epsilon)) * 2e-11)
    assert degree_block(got)["degree_delta"] == got.delta > 0
    other = as_served(
        build_graph([0, 1], [1, 2], num_nodes=4), ledger.graph_versions, max_degree_bound=10
    )
    fresh = DegreeReleases(ledger, 0.1).get(other)
    assert fresh.curve == plan.curve and fresh.curve.sampler_tv == 0.0
    assert fresh.delta == 0.0 and degree_block(fresh)["degree_delta"] == 0.0
    assert not np.array_equal(fresh.values, np.array([1.0, 2.0, 1.0, 0.0]))  # noisy
