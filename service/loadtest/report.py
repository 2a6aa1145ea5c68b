"""Results of a load phase and the table a run prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class PhaseResult:
    phase: str
    driver: str
    concurrency: int
    seconds: float
    requests: int
    errors: int  # non-2xx answers + socket errors + timeouts
    p50_ms: float
    p90_ms: float
    p99_ms: float
    items_per_request: int = 1
    item_errors: int = 0  # per-item errors inside 200 answers (batch)
    statuses: dict[str, int] = field(default_factory=dict)
    #: Answers that were not 2xx, by "STATUS error_code" (the envelope's code; "-" if none).
    error_codes: dict[str, int] = field(default_factory=dict)
    socket_errors: int = 0  # connections refused or reset, and timeouts
    #: CPU milliseconds per request by group over the phase, and ``machine_busy``
    #: (service/loadtest/cpu_share.py); None where /proc cannot be read.
    cpu_ms_per_request: dict[str, float] | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def items_per_second(self) -> float:
        return self.rps * self.items_per_request

    def to_dict(self, reference_rps: float | None = None) -> dict[str, Any]:
        out = asdict(self)
        out["rps"] = self.rps
        out["items_per_second"] = self.items_per_second
        out["fraction_of_healthz"] = (
            self.rps / reference_rps if reference_rps else None
        )  # the ratio the targets are stated in
        return out


def percentiles_ms(latencies_s: list[float]) -> tuple[float, float, float]:
    if not latencies_s:
        nan = float("nan")
        return nan, nan, nan
    p50, p90, p99 = np.percentile(np.asarray(latencies_s) * 1000.0, [50, 90, 99])
    return float(p50), float(p90), float(p99)


def reference_rps(results: list[PhaseResult]) -> float | None:
    for result in results:
        if result.phase == "healthz":
            return result.rps
    return None


#: Statuses that mean the service refused the key or its account, not the load.
REFUSED = ("401", "403", "429")


def status_breakdown(result: PhaseResult) -> str:
    """``fresh: 200 x 316, 403 x 1592 (403 budget_exhausted 1592)``."""
    parts = [f"{code} x {n:,}" for code, n in sorted(result.statuses.items())]
    if result.socket_errors:
        parts.append(f"no answer x {result.socket_errors:,}")
    line = f"{result.phase}: {', '.join(parts) or 'no requests'}"
    if result.error_codes:
        codes = ", ".join(f"{code} {n:,}" for code, n in sorted(result.error_codes.items()))
        line += f" ({codes})"
    if result.item_errors:
        line += f"; {result.item_errors:,} batch item(s) answered with an error"
    return line


def refusals(results: list[PhaseResult], *, personalized: bool = False) -> list[str]:
    """One line per phase in which the service refused the key (401/403/429), naming the code.
    ``personalized``: the answers were charged to the seed users' accounts, so a refused budget
    is theirs."""
    lines = []
    for result in results:
        refused = {code: n for code, n in result.error_codes.items() if code.startswith(REFUSED)}
        if not refused:
            refused = {code: n for code, n in result.statuses.items() if code in REFUSED}
        if refused:
            what = ", ".join(f"{code} on {n:,} requests" for code, n in sorted(refused.items()))
            advice = (
                "In personalized mode each answer is charged to its seed user's account "
                "(cap PPR_DEFAULT_CAP_EPSILON when the run creates it), and to the service "
                "account's quota: draw from more seeds (--seeds) or give them larger caps"
                if personalized
                else "The load runs under one service account: give it a cap no run reaches "
                "(accounts create --type service --cap 1000), or leave --key out to have one "
                "made"
            )
            lines.append(f"the key was refused in the {result.phase} phase: {what}. {advice}")
    return lines


def has_errors(results: list[PhaseResult]) -> bool:
    return any(r.errors or r.item_errors for r in results)


def table(results: list[PhaseResult]) -> str:
    ref = reference_rps(results)
    head = (
        "| phase | driver | conns | requests | req/s | % of /healthz | seeds/s (batch) | p50 ms "
        "| p90 ms | p99 ms | errors | item errors |"
    )
    lines = [head, "| " + " | ".join(["---"] * 12) + " |"]
    for r in results:
        share = f"{100 * r.rps / ref:.1f}%" if ref else "-"
        items = f"{r.items_per_second:,.0f}" if r.items_per_request > 1 else "-"
        lines.append(
            f"| {r.phase} | {r.driver} | {r.concurrency} | {r.requests:,} | {r.rps:,.1f} | "
            f"{share} | {items} | {r.p50_ms:.1f} | {r.p90_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.errors} | {r.item_errors} |"
        )
    return "\n".join(lines)
