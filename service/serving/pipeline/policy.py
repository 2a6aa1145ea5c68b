"""What admission enforces beyond each account's own cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.ledger.records import ReadAsk
from service.serving.schemas import Principal


@dataclass(frozen=True)
class AdmissionPolicy:
    """What admission enforces beyond each account's own cap (from the settings)."""

    service_quota_epsilon: float | None = None  # default quota of service accounts
    service_read_cap_epsilon: float | None = None  # default cap on a service account's reads
    graph_cap_epsilon: float | None = None
    exposure_delta: float | None = None  # None: the smallest account delta
    stale_after_seconds: float = 60.0  # an in-flight twin older than this is reconciled
    twin_wait_seconds: float = 10.0  # how long to wait for an in-flight twin's release
    heartbeat_seconds: float = 5.0  # how often charges still being answered beat

    def quota_for(self, principal: Principal, account_id: int) -> float | None:
        """The 24-hour quota to check when a service account charges another account."""
        if principal.type == "service" and account_id != principal.account_id:
            if principal.quota_epsilon is not None:
                return principal.quota_epsilon
            return self.service_quota_epsilon
        return None

    def read_for(
        self, principal: Principal, version: str, degree_release: str | None
    ) -> ReadAsk | None:
        """A service account's read of the release it is charged for, counted at admission
        in its read figure (with the version's degree release the answer is built on)."""
        if principal.type != "service":
            return None
        graph_release = None if degree_release is None else (version, degree_release)
        return ReadAsk(self.service_read_cap_epsilon, graph_release)

    @classmethod
    def from_settings(cls, settings: Any) -> AdmissionPolicy:
        return cls(
            service_quota_epsilon=settings.service_quota_epsilon,
            service_read_cap_epsilon=settings.service_read_cap_epsilon,
            graph_cap_epsilon=settings.graph_cap_epsilon,
            exposure_delta=settings.exposure_delta,
            stale_after_seconds=settings.reconcile_after_seconds,
            twin_wait_seconds=settings.twin_wait_seconds,
            heartbeat_seconds=settings.release_heartbeat_seconds,
        )
