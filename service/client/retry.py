"""When a call is tried again, and after how long: bounded attempts, exponential backoff with
jitter, and the service's own ``Retry-After``.

What is retried (every retry of a call carries the same Idempotency-Key, so the service charges
a query at most once however many attempts reach it):

* a connection that could not be made (refused, connect timeout, no free pooled connection):
  the request never left, so any call;
* a request sent without an answer (read timeout, connection dropped): only calls that are
  safe to send again, which is every call but account and key creation;
* ``503`` (``overloaded``, ``ledger_unavailable``: nothing was charged or committed) and a
  proxy's ``502``/``504`` on calls safe to send again;
* ``409 request_in_progress`` (the first attempt of this very call is still being answered);
* ``429 rate_limited`` only with ``retry_rate_limited=True``. ``service_quota_exhausted`` is
  never retried: its wait is counted in hours.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from service.client.errors import PprError

__all__ = ["NO_RETRY", "RetryPolicy", "parse_retry_after"]

#: The request cannot have reached the service.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: The request may have reached the service, which may have acted on it.
_MAYBE_SENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
#: Codes of a 503 that say the service did nothing (safe to retry any call).
_NOTHING_DONE = frozenset({"overloaded", "ledger_unavailable"})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a call is tried.

    ``attempts`` counts every try of one call, the first included (1: never retry). The n-th
    retry waits ``Retry-After`` plus up to ``backoff`` seconds of jitter when the service named
    a wait, else a random time in ``[c/2, c]`` with ``c = min(max_backoff, backoff * 2**(n-1))``.
    A ``Retry-After`` above ``max_retry_after`` is not waited for: the error is raised with its
    ``retry_after`` for the caller to schedule.
    """

    attempts: int = 4
    backoff: float = 0.25
    max_backoff: float = 8.0
    max_retry_after: float = 30.0
    retry_rate_limited: bool = False

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.max_retry_after < 0:
            raise ValueError("backoff, max_backoff and max_retry_after must not be negative")

    def backoff_seconds(self, retry: int) -> float:
        """Wait before retry number ``retry`` (1, 2, ...) when the service named none."""
        ceiling = min(self.max_backoff, self.backoff * 2 ** (retry - 1))
        return random.uniform(ceiling / 2, ceiling)

    def after_transport_error(
        self, error: httpx.TransportError, attempt: int, *, resend_safe: bool
    ) -> float | None:
        """Seconds to wait before trying again after ``error`` on try ``attempt``, or None."""
        retryable = isinstance(error, _NOT_SENT) or (resend_safe and isinstance(error, _MAYBE_SENT))
        if not retryable or attempt >= self.attempts:
            return None
        return self.backoff_seconds(attempt)

    def after_error(self, error: PprError, attempt: int, *, resend_safe: bool) -> float | None:
        """Seconds to wait before trying again after the service answered ``error``, or None."""
        if attempt >= self.attempts or not self._retryable(error, resend_safe):
            return None
        if error.retry_after is None:
            return self.backoff_seconds(attempt)
        if error.retry_after > self.max_retry_after:
            return None
        return max(0.0, error.retry_after) + random.uniform(0, self.backoff)

    def _retryable(self, error: PprError, resend_safe: bool) -> bool:
        if error.status == 503:
            return resend_safe or error.code in _NOTHING_DONE
        if error.status in (502, 504):
            return resend_safe
        if error.code == "request_in_progress":
            return True
        return error.code == "rate_limited" and self.retry_rate_limited


#: Every call tried once.
NO_RETRY = RetryPolicy(attempts=1)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
