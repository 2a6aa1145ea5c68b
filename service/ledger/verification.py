"""``ledger verify``: recompute everything the ledger derives and compare it with what it stores.

Every account's spend is recomputed from its live (unrefunded) charges, curve by curve on the
stored grid, in charge-id order, and compared with the stored curve, count and converted
epsilon. Charge states are checked against the release and refund rows (``released`` iff a
release is stored, ``refunded`` iff a refund row exists). Every live keyed charge holds its
Idempotency-Key's binding, and no binding names a refunded charge. Admitted charges without a
release are counted by age: they are in flight, or their process died and ``ledger reconcile``
settles them. The exposure shards must bound the composition of every live charge and graph-wide
release (they are rounded up on refunds, never down). Every charge records the UTC day it
was admitted on, and an account with a budget period composes each window of it (since its
budget last changed) under its period cap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Engine, func, or_, select
from sqlalchemy.orm import Session

from service.ledger.budget_rule import fits_under_cap
from service.ledger.periods import PERIODS, as_aware_utc, day_start, period_start
from service.ledger.quota_buckets import buckets_from_charges, stored_buckets
from service.ledger.tables import (
    DEGREE_RELEASE_CHARGE,
    EXPOSURE_SHARDS,
    GRAPH_RELEASE_CHARGES,
    POPULAR_BINDING,
    SYNTHETIC_RELEASE_CHARGE,
    Account,
    Budget,
    Charge,
    ExposureShard,
    GraphRelease,
    IdempotencyBinding,
    Refund,
    Release,
    Spend,
    SynthesisJob,
    utcnow,
)
from service.privacy.accountant import RdpCurve

#: Relative tolerance of a recomputed value against the stored one (they are computed by the
#: same left fold, so they normally agree bit for bit).
RTOL = 1e-9
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("under_1m", 60.0),
    ("1m_to_1h", 3600.0),
    ("over_1h", float("inf")),
)


@dataclass
class VerifyReport:
    accounts_checked: int = 0
    charges_checked: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    admitted_without_release: dict[str, Any] = field(default_factory=dict)
    #: Accounts with a budget period whose windows were recomposed.
    periods_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=RTOL, atol=1e-12))


def verify_ledger(engine: Engine) -> VerifyReport:
    report = VerifyReport()
    with Session(engine) as session:
        _check_spends(session, report)
        _check_states(session, report)
        _check_bindings(session, report)
        _check_admitted(session, report)
        _check_exposure(session, report)
        _check_synthesis(session, report)
        _check_periods(session, report)
        _check_quota_buckets(session, report)
    return report


def _check_quota_buckets(session: Session, report: VerifyReport) -> None:
    """Every service account's quota bucket holds the sum and count of its live charges to
    other accounts made in that minute (a charge never moves between buckets)."""
    expected = buckets_from_charges(session)
    stored = stored_buckets(session)
    for key in sorted(expected.keys() | stored.keys()):
        want_eps, want_count = expected.get(key, (0.0, 0))
        have_eps, have_count = stored.get(key, (0.0, 0))
        if have_count != want_count or not np.isclose(have_eps, want_eps, RTOL, atol=1e-12):
            principal, start = key
            report.mismatches.append({
                "kind": "quota_bucket", "account_id": principal,
                "detail": f"the bucket from {start.isoformat()} holds {have_count} charges, "
                f"{have_eps!r} epsilon; its live charges to others: {want_count}, {want_eps!r}",
            })  # fmt: skip


def _check_periods(session: Session, report: VerifyReport) -> None:
    """Every charge records the UTC day of its admission (``period_start``); and for every
    account with a budget period, every window of that period since its budget last changed
    composes its live charges under the period cap (a window that began before the change
    was admitted under the settings then, so it is not held to the new ones)."""
    days = select(Charge.id, Charge.created_at, Charge.period_start).execution_options(
        yield_per=2000
    )
    for charge_id, created_at, start in session.execute(days):
        if start is None or as_aware_utc(start) != day_start(created_at):
            report.mismatches.append({
                "kind": "period_start", "charge_id": charge_id,
                "detail": f"period_start {start} is not the UTC day of created_at {created_at}",
            })  # fmt: skip
    budgets = session.scalars(select(Budget).where(Budget.period.is_not(None))).all()
    for budget in budgets:
        report.periods_checked += 1
        if budget.period not in PERIODS or budget.period_cap_epsilon is None:
            report.mismatches.append({
                "kind": "period", "account_id": budget.account_id,
                "detail": f"period {budget.period!r} with cap {budget.period_cap_epsilon!r}",
            })  # fmt: skip
            continue
        changed = as_aware_utc(budget.updated_at)
        windows: dict[Any, RdpCurve] = {}
        rows: Any = session.execute(
            select(Charge.created_at, Charge.rdp)
            .where(Charge.charged_account_id == budget.account_id, Charge.state != "refunded")
            .order_by(Charge.id)
        )
        for created_at, rdp in rows:
            start = period_start(budget.period, created_at)
            if start >= changed:
                windows[start] = windows.get(start, RdpCurve.zero()) + RdpCurve.from_json(rdp)
        for start, spent in sorted(windows.items()):
            used = spent.epsilon(budget.delta)
            if not fits_under_cap(used, budget.period_cap_epsilon):
                report.mismatches.append({
                    "kind": "period_cap", "account_id": budget.account_id,
                    "detail": f"the {budget.period} from {start.isoformat()} composes to "
                    f"{used:.6g}, over its cap {budget.period_cap_epsilon:.6g}",
                })  # fmt: skip


#: A synthesis job's state and the state its graph release must be in.
_JOB_RELEASE_STATES = {"running": "admitted", "done": "released", "failed": "refunded"}


def _check_synthesis(session: Session, report: VerifyReport) -> None:
    """Every synthesis job's release is in the state its job says (done: released, with the
    payload; failed: refunded; running: still admitted)."""
    rows = session.execute(
        select(SynthesisJob.id, SynthesisJob.state, GraphRelease.state, GraphRelease.payload)
        .join(GraphRelease, GraphRelease.id == SynthesisJob.release_id)
        .limit(10_000)
    )
    for job_id, job_state, release_state, payload in rows:
        expected = _JOB_RELEASE_STATES.get(job_state)
        if release_state != expected or (job_state == "done") != (payload is not None):
            report.mismatches.append({
                "kind": "synthesis", "job_id": job_id,
                "detail": f"job {job_state} but its graph release is {release_state}"
                + ("" if (job_state == "done") == (payload is not None) else ", payload wrong"),
            })  # fmt: skip


def _check_spends(session: Session, report: VerifyReport) -> None:
    spends = {
        row.account_id: (row, delta)
        for row, delta in session.execute(
            select(Spend, Budget.delta).join(Budget, Budget.account_id == Spend.account_id)
        )
    }
    report.accounts_checked = int(session.scalar(select(func.count(Account.id))) or 0)
    folds: dict[int, tuple[RdpCurve, int]] = {}
    stmt = (
        select(Charge.charged_account_id, Charge.rdp)
        .where(Charge.state != "refunded")
        .order_by(Charge.charged_account_id, Charge.id)
        .execution_options(yield_per=2000)
    )
    rows: Any = session.execute(stmt)
    for account_id, rdp in rows:
        total, count = folds.get(account_id, (RdpCurve.zero(), 0))
        folds[account_id] = (total + RdpCurve.from_json(rdp), count + 1)
        report.charges_checked += 1
    for account_id, (spend, delta) in spends.items():
        total, count = folds.pop(account_id, (RdpCurve.zero(), 0))
        stored = RdpCurve.from_json(spend.rdp)
        problems = []
        if not _close(stored.rdp, total.rdp) or not np.isclose(stored.pure, total.pure, RTOL):
            problems.append("spent curve differs from the composition of its live charges")
        if not np.isclose(stored.sampler_tv, total.sampler_tv, RTOL, atol=1e-18):
            problems.append("sampler share differs from the sum of its live charges'")
        if spend.charges != count:
            problems.append(f"charge count {spend.charges} stored, {count} live charges")
        expected = total.epsilon(delta)
        if not np.isclose(spend.epsilon, expected, rtol=RTOL, atol=1e-12):
            problems.append(f"spent epsilon {spend.epsilon!r} stored, {expected!r} recomputed")
        for problem in problems:
            report.mismatches.append({"kind": "spend", "account_id": account_id, "detail": problem})
    for account_id in folds:
        report.mismatches.append(
            {"kind": "spend", "account_id": account_id, "detail": "charges without a spend row"}
        )


def _check_states(session: Session, report: VerifyReport) -> None:
    checks = [
        (
            "released charge without a stored release",
            select(Charge.id).where(
                Charge.state == "released",
                Charge.mechanism.not_in(GRAPH_RELEASE_CHARGES),  # its release is a graph release
                ~select(Release.charge_id).where(Release.charge_id == Charge.id).exists(),
            ),
        ),
        (
            "synthetic-release charge that names no released graph release",
            select(Charge.id).where(
                Charge.mechanism == SYNTHETIC_RELEASE_CHARGE,
                Charge.state != "refunded",
                ~select(GraphRelease.id)
                .where(GraphRelease.id == Charge.graph_release_id, GraphRelease.state == "released")
                .exists(),
            ),
        ),
        (
            "release stored for a charge that is not released",
            select(Release.charge_id)
            .join(Charge, Charge.id == Release.charge_id)
            .where(Charge.state != "released"),
        ),
        (
            "refunded charge without a refund row",
            select(Charge.id).where(
                Charge.state == "refunded",
                ~select(Refund.id).where(Refund.charge_id == Charge.id).exists(),
            ),
        ),
        (
            "refund row for a charge that is not refunded",
            select(Refund.charge_id)
            .join(Charge, Charge.id == Refund.charge_id)
            .where(Charge.state != "refunded"),
        ),
    ]
    for detail, stmt in checks:
        for charge_id in session.scalars(stmt.limit(1000)):
            report.mismatches.append({"kind": "state", "charge_id": charge_id, "detail": detail})


def _check_bindings(session: Session, report: VerifyReport) -> None:
    """Every key a live charge was charged under is bound to it, and no bound key names a
    refunded charge (a refund frees the keys bound to it)."""
    bound_to_itself = (
        select(IdempotencyBinding.id)
        .where(
            IdempotencyBinding.charge_id == Charge.id,
            IdempotencyBinding.principal_account_id == Charge.principal_account_id,
            IdempotencyBinding.idempotency_key == Charge.idempotency_key,
            IdempotencyBinding.freed_at.is_(None),
        )
        .exists()
    )
    checks = [
        (
            "keyed live charge whose Idempotency-Key is not bound to it",
            select(Charge.id).where(
                Charge.idempotency_key.is_not(None), Charge.state != "refunded", ~bound_to_itself
            ),
        ),
        (
            "Idempotency-Key still bound to a refunded charge",
            select(IdempotencyBinding.charge_id)
            .join(Charge, Charge.id == IdempotencyBinding.charge_id)
            .where(IdempotencyBinding.freed_at.is_(None), Charge.state == "refunded"),
        ),
        (
            "popular Idempotency-Key not bound to a released degree-release charge",
            select(IdempotencyBinding.charge_id)
            .join(Charge, Charge.id == IdempotencyBinding.charge_id)
            .where(
                IdempotencyBinding.kind == POPULAR_BINDING,
                or_(Charge.mechanism != DEGREE_RELEASE_CHARGE, Charge.state != "released"),
            ),
        ),
        (
            "Idempotency-Key of a charged query bound to a degree-release charge",
            select(IdempotencyBinding.charge_id)
            .join(Charge, Charge.id == IdempotencyBinding.charge_id)
            .where(
                IdempotencyBinding.kind != POPULAR_BINDING,
                Charge.mechanism == DEGREE_RELEASE_CHARGE,
            ),
        ),
        (
            "popular Idempotency-Key bound by another caller than the degree charge's account "
            "or its principal",
            select(IdempotencyBinding.charge_id)
            .join(Charge, Charge.id == IdempotencyBinding.charge_id)
            .join(Account, Account.id == IdempotencyBinding.principal_account_id)
            .where(
                IdempotencyBinding.kind == POPULAR_BINDING,
                IdempotencyBinding.principal_account_id != Charge.charged_account_id,
                Account.type != "service",
            ),
        ),
    ]
    for detail, stmt in checks:
        for charge_id in session.scalars(stmt.limit(1000)):
            report.mismatches.append(
                {"kind": "idempotency", "charge_id": charge_id, "detail": detail}
            )


def _check_admitted(session: Session, report: VerifyReport) -> None:
    now = utcnow()
    counts = {name: 0 for name, _ in AGE_BUCKETS}
    oldest = 0.0
    for (created_at,) in session.execute(
        select(Charge.created_at).where(Charge.state == "admitted")
    ):
        moment = (
            created_at if created_at.tzinfo is not None else created_at.replace(tzinfo=now.tzinfo)
        )
        age = max(0.0, (now - moment).total_seconds())
        oldest = max(oldest, age)
        for name, limit in AGE_BUCKETS:
            if age < limit:
                counts[name] += 1
                break
    report.admitted_without_release = {
        "count": sum(counts.values()),
        "by_age": counts,
        "oldest_seconds": round(oldest, 3),
    }


def _check_exposure(session: Session, report: VerifyReport) -> None:
    exact = [RdpCurve.zero() for _ in range(EXPOSURE_SHARDS)]
    # what was ever added to a shard, refunded rows included: a refund subtracts its curve
    # from the stored total, so the total's rounding is that of the larger sum it came from
    gross = [RdpCurve.zero() for _ in range(EXPOSURE_SHARDS)]
    counts = [0] * EXPOSURE_SHARDS
    # an account's degree- or synthetic-release charge is the graph release's curve, counted
    # there once
    charges = select(Charge.exposure_shard, Charge.rdp, Charge.state).where(
        Charge.mechanism.not_in(GRAPH_RELEASE_CHARGES)
    )
    graph = select(GraphRelease.exposure_shard, GraphRelease.rdp, GraphRelease.state)
    for stmt in (charges, graph):
        rows: Any = session.execute(stmt.execution_options(yield_per=2000))
        for shard, rdp, state in rows:
            curve = RdpCurve.from_json(rdp)
            gross[shard] = gross[shard] + curve
            if state != "refunded":
                exact[shard] = exact[shard] + curve
                counts[shard] += 1
    rows = {row.shard: row for row in session.scalars(select(ExposureShard))}
    for shard in range(EXPOSURE_SHARDS):
        row = rows.get(shard)
        if row is None:
            report.mismatches.append(
                {"kind": "exposure", "shard": shard, "detail": "exposure shard row missing"}
            )
            continue
        stored = RdpCurve.from_json(row.rdp)
        # summation order and refunds' rounding, not understatement
        slack = 1e-12 * np.abs(gross[shard].rdp) + 1e-15
        pure_slack = 1e-12 * gross[shard].pure + 1e-15 if np.isfinite(gross[shard].pure) else 0.0
        below = (
            bool(np.any(stored.rdp < exact[shard].rdp - slack))
            or stored.pure < exact[shard].pure - pure_slack
            or stored.sampler_tv < exact[shard].sampler_tv * (1 - 1e-12) - 1e-21
        )
        close = bool(
            np.all(
                np.abs(stored.rdp - exact[shard].rdp)
                <= RTOL * np.abs(exact[shard].rdp) + 1e-12 + slack
            )
        )
        if below or not close or row.charges != counts[shard]:
            report.mismatches.append(
                {
                    "kind": "exposure",
                    "shard": shard,
                    "detail": "exposure shard does not match its live charges"
                    + (" (it understates them)" if below else ""),
                }
            )
