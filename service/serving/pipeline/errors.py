"""The pipeline's own refusals."""

from __future__ import annotations

from service.errors import Conflict, InvalidParameter


class IdempotencyKeyReused(InvalidParameter):
    """The same Idempotency-Key was sent with a different query."""

    def __init__(self) -> None:
        super().__init__(
            "Idempotency-Key", "was already used for a different query; send a new key"
        )


class RequestInProgress(Conflict):
    code = "request_in_progress"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after
