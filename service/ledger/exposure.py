"""Graph-wide exposure: what all accounts together can have learned about any one edge.

Every live charge of every account (and every graph-wide release, such as a noisy degree
vector) is composed into one RDP curve and converted at the exposure delta. This is an upper
bound: in the personalized model a seed's own edges are not protected in its own answers, so
composing everything charges each edge for releases that did not protect it at all.

The series composes in time order, per hour, so an admin sees how the bound grew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from service.ledger.tables import (
    GRAPH_RELEASE_CHARGES,
    Budget,
    Charge,
    ExposureShard,
    GraphRelease,
    iso,
)
from service.privacy.accountant import RdpCurve, curve_key


@dataclass
class ExposureReport:
    epsilon: float
    delta: float
    charges: int
    graph_releases: int
    cap_epsilon: float | None
    by_mode: dict[str, dict[str, float | int]]
    series: list[dict[str, Any]] = field(default_factory=list)
    #: The same bound from the exposure shards that admission reads (never below ``epsilon``
    #: but for rounding; ``ledger verify`` checks they agree).
    shards_epsilon: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "charges": self.charges,
            "graph_releases": self.graph_releases,
            "cap_epsilon": self.cap_epsilon,
            "by_mode": self.by_mode,
            "series": self.series,
            "shards_epsilon": self.shards_epsilon,
        }


def hour_of(engine: Engine, column: Any) -> Any:
    if engine.dialect.name == "sqlite":
        return func.strftime("%Y-%m-%dT%H:00:00", column)
    return func.date_trunc("hour", column)


def as_time(value: Any) -> datetime:
    moment: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def default_delta(engine: Engine) -> float:
    """The smallest delta of any account (1e-6 on an empty ledger)."""
    with Session(engine) as session:
        smallest = session.scalar(select(func.min(Budget.delta)))
    return float(smallest) if smallest is not None else 1e-6


def exposure_report(
    engine: Engine, *, delta: float | None = None, cap_epsilon: float | None = None
) -> ExposureReport:
    dlt = default_delta(engine) if delta is None else float(delta)
    hour = hour_of(engine, Charge.created_at)
    graph_hour = hour_of(engine, GraphRelease.created_at)
    parsed: dict[str, RdpCurve] = {}

    def curve(rdp: dict[str, Any]) -> RdpCurve:
        key = curve_key(rdp)
        if key not in parsed:
            parsed[key] = RdpCurve.from_json(rdp)
        return parsed[key]

    with Session(engine) as session:
        groups: Any = session.execute(
            select(hour, Charge.mode, Charge.rdp, func.count(Charge.id))
            # an account's degree- or synthetic-release charge is the graph release, counted
            # below once
            .where(Charge.state != "refunded", Charge.mechanism.not_in(GRAPH_RELEASE_CHARGES))
            .group_by(hour, Charge.mode, Charge.rdp)
        ).all()
        graph_groups: Any = session.execute(
            select(graph_hour, GraphRelease.rdp, func.count(GraphRelease.id))
            .where(GraphRelease.state != "refunded")
            .group_by(graph_hour, GraphRelease.rdp)
        ).all()
        shards = list(session.scalars(select(ExposureShard)))
    per_hour: dict[datetime, tuple[RdpCurve, int]] = {}
    by_mode: dict[str, tuple[RdpCurve, int]] = {}
    total, count, graph_count = RdpCurve.zero(), 0, 0
    for at, mode, rdp, n in groups:
        c = curve(rdp) * int(n)
        moment = as_time(at)
        prev, prev_n = per_hour.get(moment, (RdpCurve.zero(), 0))
        per_hour[moment] = (prev + c, prev_n + int(n))
        mode_curve, mode_n = by_mode.get(mode, (RdpCurve.zero(), 0))
        by_mode[mode] = (mode_curve + c, mode_n + int(n))
        total, count = total + c, count + int(n)
    for at, rdp, n in graph_groups:
        c = curve(rdp) * int(n)
        moment = as_time(at)
        prev, prev_n = per_hour.get(moment, (RdpCurve.zero(), 0))
        per_hour[moment] = (prev + c, prev_n)
        total, graph_count = total + c, graph_count + int(n)
    series: list[dict[str, Any]] = []
    running, running_n = RdpCurve.zero(), 0
    for moment in sorted(per_hour):
        c, n = per_hour[moment]
        running, running_n = running + c, running_n + n
        series.append({"at": iso(moment), "epsilon": running.epsilon(dlt), "charges": running_n})
    shard_total = RdpCurve.zero()
    for row in shards:
        shard_total = shard_total + RdpCurve.from_json(row.rdp)
    return ExposureReport(
        epsilon=total.epsilon(dlt),
        delta=dlt,
        charges=count,
        graph_releases=graph_count,
        cap_epsilon=cap_epsilon,
        by_mode={
            mode: {"epsilon": c.epsilon(dlt), "charges": n}
            for mode, (c, n) in sorted(by_mode.items())
        },
        series=series,
        shards_epsilon=shard_total.epsilon(dlt),
    )
