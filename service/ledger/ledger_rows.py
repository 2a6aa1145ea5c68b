"""Pure conversions of the ledger's rows: records for callers, budget views, curve sums.

No I/O: each function maps rows (ORM or Core) it is given to values, or updates the row in
place; the parts of the ledger call them inside their transactions.
"""

from __future__ import annotations

import math
from datetime import UTC
from typing import Any, cast

import numpy as np

from service.bounds import AccountType
from service.errors import InvalidParameter
from service.ledger.json_text import EncodedJson
from service.ledger.locked_rows import (
    LockedAccount,
    LockedShard,
)
from service.ledger.records import (
    AccountRecord,
    ApiKeyRecord,
    BudgetView,
    ChargeRecord,
    GraphBudgetExhausted,
    GraphCap,
    PeriodFigures,
    ReleaseKey,
    StoredRelease,
)
from service.ledger.release_format import decode_results, results_json
from service.ledger.tables import (
    Account,
    ApiKey,
    Budget,
    Charge,
    ExposureShard,
    Release,
    Spend,
    as_utc,
    iso,
    utcnow,
)
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION

#: The modes an account may be scoped to.
MODES = ("personalized", "edge")


def valid_cap(cap_epsilon: float) -> float:
    if isinstance(cap_epsilon, bool) or not isinstance(cap_epsilon, int | float):
        raise InvalidParameter("cap_epsilon", f"must be a number, got {cap_epsilon!r}")
    if not (math.isfinite(cap_epsilon) and cap_epsilon > 0):
        raise InvalidParameter("cap_epsilon", f"must be a finite number > 0, got {cap_epsilon}")
    return float(cap_epsilon)


def valid_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise InvalidParameter("delta", f"must be a number, got {delta!r}")
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    return float(delta)


def valid_modes(modes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(m.strip() for m in modes if m.strip()))
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise InvalidParameter(
            "modes", f"must be a non-empty subset of {', '.join(MODES)}, got {list(modes)!r}"
        )
    return chosen


def valid_quota(quota_epsilon: float | None) -> float | None:
    if quota_epsilon is None:
        return None
    if isinstance(quota_epsilon, bool) or not isinstance(quota_epsilon, int | float):
        raise InvalidParameter("quota_epsilon", f"must be a number, got {quota_epsilon!r}")
    if not (math.isfinite(quota_epsilon) and quota_epsilon > 0):
        raise InvalidParameter("quota_epsilon", f"must be a finite number > 0, got {quota_epsilon}")
    return float(quota_epsilon)


def valid_read_cap(read_cap_epsilon: float | None) -> float | None:
    if read_cap_epsilon is None:
        return None
    if isinstance(read_cap_epsilon, bool) or not isinstance(read_cap_epsilon, int | float):
        raise InvalidParameter("read_cap_epsilon", f"must be a number, got {read_cap_epsilon!r}")
    if not (math.isfinite(read_cap_epsilon) and read_cap_epsilon > 0):
        raise InvalidParameter(
            "read_cap_epsilon", f"must be a finite number > 0, got {read_cap_epsilon}"
        )
    return float(read_cap_epsilon)


def account_record(row: Account) -> AccountRecord:
    return AccountRecord(
        account_id=row.id,
        type=cast(AccountType, row.type),
        node_id=row.node_id,
        label=row.label,
        may_create_seed_accounts=bool(row.may_create_seed_accounts),
        created_at=iso(row.created_at) or "",
        modes=tuple(m for m in (row.modes or "").split(",") if m),
        quota_epsilon=row.quota_epsilon,
        read_cap_epsilon=row.read_cap_epsilon,
    )


def key_record(row: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=row.id,
        account_id=row.account_id,
        prefix=row.prefix,
        created_at=iso(row.created_at) or "",
        revoked_at=iso(row.revoked_at),
    )


def charge_record(row: Charge, refunded: bool) -> ChargeRecord:
    return ChargeRecord(
        charge_id=row.id,
        created_at=iso(row.created_at) or "",
        charged_account_id=row.charged_account_id,
        principal_account_id=row.principal_account_id,
        seed=row.seed,
        mechanism=row.mechanism,
        mode=row.mode,
        epsilon=row.epsilon,
        graph_version=row.graph_version,
        request_id=row.request_id,
        idempotency_key=row.idempotency_key,
        refunded=refunded,
        params=dict(row.params),
        state=row.state,
    )


def release_record(row: Release) -> StoredRelease:
    return StoredRelease(
        key=ReleaseKey(
            account_id=row.charged_account_id,
            node=row.node,
            graph_version=row.graph_version,
            mode=row.mode,
            epsilon=row.epsilon,
            mechanism=row.mechanism_name,
        ),
        charge_id=row.charge_id,
        results=decode_results(row.results),
        mechanism=dict(row.mechanism),
        request_id=row.request_id,
        released_at=as_utc(row.created_at),
    )


def spent_curve(spend: Spend | LockedAccount) -> RdpCurve:
    return RdpCurve.from_json(spend.rdp)


def budget_view(
    budget: Budget | LockedAccount,
    spend: Spend | LockedAccount,
    spent: RdpCurve | None = None,
    period: PeriodFigures | None = None,
) -> BudgetView:
    """The budget as callers see it; ``period``: the current period's figures, if any."""
    curve = spent_curve(spend) if spent is None else spent
    spent_epsilon = curve.epsilon(budget.delta)
    return BudgetView(
        account_id=budget.account_id,
        spent_epsilon=spent_epsilon,
        cap_epsilon=budget.cap_epsilon,
        remaining_epsilon=max(0.0, budget.cap_epsilon - spent_epsilon),
        delta=budget.delta,
        charges=spend.charges,
        period=period,
    )


def set_spend(
    spend: Spend | LockedAccount, budget: Budget | LockedAccount, curve: RdpCurve, charges: int
) -> None:
    """Write the composed curve, its conversion at the account's delta and the charge count."""
    spend.rdp = curve.to_json()
    spend.pure_epsilon = curve.pure
    spend.grid_version = GRID_VERSION
    spend.charges = charges
    spend.epsilon = curve.epsilon(budget.delta)
    spend.updated_at = utcnow()


def subtract_up(total: RdpCurve, part: RdpCurve) -> RdpCurve:
    """``total - part`` rounded up (never below the exact difference, never below 0; the
    rounding of ``total`` itself, an ulp of the larger sum, is covered by two of its ulps). An
    infinite pure part (a Gaussian release, e.g. a PrivDPR synthetic graph) stays infinite: a
    shard that held a curve without a pure-DP bound keeps none (an upper bound, never NaN)."""
    # the total was rounded to its own ulp, which may be far larger than the difference's:
    # add two of its ulps so that the difference stays an upper bound
    rdp = np.maximum(
        np.nextafter(total.rdp - part.rdp + 2.0 * np.spacing(np.abs(total.rdp)), np.inf), 0.0
    )
    if np.isinf(total.pure):
        pure = float(total.pure)
    else:
        margin = 2.0 * float(np.spacing(abs(total.pure)))
        pure = max(float(np.nextafter(total.pure - part.pure + margin, np.inf)), 0.0)
    margin = 2.0 * float(np.spacing(abs(total.sampler_tv)))
    tv = max(float(np.nextafter(total.sampler_tv - part.sampler_tv + margin, np.inf)), 0.0)
    return RdpCurve(rdp, pure, tv)


def release_values(
    release: StoredRelease, idempotency_key: str | None, principal_account_id: int, now: Any
) -> dict[str, Any]:
    """The ``releases`` row of a release, as the column values of a Core INSERT."""
    key = release.key
    return {
        "charge_id": release.charge_id,
        "charged_account_id": key.account_id,
        "node": key.node,
        "graph_version": key.graph_version,
        "mode": key.mode,
        "epsilon": float(key.epsilon),
        "mechanism_name": key.mechanism,
        "results": EncodedJson(results_json(release.results)),
        "mechanism": release.mechanism,
        "request_id": release.request_id,
        "principal_account_id": principal_account_id,
        "idempotency_key": idempotency_key,
        "created_at": now,
    }


def aware_utc(moment: Any) -> Any:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def shard_total(rows: list[LockedShard] | Any) -> RdpCurve:
    total = RdpCurve.zero()
    for row in rows:
        total = total + RdpCurve.from_json(row.rdp)
    return total


def add_to_shard(row: ExposureShard | LockedShard, curve: RdpCurve) -> None:
    total = RdpCurve.from_json(row.rdp) + curve
    row.rdp = total.to_json()
    row.pure_epsilon = total.pure
    row.charges = row.charges + 1
    row.updated_at = utcnow()


def remove_from_shard(row: ExposureShard, curve: RdpCurve) -> None:
    total = subtract_up(RdpCurve.from_json(row.rdp), curve)
    row.rdp = total.to_json()
    row.pure_epsilon = total.pure
    row.charges = max(0, row.charges - 1)
    row.updated_at = utcnow()


def graph_exhausted(cap: GraphCap, spent: RdpCurve) -> GraphBudgetExhausted:
    used = spent.epsilon(cap.delta)
    return GraphBudgetExhausted(
        f"the graph-wide exposure cap of {cap.cap_epsilon:.4g} (delta {cap.delta:.3g}) would be "
        f"exceeded: all accounts together have spent {used:.4g}. No new noisy answers can be "
        "released until an operator raises PPR_GRAPH_CAP_EPSILON; replays stay free",
        details={"graph_cap_epsilon": cap.cap_epsilon, "exposure_epsilon": used,
                 "delta": cap.delta},
    )  # fmt: skip
