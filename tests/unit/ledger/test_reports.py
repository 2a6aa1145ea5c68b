"""Reports.recording_refusal (service/ledger/reports.py), the one way an admission records its
refusal: with a fake in place of the refusals table, no database."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from service.ledger.records import (
    GraphBudgetExhausted,
    IdempotencyKeyReused,
    ServiceQuotaExhausted,
)
from service.ledger.reports import RefusalRow, Reports


class _KeptRefusals(Reports):
    """Reports whose refusals table is a list."""

    def __init__(self) -> None:  # no database: only record_refusals is used
        self.kept: list[RefusalRow] = []

    def record_refusals(self, refusals: Sequence[RefusalRow]) -> None:
        self.kept.extend(refusals)


def test_a_refusal_is_kept_with_the_query_it_refused_and_raised_on() -> None:
    reports = _KeptRefusals()
    quota = ServiceQuotaExhausted("over", retry_after=5, details={"query_epsilon": 0.3})
    with pytest.raises(ServiceQuotaExhausted), reports.recording_refusal(7, 9, "edge", 0.1):
        raise quota
    assert reports.kept == [RefusalRow("service_quota_exhausted", 7, 9, "edge", 0.1)]


def test_without_an_epsilon_the_refusal_names_it() -> None:
    reports = _KeptRefusals()
    refusal = GraphBudgetExhausted("cap", details={"query_epsilon": 0.25})
    with pytest.raises(GraphBudgetExhausted), reports.recording_refusal(1, 1, "personalized"):
        raise refusal
    assert reports.kept == [RefusalRow(refusal.code, 1, 1, "personalized", 0.25)]


def test_an_admission_that_is_not_refused_keeps_nothing() -> None:
    reports = _KeptRefusals()
    with reports.recording_refusal(1, 1, "edge", 0.1):
        pass
    with pytest.raises(IdempotencyKeyReused), reports.recording_refusal(1, 1, "edge", 0.1):
        raise IdempotencyKeyReused()  # bad input, not a refusal
    with pytest.raises(ValueError), reports.recording_refusal(1, 1, "edge", 0.1):
        raise ValueError("not a refusal")
    assert reports.kept == []
