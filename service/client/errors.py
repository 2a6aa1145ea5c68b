"""Typed exceptions of the client: one class per stable error code of the service.

Every answer the service refuses arrives as ``{"error": {"code", "message", "details"}}``; the
client raises the class registered for its ``code`` (a code this client does not know, from a
newer server, raises the base :class:`PprError`, so ``except PprError`` always catches it).
A call that never got an answer, after every allowed attempt, raises :class:`PprConnectionError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ERROR_CLASSES",
    "AccountExists",
    "BadRequest",
    "BudgetExhausted",
    "ChargeSettled",
    "Conflict",
    "DuplicateHeader",
    "Forbidden",
    "GraphBudgetExhausted",
    "GraphLoadError",
    "GraphTooLarge",
    "HeadersTooLarge",
    "InternalError",
    "InvalidParameter",
    "InvalidResponse",
    "LedgerGridMismatch",
    "LedgerNotMigrated",
    "LedgerUnavailable",
    "MalformedJson",
    "MethodNotAllowed",
    "ModeNotAllowed",
    "NoEmbeddingRelease",
    "NoRelease",
    "NodeNotInRelease",
    "NotAcceptable",
    "NotConverged",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "PprClientError",
    "PprConnectionError",
    "PprError",
    "RateLimited",
    "ReadCapExhausted",
    "RequestInProgress",
    "ServiceQuotaExhausted",
    "Unauthorized",
    "UnknownAccount",
    "UnknownApiKey",
    "UnknownCharge",
    "UnknownNode",
    "UnsupportedMediaType",
    "error_class",
]


class PprClientError(Exception):
    """Anything the client raises for a call that did not succeed."""


class PprConnectionError(PprClientError):
    """No answer from the service after ``attempts`` tries (connection refused or dropped, a
    timeout). A charged call may have been charged: call again with the same
    ``idempotency_key`` and the service replays the answer instead of charging twice."""

    def __init__(self, message: str, *, attempts: int, idempotency_key: str | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.idempotency_key = idempotency_key


class PprError(PprClientError):
    """The service answered with an error: its HTTP ``status``, stable ``code``, ``message``,
    ``details``, the ``request_id`` to quote to an operator, and ``retry_after`` (seconds)
    where the service said when to retry."""

    #: The code this class stands for (the base class: any code this client does not know).
    code: str = "error"
    #: The status the service answers this code with (used for batch item errors).
    default_status: ClassVar[int] = 500

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = self.default_status if status is None else status
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = dict(details or {})
        self.request_id = request_id
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f"; request id {self.request_id}" if self.request_id else ""
        return f"{self.code} ({self.status}): {self.message}{where}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"message={self.message!r}, request_id={self.request_id!r})"
        )


#: code -> class, filled by the subclasses below.
ERROR_CLASSES: dict[str, type[PprError]] = {}


def _register(cls: type[PprError]) -> type[PprError]:
    ERROR_CLASSES[cls.code] = cls
    return cls


def error_class(code: str) -> type[PprError]:
    """The exception class of ``code``; the base class for a code this client does not know."""
    return ERROR_CLASSES.get(code, PprError)


# -- the request was wrong (4xx) -----------------------------------------------------------


@_register
class BadRequest(PprError):
    code = "bad_request"
    default_status = 400


@_register
class MalformedJson(BadRequest):
    code = "malformed_json"


@_register
class DuplicateHeader(BadRequest):
    """A header that counts once (Authorization, Idempotency-Key) was sent several times."""

    code = "duplicate_header"


@_register
class InvalidParameter(PprError):
    """A parameter (named in ``parameter``) is out of range, malformed, or an Idempotency-Key
    was reused for a different query."""

    code = "invalid_parameter"
    default_status = 422

    @property
    def parameter(self) -> str | None:
        name = self.details.get("parameter")
        return name if isinstance(name, str) else None


@_register
class Unauthorized(PprError):
    """Missing, malformed, unknown or revoked API key."""

    code = "unauthorized"
    default_status = 401


@_register
class Forbidden(PprError):
    """The caller is known but may not do this (another user's seed, an admin querying...)."""

    code = "forbidden"
    default_status = 403


@_register
class ModeNotAllowed(Forbidden):
    """A service account queried a mode it has no scope for."""

    code = "mode_not_allowed"


@_register
class BudgetExhausted(PprError):
    """The query would take the charged account's spend past its cap. Nothing was charged."""

    code = "budget_exhausted"
    default_status = 403

    @property
    def remaining_epsilon(self) -> float | None:
        budget = self.details.get("budget")
        value = budget.get("remaining_epsilon") if isinstance(budget, dict) else None
        return float(value) if isinstance(value, int | float) else None


@_register
class GraphBudgetExhausted(PprError):
    """The graph-wide exposure cap would be exceeded. Nothing was charged."""

    code = "graph_budget_exhausted"
    default_status = 403


@_register
class ReadCapExhausted(PprError):
    """A service account's read figure (what its answers reveal, composed) would pass its read
    cap. Nothing was sent; a fresh query's charge was refunded before any noise was drawn."""

    code = "read_cap_exhausted"
    default_status = 403


@_register
class NotFound(PprError):
    code = "not_found"
    default_status = 404


@_register
class UnknownNode(NotFound):
    """The node id is not in the loaded graph."""

    code = "unknown_node"

    @property
    def node(self) -> str | None:
        node = self.details.get("node")
        return node if isinstance(node, str) else None


@_register
class UnknownAccount(NotFound):
    code = "unknown_account"


@_register
class UnknownApiKey(NotFound):
    code = "unknown_api_key"


@_register
class UnknownCharge(NotFound):
    code = "unknown_charge"


@_register
class NoRelease(NotFound):
    """No stored release of the named query that the caller may replay (the free embedding)."""

    code = "no_release"


@_register
class MethodNotAllowed(PprError):
    code = "method_not_allowed"
    default_status = 405


@_register
class NotAcceptable(PprError):
    code = "not_acceptable"
    default_status = 406


@_register
class Conflict(PprError):
    code = "conflict"
    default_status = 409


@_register
class AccountExists(Conflict):
    code = "account_exists"


@_register
class RequestInProgress(Conflict):
    """A request with the same Idempotency-Key (or an identical query) is still being answered;
    retried by the client after ``retry_after``."""

    code = "request_in_progress"


@_register
class PayloadTooLarge(PprError):
    code = "payload_too_large"
    default_status = 413


@_register
class UnsupportedMediaType(PprError):
    code = "unsupported_media_type"
    default_status = 415


@_register
class GraphLoadError(PprError):
    """A graph reload failed; the old graph keeps serving. ``details`` name file and line."""

    code = "graph_load_error"
    default_status = 422


@_register
class GraphTooLarge(PprError):
    code = "graph_too_large"
    default_status = 422


@_register
class RateLimited(PprError):
    """The account's request rate is over its limit; ``retry_after`` says when to retry."""

    code = "rate_limited"
    default_status = 429


@_register
class ServiceQuotaExhausted(PprError):
    """A service account charged its 24-hour quota of epsilon to other accounts;
    ``retry_after`` says when enough of it has rolled out of the window."""

    code = "service_quota_exhausted"
    default_status = 429


@_register
class NoEmbeddingRelease(PprError):
    """No all-node embedding release is served for the current graph version (similar nodes)."""

    code = "no_embedding_release"
    default_status = 404


@_register
class NodeNotInRelease(PprError):
    """The node is in the graph but the served embedding release does not cover it."""

    code = "node_not_in_release"
    default_status = 404


@_register
class SynthesisBusy(PprError):
    """Every synthesis slot of the worker that took the call is running a job (admins only)."""

    code = "synthesis_busy"
    default_status = 429


@_register
class SynthesisNotDone(Conflict):
    """The synthesis job has no file yet: it is still running, or it failed (admins only)."""

    code = "synthesis_not_done"


@_register
class SynthesisAbandoned(PprError):
    """The synthesis run's release was settled under it (refunded); nothing was released."""

    code = "synthesis_abandoned"
    default_status = 503


@_register
class UnknownSynthesisJob(PprError):
    """No synthesis job has this id (admins only)."""

    code = "unknown_synthesis_job"
    default_status = 404


@_register
class NotASyntheticRelease(PprError):
    """The graph file is not a synthetic release the ledger knows (sandbox only)."""

    code = "not_a_synthetic_release"
    default_status = 422


@_register
class HeadersTooLarge(PprError):
    code = "headers_too_large"
    default_status = 431


# -- the service could not answer (5xx) ----------------------------------------------------


@_register
class InternalError(PprError):
    """An unexpected failure; quote ``request_id`` to the operator."""

    code = "internal_error"
    default_status = 500


@_register
class NotConverged(PprError):
    code = "not_converged"
    default_status = 500


@_register
class Overloaded(PprError):
    """The engine's queue is full (retried by the client after ``retry_after``)."""

    code = "overloaded"
    default_status = 503


@_register
class LedgerUnavailable(PprError):
    """The budget ledger database does not answer; nothing was charged or released."""

    code = "ledger_unavailable"
    default_status = 503


@_register
class LedgerNotMigrated(PprError):
    code = "ledger_not_migrated"
    default_status = 503


@_register
class LedgerGridMismatch(LedgerNotMigrated):
    code = "ledger_grid_mismatch"


@_register
class ChargeSettled(PprError):
    """The charge behind this request was refunded; its answer is never released."""

    code = "charge_settled"
    default_status = 503


@_register
class InvalidResponse(PprError):
    """An answer that is not the service's (a proxy's error page, or a body this client cannot
    read)."""

    code = "invalid_response"
    default_status = 502
