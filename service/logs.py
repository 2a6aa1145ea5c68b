"""Log set-up of every process of the service: one JSON object per line on stderr, at the
level of ``PPR_LOG_LEVEL`` (Settings' ``log_level``).

The HTTP workers (:func:`service.api.app.create_app`), ``serve``'s supervisor and the
prefix-table builder (``python -m service.cache.prefix_table_builder``) all set up their logs
here. Never logged: noisy vectors, exact degrees, PPR values, API keys.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Protocol

from service.settings.http import HttpSettings


class LogSettings(Protocol):
    """What the log set-up reads of the settings."""

    @property
    def log_level(self) -> str: ...


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra`` fields are included, exceptions as text."""

    _skip = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._skip and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure_logging(settings: LogSettings | None = None) -> None:
    """JSON lines on stderr at ``settings.log_level``; None reads the settings from the
    environment (a process started with no settings of its own, e.g. the prefix-table
    builder, which inherits its worker's environment)."""
    level = (settings if settings is not None else HttpSettings()).log_level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn.access",):
        logging.getLogger(name).disabled = True  # replaced by the API's one line per request
