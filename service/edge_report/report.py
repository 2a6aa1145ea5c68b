"""One edge's per-instance exposure composed over the noisy-diffusion releases in the ledger.

Reads the live (not refunded) charges of the noisy diffusion on the graph version of the loaded
file, computes each one's per-instance curve for the edge (:mod:`service.privacy.per_edge`) and
composes them per mode, per charged account and graph-wide through the accountant, next to the
curves the ledger charged for the same releases. Nothing is written to the ledger or logged.

Releases the per-instance analysis does not cover are counted, not composed: other mechanisms,
other graph versions, and personalized releases to an endpoint of the edge (the seed's own
edge is public to that user and not protected by that release).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.edge_report.shifts import has_edge, prefix_shifts, toggled_graph
from service.errors import InvalidParameter, NotFound
from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.tables import Budget, Charge, GraphVersion
from service.mechanisms.registry import RankingMechanism
from service.privacy.accountant import RdpCurve
from service.privacy.modes import Mode
from service.privacy.per_edge import PrefixShifts, ReleaseParameters, per_instance_curve


@dataclass
class _Sum:
    per_edge: RdpCurve = field(default_factory=RdpCurve.zero)
    worst: RdpCurve = field(default_factory=RdpCurve.zero)
    releases: int = 0

    def add(self, per_edge: RdpCurve, worst: RdpCurve) -> None:
        self.per_edge = self.per_edge + per_edge
        self.worst = self.worst + worst
        self.releases += 1

    def row(self, delta: float) -> dict[str, Any]:
        per_edge, worst = self.per_edge.epsilon(delta), self.worst.epsilon(delta)
        return {
            "releases": self.releases,
            "per_edge_epsilon": per_edge,
            "worst_case_epsilon": worst,
            "ratio": per_edge / worst if worst > 0 else None,
        }


@dataclass(frozen=True)
class _Release:
    account: int
    seed: int
    params: ReleaseParameters
    worst: RdpCurve


def _parameters(mode: str, params: dict[str, Any]) -> ReleaseParameters:
    return ReleaseParameters(
        mode=Mode(mode),
        beta=float(params["beta"]),
        steps=int(params["steps"]),
        eta=float(params["eta"]),
        noise_scale=float(params["noise_scale"]),
        noisy_steps=int(params["noisy_steps"]),
    )


def _worst(stored: dict[str, Any]) -> RdpCurve:
    return RdpCurve.from_json(stored)


def edge_report(
    ledger: Ledger,
    graph: Graph,
    u: str,
    v: str,
    *,
    account: int | None = None,
    delta: float | None = None,
) -> dict[str, Any]:
    """The report for the edge between external ids ``u`` and ``v`` (a dict, see the CLI)."""
    iu, iv = graph.index_of(u), graph.index_of(v)
    if iu == iv:
        raise InvalidParameter("--edge", f"an edge joins two distinct nodes, got {u!r} twice")
    counts: dict[str, int] = defaultdict(int)
    releases: list[_Release] = []
    with Session(ledger.engine) as session:
        versions = {row.public_id: row.fingerprint for row in session.scalars(select(GraphVersion))}
        stmt = select(Charge).where(Charge.state != "refunded").order_by(Charge.id)
        if account is not None:
            stmt = stmt.where(Charge.charged_account_id == account)
            budget = session.get(Budget, account)
            if budget is None:
                raise NotFound(f"account {account} has no budget in this ledger")
            account_delta = budget.delta
        for charge in session.scalars(stmt):
            counts["charges"] += 1
            if charge.mechanism != RankingMechanism.NOISY_DIFFUSION:
                counts["other_mechanisms"] += 1
                continue
            if versions.get(charge.graph_version, charge.graph_version) != graph.fingerprint:
                counts["other_graph_versions"] += 1
                continue
            seed = graph.index_of(charge.seed)
            if charge.mode == Mode.PERSONALIZED.value and seed in (iu, iv):
                counts["seed_own_edge"] += 1
                continue
            params = _parameters(charge.mode, charge.params)
            releases.append(_Release(charge.charged_account_id, seed, params, _worst(charge.rdp)))
    if counts["charges"] == 0:
        where = "for this account" if account is not None else "in this ledger"
        raise NotFound(f"there are no releases {where}: nothing to report")
    if delta is None:
        delta = account_delta if account is not None else ledger.reports.smallest_delta()
    curves = _per_instance(graph, iu, iv, releases)
    by_mode: dict[str, _Sum] = defaultdict(_Sum)
    by_account: dict[int, _Sum] = defaultdict(_Sum)
    total = _Sum()
    for release, curve in zip(releases, curves, strict=True):
        by_mode[release.params.mode.value].add(curve, release.worst)
        by_account[release.account].add(curve, release.worst)
        total.add(curve, release.worst)
    report: dict[str, Any] = {
        "edge": [u, v],
        "edge_in_graph": has_edge(graph, iu, iv),
        "delta": delta,
        "scope": "account" if account is not None else "graph-wide",
        "total": total.row(delta),
        "by_mode": {mode: s.row(delta) for mode, s in sorted(by_mode.items())},
        "not_covered": {
            "other_mechanisms": counts["other_mechanisms"],
            "other_graph_versions": counts["other_graph_versions"],
            "seed_own_edge": counts["seed_own_edge"],
        },
    }
    if account is not None:
        report["account"] = account
    return report


def _per_instance(graph: Graph, iu: int, iv: int, releases: list[_Release]) -> list[RdpCurve]:
    """Each release's per-instance curve; the prefix quantities are computed once per seed
    and (mode, beta, eta, m), the curve once per distinct parameter set."""
    groups: dict[tuple[Mode, float, float, int], set[int]] = defaultdict(set)
    for r in releases:
        p = r.params
        groups[(p.mode, p.beta, p.eta, p.noise_free_steps)].add(r.seed)
    toggled = toggled_graph(graph, iu, iv) if releases else graph
    shifts: dict[tuple[Mode, float, float, int, int], PrefixShifts] = {}
    for (mode, beta, eta, m), seeds in groups.items():
        ordered = sorted(seeds)
        found = prefix_shifts(
            graph, toggled, ordered, mode=mode, beta=beta, eta=eta, noise_free_steps=m
        )
        for seed, s in zip(ordered, found, strict=True):
            shifts[(mode, beta, eta, m, seed)] = s
    cache: dict[tuple[ReleaseParameters, int], RdpCurve] = {}
    out = []
    for r in releases:
        p = r.params
        key = (p, r.seed)
        if key not in cache:
            cache[key] = per_instance_curve(
                shifts[(p.mode, p.beta, p.eta, p.noise_free_steps, r.seed)], p
            )
        out.append(cache[key])
    return out
