"""The budget planner against independent numbers: its per-answer epsilon and composed curve for a
year of daily answers (cap 1, 365 answers, 4 graph versions) checked against a composition of the
same Laplace releases in ``dp_accounting`` to 1e-6; the curves it composes are those the service
charges; the projection of a spend to its cap; bad input; the ``plan`` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp as dp_rdp

from service.cli import main
from service.errors import InvalidParameter
from service.evaluation.runner import EvaluationRow
from service.graph.generate import write_generated_edge_list
from service.ledger.budget_rule import fits_under_cap
from service.mechanisms.charges import answer_curve, count_release, degree_release, version_curve
from service.mechanisms.registry import RankingMechanism
from service.planning.budget import Deployment, plan_budget
from service.planning.quality import PlanComparison, recommended
from service.privacy.accountant import RdpCurve
from service.privacy.calibration import calibrate
from service.privacy.curves import laplace_curve
from service.privacy.horizon import (
    PLAN_RTOL,
    conversion_table,
    days_until_cap,
    floor_significant,
    largest_fitting,
    order_epsilons,
)
from service.privacy.modes import Mode
from service.privacy.orders import ORDERS
from service.serving.rankings import plan_ranking

CAP, DAYS, VERSIONS, DELTA, EPS_D = 1.0, 365, 4, 1e-6, 0.1


def _dp_accounting_epsilon(per_answer: float, answers: int, degree_releases: int) -> float:
    """(eps, delta) of ``answers`` Laplace releases at ``per_answer`` and ``degree_releases`` at
    eps_d, composed and converted by dp_accounting's RDP accountant on the service's orders."""
    accountant = dp_rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / per_answer), answers)
    if degree_releases:
        accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / EPS_D),
                           degree_releases)  # fmt: skip
    return float(accountant.get_epsilon(DELTA))


def _dp_accounting_rdp(per_answer: float, answers: int, degree_releases: int) -> np.ndarray:
    accountant = dp_rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / per_answer), answers)
    if degree_releases:
        accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / EPS_D),
                           degree_releases)  # fmt: skip
    return np.asarray(accountant._rdp, dtype=np.float64)


def _dp_accounting_largest(answers: int, degree_releases: int) -> float:
    """The largest per-answer epsilon whose composition dp_accounting converts to <= CAP
    (bisection on dp_accounting's own figure)."""
    lo, hi = 1e-6, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if _dp_accounting_epsilon(mid, answers, degree_releases) <= CAP:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize(
    ("mechanism", "releases"),
    [("blended", VERSIONS), ("friends_of_friends", 0), ("common_neighbours", 0)],
)
def test_a_year_of_daily_answers_agrees_with_dp_accounting(mechanism: str, releases: int) -> None:
    plan = plan_budget(CAP, DAYS, 1, mechanism=mechanism, delta=DELTA, graph_versions=VERSIONS,
                       deployment=Deployment(popular_epsilon=EPS_D))  # fmt: skip
    assert plan.answers == 365 and plan.degree_releases == releases
    assert plan.epsilon is not None and plan.answer_epsilon is not None
    theirs = _dp_accounting_largest(365, releases)
    assert plan.epsilon == pytest.approx(theirs, abs=1e-6)
    assert plan.epsilon <= theirs * (1 + 1e-5)  # rounded down (the stated eps is a hair lower)
    # the composed curve, order by order, and its conversion, against dp_accounting composing
    # the releases at the epsilon each answer is charged
    rdp = _dp_accounting_rdp(plan.answer_epsilon, 365, releases)
    assert np.allclose(plan.composed.rdp, rdp, rtol=1e-6, atol=1e-12)
    spent = _dp_accounting_epsilon(plan.answer_epsilon, 365, releases)
    assert plan.spent_epsilon == pytest.approx(spent, abs=1e-6)
    assert plan.spent_epsilon <= CAP * (1 - PLAN_RTOL)
    # the table's rows are the curve's, and its best row is the accountant's figure
    for row in plan.table:
        if math.isinf(row.order):
            assert row.rdp == plan.composed.pure
            continue
        i = int(np.flatnonzero(row.order == ORDERS)[0])
        assert row.rdp == pytest.approx(rdp[i], rel=1e-6)
    (best,) = [r for r in plan.table if r.best]
    assert best.epsilon == pytest.approx(plan.spent_epsilon, rel=1e-12)


def test_the_default_plan_for_a_year_is_friends_of_friends() -> None:
    """cap 1, 365 daily answers of the default ranking (friends_of_friends) over 4 versions:
    0.0116 per answer, within the query range, no degree release."""
    plan = plan_budget(1.0, 365, 1, graph_versions=4)
    assert plan.mechanism == "friends_of_friends"
    assert plan.epsilon == pytest.approx(0.0116005, abs=1e-8)
    assert plan.within_query_range and plan.notes == []
    assert plan.degree_releases == 0 and plan.degrees_spent_epsilon == 0.0


def test_a_year_of_blended_is_below_the_query_minimum() -> None:
    """cap 1, 365 daily answers of blended over 4 versions: ~0.0083 per answer, below
    PPR_EPSILON_MIN 0.01, and the plan says so."""
    plan = plan_budget(1.0, 365, 1, mechanism="blended", graph_versions=4)
    assert plan.mechanism == "blended"
    assert plan.epsilon == pytest.approx(0.00829366, abs=1e-8)
    assert not plan.within_query_range
    assert any("below PPR_EPSILON_MIN" in n for n in plan.notes)
    assert plan.degrees_spent_epsilon == pytest.approx(0.4, abs=1e-4)


def test_one_more_step_would_overspend() -> None:
    for mechanism in ("blended", "noisy_diffusion"):
        plan = plan_budget(1.0, 365, 1, mechanism=mechanism, graph_versions=4)
        assert plan.epsilon is not None
        above = plan.epsilon * (1 + 1e-5)
        curve = answer_curve(mechanism, above, delta=plan.delta, steps=plan.steps,
                             beta=plan.beta, mode=Mode.PERSONALIZED)  # fmt: skip
        degrees = version_curve(mechanism, 0.1) * plan.degree_releases
        assert (curve * 365 + degrees).epsilon(plan.delta) > 1.0
        # what admission would compute for the last planned answer: still within the cap
        assert fits_under_cap(plan.composed.epsilon(plan.delta), 1.0)


def test_the_diffusion_plan_composes_the_calibrated_curve() -> None:
    plan = plan_budget(1.0, 365, 1, mechanism="noisy_diffusion", graph_versions=4)
    assert plan.degree_releases == 0 and plan.epsilon is not None
    one = calibrate(plan.epsilon, plan.delta, plan.steps, plan.beta, Mode.PERSONALIZED).curve
    assert plan.composed == one * 365
    theirs, _ = dp_rdp.compute_epsilon(list(ORDERS), list(plan.composed.rdp), plan.delta)
    assert plan.spent_epsilon == pytest.approx(min(theirs, plan.composed.pure), rel=1e-12)
    assert 0.02 < plan.epsilon < 0.022


def test_the_curves_are_those_the_service_charges() -> None:
    for name in ("common_neighbours", "friends_of_friends", "blended"):
        mechanism = RankingMechanism(name)
        degrees = None
        if mechanism is RankingMechanism.BLENDED:
            from service.serving.rankings import ReleasedDegrees

            degrees = ReleasedDegrees("v", np.zeros(3), degree_release(0.1))
        served = plan_ranking(mechanism, 0.0123, Mode.PERSONALIZED, degrees)
        assert served.curve == answer_curve(name, 0.0123, delta=1e-6, steps=100, beta=0.8,
                                            mode="personalized")  # fmt: skip
        assert served.release is count_release(mechanism, 0.0123)
    assert version_curve("blended", 0.1) == laplace_curve(0.1)
    assert version_curve("friends_of_friends", 0.1) == RdpCurve.zero()
    assert answer_curve("popular", 0.5, delta=1e-6, steps=100, beta=0.8,
                        mode="edge") == RdpCurve.zero()  # fmt: skip


def test_popular_has_no_per_answer_epsilon() -> None:
    plan = plan_budget(1.0, 365, 10, mechanism="popular", graph_versions=4)
    assert plan.epsilon is None and plan.degree_releases == 4
    assert plan.spent_epsilon == pytest.approx(0.4, abs=1e-4)
    assert plan.within_query_range


def test_a_large_cap_is_clamped_to_the_query_maximum() -> None:
    plan = plan_budget(100.0, 1, 1, mechanism="common_neighbours")
    assert plan.epsilon == 2.0 and plan.spent_epsilon < 100.0
    assert any("PPR_EPSILON_MAX" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"cap_epsilon": 0.0}, "cap_epsilon"),
        ({"cap_epsilon": float("nan")}, "cap_epsilon"),
        ({"days": 0}, "days"),
        ({"days": 1.5}, "days"),
        ({"answers_per_day": 0}, "answers_per_day"),
        ({"graph_versions": 0}, "graph_versions"),
        ({"delta": 0.5}, "delta"),
        ({"mechanism": "pagerank"}, "mechanism"),
        ({"mechanism": "blended", "mode": "edge"}, "mechanism"),
        ({"mode": "joint"}, "mode"),
        # blended's four degree releases alone pass the cap
        ({"cap_epsilon": 0.3, "graph_versions": 4, "mechanism": "blended"}, "cap_epsilon"),
        (
            {
                "answers_per_day": 10**6,
                "days": 36_500,
                "cap_epsilon": 1e-6,
                "mechanism": "common_neighbours",
            },
            "answers_per_day",
        ),
    ],
)
def test_bad_input_names_the_parameter(kwargs: dict[str, object], parameter: str) -> None:
    args: dict[str, object] = {"cap_epsilon": 1.0, "days": 365, "answers_per_day": 1, **kwargs}
    with pytest.raises(InvalidParameter) as raised:
        plan_budget(**args)  # type: ignore[arg-type]
    assert raised.value.parameter == parameter


def test_floor_and_largest_fitting() -> None:
    assert floor_significant(0.0082936649) == 0.00829366
    assert floor_significant(1.0) == 1.0
    assert floor_significant(123456789.0) == 123456000.0
    curve = laplace_curve(1.0)
    # a single pure answer: the largest epsilon converts to the cap (a little above it)
    found = largest_fitting(laplace_curve, 1.0, 1e-6, low=1e-6)
    assert found is not None and laplace_curve(found).epsilon(1e-6) <= 1.0
    assert laplace_curve(found * (1 + 1e-5)).epsilon(1e-6) > 1.0
    assert largest_fitting(lambda e: curve + laplace_curve(e), 0.5, 1e-6, low=1e-6) is None


def test_conversion_table_marks_the_accountants_order() -> None:
    curve = laplace_curve(0.01) * 365
    table = conversion_table(curve, 1e-6)
    best = [r for r in table if r.best]
    assert len(best) == 1 and best[0].epsilon == pytest.approx(curve.epsilon(1e-6), rel=1e-12)
    assert math.isinf(table[-1].order) and table[-1].rdp == curve.pure
    assert [r.order for r in table] == sorted(r.order for r in table)
    assert float(np.min(order_epsilons(curve, 1e-6))) == pytest.approx(curve.epsilon(1e-6))


def test_days_until_cap_composes_the_rate() -> None:
    answer = laplace_curve(0.01)
    week = answer * 7  # one answer at 0.01 a day
    spent = answer * 30
    days = days_until_cap(spent, week, 7.0, 1.0, 1e-6)
    assert days is not None

    def after(answers: float) -> RdpCurve:
        return RdpCurve(answer.rdp * answers, answer.pure * answers)

    # the cap is reached after 30 + t answers with t = days: check against the accountant
    assert after(30 + days).epsilon(1e-6) < 1.0 <= after(30 + days + 0.01).epsilon(1e-6)
    # composed, not linear: extrapolating epsilon linearly (0.01 a day) says far fewer days
    linear = (1.0 - spent.epsilon(1e-6)) / 0.01
    assert days > 3 * linear
    assert days_until_cap(spent, RdpCurve.zero(), 7.0, 1.0, 1e-6) is None
    assert days_until_cap(answer * 2000, week, 7.0, 1.0, 1e-6) == 0.0
    assert days_until_cap(spent, week, 7.0, 1000.0, 1e-6) is None  # past the horizon


# -- the command ---------------------------------------------------------------------------


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as raised:
        raise SystemExit(main(argv))
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--cap", "0", "--days", "365", "--answers-per-day", "1"],
         "argument --cap: must be in [1e-06, 1000], got 0"),
        (["--cap", "x", "--days", "365", "--answers-per-day", "1"],
         "argument --cap: expected a number, got 'x'"),
        (["--cap", "1", "--days", "0", "--answers-per-day", "1"],
         "argument --days: must be in [1, 36500], got 0"),
        (["--cap", "1", "--days", "1.5", "--answers-per-day", "1"],
         "argument --days: expected an integer, got '1.5'"),
        (["--cap", "1", "--days", "365", "--answers-per-day", "-3"],
         "argument --answers-per-day: must be in [1, 1000000], got -3"),
        (["--cap", "1", "--days", "365", "--answers-per-day", "1", "--mechanism", "pagerank"],
         "argument --mechanism: invalid choice: 'pagerank'"),
        (["--cap", "1", "--days", "365", "--answers-per-day", "1", "--mechanism", "blended",
          "--mode", "edge"], "error [invalid_parameter]: mechanism: blended is offered in "
         "personalized mode only"),
        (["--cap", "0.3", "--days", "365", "--answers-per-day", "1", "--graph-versions", "4",
          "--mechanism", "blended"],
         "error [invalid_parameter]: cap_epsilon: the 4 degree releases blended is built on"),
    ],
)  # fmt: skip
def test_plan_command_errors(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in _fails(["plan", *argv], capsys)


def test_plan_command_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--cap", "1", "--days", "365", "--answers-per-day", "1", "--graph-versions",
            "4", "--delta", "1e-6"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: friends_of_friends, personalized mode")  # the default
    assert "largest per-answer epsilon: 0.0116005" in out and "query range: ok" in out
    assert main([*argv, "--mechanism", "blended"]) == 0
    out = capsys.readouterr().out
    assert "largest per-answer epsilon: 0.00829366" in out
    assert "query range: OUTSIDE" in out and "order" in out and "inf (pure)" in out
    assert main([*argv, "--mechanism", "blended", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["epsilon"] == pytest.approx(0.00829366) and data["mechanism"] == "blended"
    assert data["curve"][-1]["order"] is None and data["quality"] is None
    assert sum(1 for row in data["curve"] if row["best"]) == 1


def _row(mechanism: str, mean: float, half: float) -> EvaluationRow:
    ci = (mean - half, mean + half)
    return EvaluationRow(mechanism, 0.01, 0.5, ci, 0.5, ci, mean, ci, mean, ci, 200)


def test_the_recommendation_prefers_the_cheaper_of_level_rankings() -> None:
    def compared(mechanism: str, mean: float, half: float) -> PlanComparison:
        plan = plan_budget(1.0, 365, 1, mechanism=mechanism, graph_versions=4)
        return PlanComparison(mechanism, plan, _row(mechanism, mean, half))

    level = [compared("noisy_diffusion", 0.060, 0.01), compared("popular", 0.058, 0.01),
             compared("common_neighbours", 0.02, 0.005)]  # fmt: skip
    best = recommended(level)
    assert best is not None and best.mechanism == "popular"  # level, and spends 0.4 not 1.0
    apart = [compared("noisy_diffusion", 0.30, 0.01), compared("popular", 0.058, 0.01)]
    best = recommended(apart)
    assert best is not None and best.mechanism == "noisy_diffusion"
    # blended's planned epsilon is below PPR_EPSILON_MIN: never recommended
    assert recommended([compared("blended", 0.9, 0.01)]) is None
    assert recommended([PlanComparison("blended", None, refused="does not fit")]) is None


def test_plan_compare_measures_every_ranking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.txt"
    write_generated_edge_list(path, 200, 1600, seed=4)
    argv = ["plan", "--cap", "1", "--days", "365", "--answers-per-day", "1",
            "--graph-versions", "4", "--compare", "--graph", str(path), "--seeds", "8",
            "--sample-seed", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    names = [p["mechanism"] for p in data["plans"]]
    assert names == [m.value for m in RankingMechanism]
    for entry in data["plans"]:
        assert entry["quality"]["seeds"] == 8 and entry["quality"]["k"] == 20
    assert data["recommended"] in names and data["recommended"] != "blended"
    single = [a for a in argv if a not in ("--compare", "--json")]
    assert main([*single, "--mechanism", "popular"]) == 0  # one plan, with its quality
    out = capsys.readouterr().out
    assert "NDCG@20 beyond the seed's neighbours" in out


def test_plan_compare_by_hidden_edges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.txt"
    write_generated_edge_list(path, 200, 1600, seed=4)
    argv = ["plan", "--cap", "1", "--days", "365", "--answers-per-day", "1",
            "--graph-versions", "4", "--graph", str(path), "--seeds", "8", "--sample-seed", "1",
            "--quality", "links"]  # fmt: skip
    assert main([*argv, "--compare", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for entry in data["plans"]:
        assert entry["quality"] is None and entry["links"]["seeds"] == 8
        assert 0.0 <= entry["links"]["recall"] <= 1.0
    assert data["recommended"] in {"noisy_diffusion", "popular", "common_neighbours",
                                   "friends_of_friends"}  # fmt: skip
    assert main(argv) == 0
    assert "Recall@20 of hidden edges" in capsys.readouterr().out
