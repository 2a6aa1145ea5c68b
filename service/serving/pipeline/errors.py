"""The pipeline's own refusals."""

from __future__ import annotations

from service.errors import Conflict
from service.ledger.records import IdempotencyKeyReused  # the ledger refuses a bound key too

__all__ = ["IdempotencyKeyReused", "RequestInProgress"]


class RequestInProgress(Conflict):
    code = "request_in_progress"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after
