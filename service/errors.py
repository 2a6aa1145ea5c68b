"""Errors with a stable code, shared by the CLI and the HTTP API.

Every error a person can act on derives from :class:`ServiceError`. Its ``code`` is part of
the public interface (clients switch on it); its message says what was wrong and what to do.
"""

from __future__ import annotations

from typing import Any

#: Most characters of a caller's value (a node id, a path, a parameter) an error quotes; a
#: longer value is cut to this many, followed by its length.
ECHO_MAX = 64
#: Most characters of an error's message, and of any text in its details, whatever built it
#: (a safety net behind :data:`ECHO_MAX`: no error body grows with what the caller sent).
ERROR_TEXT_MAX = 1024


def echoed(value: str) -> str:
    """A caller's value as an error's details carry it: itself if at most :data:`ECHO_MAX`
    characters, else its first :data:`ECHO_MAX` characters, ``...`` and its length."""
    if len(value) <= ECHO_MAX:
        return value
    return f"{value[:ECHO_MAX]}... ({len(value)} characters)"


def shown(value: object) -> str:
    """A caller's value as an error message quotes it (``repr``), cut as :func:`echoed`
    cuts it: ``'abc'``, or ``'first 64 characters'... (900000 characters)``."""
    if isinstance(value, str) and len(value) > ECHO_MAX:
        return f"{value[:ECHO_MAX]!r}... ({len(value)} characters)"
    text = repr(value)
    if len(text) > ECHO_MAX:
        return f"{text[:ECHO_MAX]}... ({len(text)} characters)"
    return text


def bounded(value: Any, most: int = ERROR_TEXT_MAX) -> Any:
    """``value`` (an error body or a part of it) with every text longer than ``most``
    characters cut as :func:`echoed` cuts a value, and long lists shortened likewise."""
    if isinstance(value, str):
        return value if len(value) <= most else f"{value[:most]}... ({len(value)} characters)"
    if isinstance(value, dict):
        return {bounded(k, ECHO_MAX): bounded(v, most) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [bounded(v, most) for v in value[:ECHO_MAX]]
        if len(value) > ECHO_MAX:
            items.append(f"... ({len(value)} items)")
        return items
    return value


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
        """The error's JSON body, its texts bounded (:func:`bounded`)."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return dict(bounded(body))


class InvalidParameter(ServiceError):
    """A parameter is outside its allowed range or has the wrong type."""

    code = "invalid_parameter"
    status = 422

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{echoed(name)}: {message}", details={"parameter": echoed(name)})
        self.parameter = name


class UnknownNode(ServiceError):
    """A node id that the loaded graph does not contain."""

    code = "unknown_node"
    status = 404

    def __init__(self, node: str) -> None:
        super().__init__(
            f"node {shown(node)} is not in the loaded graph", details={"node": echoed(node)}
        )
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
