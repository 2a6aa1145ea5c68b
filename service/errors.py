"""Errors with a stable code, shared by the CLI and the HTTP API.

Every error a person can act on derives from :class:`ServiceError`. Its ``code`` is part of
the public interface (clients switch on it); its message says what was wrong and what to do.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """An error with a stable machine-readable code and an HTTP status."""

    code: str = "internal_error"
    status: int = 500
    #: Exit status of a CLI command failing with this error: 2 when the person running it can
    #: fix it (bad input, configuration), 1 otherwise.
    exit_code: int | None = None
    #: Seconds after which a retry may succeed (sent as ``Retry-After``), where that is known.
    retry_after: int | None = None

    @property
    def cli_exit_code(self) -> int:
        if self.exit_code is not None:
            return self.exit_code
        return 2 if self.status < 500 else 1

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class InvalidParameter(ServiceError):
    """A parameter is outside its allowed range or has the wrong type."""

    code = "invalid_parameter"
    status = 422

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}", details={"parameter": name})
        self.parameter = name


class UnknownNode(ServiceError):
    """A node id that the loaded graph does not contain."""

    code = "unknown_node"
    status = 404

    def __init__(self, node: str) -> None:
        super().__init__(f"node {node!r} is not in the loaded graph", details={"node": node})
        self.node = node


class GraphLoadError(ServiceError):
    """An edge-list file could not be turned into a graph."""

    code = "graph_load_error"
    status = 422

    def __init__(self, path: str, message: str, *, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}", details={"path": path, "line": line})
        self.path = path
        self.line = line


class GraphTooLarge(ServiceError):
    """An evaluation-only mechanism refused a graph above its configured size."""

    code = "graph_too_large"
    status = 422


class Unauthorized(ServiceError):
    """Missing, malformed, unknown or revoked credentials."""

    code = "unauthorized"
    status = 401

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, details={"reason": reason})


class Forbidden(ServiceError):
    """The caller is known but may not do this."""

    code = "forbidden"
    status = 403


class NotFound(ServiceError):
    code = "not_found"
    status = 404


class Conflict(ServiceError):
    code = "conflict"
    status = 409
