"""The HTTP/1.1 connection: uvicorn's httptools protocol with deadlines, a connection bound and
JSON refusals.

uvicorn (as of 0.54) has an idle keep-alive timeout and nothing else: a client that sends one
header byte a second, or a body one byte a second, holds its connection (and a file
descriptor) for as long as it likes, and a connection that never sends a byte is never closed.
What its parser refuses is answered ``400 Invalid HTTP request received.`` in plain text. This
subclass adds, per connection:

* ``PPR_HTTP_HEAD_TIMEOUT_SECONDS``: from the connection's opening (or a request's first byte
  on a kept-alive connection) to the end of the request head; then ``408 request_timeout``.
* ``PPR_HTTP_BODY_TIMEOUT_SECONDS``: from the end of the head to the end of the body; then
  ``408 request_timeout``. The application sees the client gone (``http.disconnect``) before
  it has read the body, so nothing is admitted or charged.
* ``PPR_HTTP_WRITE_TIMEOUT_SECONDS``: how long an answer may stay unsent because the client
  does not read it. uvicorn stops writing when the connection's send buffer passes its high
  water mark (flow control: ``pause_writing``) and goes on when the client has read enough
  (``resume_writing``); a connection paused for longer than this is aborted (its buffered
  answer dropped, its file descriptor freed), and the application sees the client gone.
* ``PPR_HTTP_MAX_CONNECTIONS``: a request that arrives while its worker holds more open
  connections than this gets ``503 overloaded`` (with ``Retry-After``) and its connection is
  closed, instead of the worker running out of file descriptors and failing to accept.
* ``PPR_HTTP_MAX_URL_BYTES``: a longer request target gets ``414 uri_too_long``;
  ``PPR_MAX_HEADER_BYTES``: larger headers get ``431 headers_too_large`` while they arrive
  (the application checks the same bound on what reaches it).
* anything else the parser refuses (a garbage request line, a raw 0xFF byte in the path, a
  control character in a header, a negative, huge or repeated ``Content-Length``, ...) gets
  ``400 malformed_request`` naming the parser's reason.

Every refusal is the JSON envelope ``{"error": {"code", "message"}}`` with
``connection: close``. The idle keep-alive timeout stays uvicorn's own
(``PPR_HTTP_KEEP_ALIVE_SECONDS`` is passed to it as ``timeout_keep_alive``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.config import Settings, get_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout_seconds: float
    body_timeout_seconds: float
    write_timeout_seconds: float
    max_connections: int
    max_url_bytes: int
    max_header_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            head_timeout_seconds=settings.http_head_timeout_seconds,
            body_timeout_seconds=settings.http_body_timeout_seconds,
            write_timeout_seconds=settings.http_write_timeout_seconds,
            max_connections=settings.http_max_connections,
            max_url_bytes=settings.http_max_url_bytes,
            max_header_bytes=settings.max_header_bytes,
        )


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str

    def body(self) -> bytes:
        error = {"code": self.code, "message": self.message}
        return json.dumps({"error": error}, separators=(",", ":")).encode()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the refusal is on the protocol."""


#: Seconds a client refused for the connection bound is told to wait.
BUSY_RETRY_AFTER_SECONDS = 1


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and bounds of the module docstring."""

    #: Set by :func:`configure` before the server starts; else read from the environment.
    limits: ClassVar[ConnectionLimits | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if GuardedHttpProtocol.limits is None:
            configure(get_settings())
        assert GuardedHttpProtocol.limits is not None
        self.bounds: ConnectionLimits = GuardedHttpProtocol.limits
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._refusal: Refusal | None = None
        self._header_bytes = 0

    # --- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():  # no route of ours upgrades; uvicorn's own path
                self.handle_websocket_upgrade()
        except httptools.HttpParserError as exc:
            refusal = self._refusal or Refusal(
                400,
                "malformed_request",
                f"the HTTP request is malformed ({_reason(exc)}); send a valid HTTP/1.1 "
                "request line, headers and Content-Length",
            )
            log.warning("refused at the HTTP parser: %s %s", refusal.status, refusal.code)
            self._send_and_close(refusal)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self.bounds.write_timeout_seconds, self._write_timed_out
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel(self._write_timer)
        self._write_timer = None

    # --- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.bounds.max_url_bytes:
            self._refuse(
                Refusal(
                    414,
                    "uri_too_long",
                    f"the request target is longer than {self.bounds.max_url_bytes} bytes "
                    "(PPR_HTTP_MAX_URL_BYTES)",
                )
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.bounds.max_header_bytes:
            self._refuse(
                Refusal(
                    431,
                    "headers_too_large",
                    f"the request headers are larger than {self.bounds.max_header_bytes} "
                    "bytes (PPR_MAX_HEADER_BYTES)",
                )
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel(self._head_timer)
        self._head_timer = None
        if _has_body(self.headers):
            self._body_timer = self.loop.call_later(
                self.bounds.body_timeout_seconds, self._body_timed_out
            )
        if len(self.connections) <= self.bounds.max_connections:
            super().on_headers_complete()
            return
        app, self.app = self.app, _busy_app(len(self.connections), self.bounds.max_connections)
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_message_complete(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = None
        super().on_message_complete()

    # --- deadlines ----------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.bounds.head_timeout_seconds, self._head_timed_out
            )

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = (
                False  # a pipelined head behind a running request: close after it
            )
            return
        self._send_and_close(
            Refusal(
                408,
                "request_timeout",
                "the request head did not arrive within "
                f"{self.bounds.head_timeout_seconds:g} s (PPR_HTTP_HEAD_TIMEOUT_SECONDS)",
            )
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if cycle.response_started:  # answered before its body arrived (413, 401, ...)
            cycle.keep_alive = False
            if cycle.response_complete:
                self.transport.close()
            return
        cycle.disconnected = True  # the application sees the client gone; nothing it sends goes out
        cycle.message_event.set()
        self._send_and_close(
            Refusal(
                408,
                "request_timeout",
                "the request body did not arrive within "
                f"{self.bounds.body_timeout_seconds:g} s (PPR_HTTP_BODY_TIMEOUT_SECONDS)",
            )
        )

    def _write_timed_out(self) -> None:
        """The client has not read its answer for ``write_timeout_seconds``: abort the
        connection (a close would wait for the buffer to drain, which may be never)."""
        self._write_timer = None
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True  # the application's next send is dropped
            cycle.message_event.set()
        log.warning(
            "closed a connection whose client did not read its answer for %g s "
            "(PPR_HTTP_WRITE_TIMEOUT_SECONDS)", self.bounds.write_timeout_seconds,
        )  # fmt: skip
        self.transport.abort()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._cancel(self._write_timer)
        self._head_timer = self._body_timer = self._write_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    # --- refusals -----------------------------------------------------------------------------

    def _refuse(self, refusal: Refusal) -> None:
        self._refusal = refusal
        raise _Refused(refusal.code)  # the parser stops; data_received answers

    def _send_and_close(self, refusal: Refusal) -> None:
        self._cancel_timers()
        body = refusal.body()
        content = [STATUS_LINE[refusal.status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:  # uvicorn's own path (not reached here)
        self._send_and_close(Refusal(400, "malformed_request", "the HTTP request is malformed"))


def configure(settings: Settings) -> None:
    """Take this process's connection limits from ``settings`` (before the server starts)."""
    GuardedHttpProtocol.limits = ConnectionLimits.from_settings(settings)


def _reason(exc: Exception) -> str:
    """The parser's reason, printable and short (it names a rule of HTTP, never input bytes)."""
    text = str(exc) or type(exc).__name__
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:120]


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding":
            return True
        if name == b"content-length" and value.strip() not in (b"0", b""):
            return True
    return False


def _busy_app(open_connections: int, limit: int) -> Any:
    """An ASGI app answering ``503 overloaded`` and closing the connection."""
    refusal = Refusal(
        503,
        "overloaded",
        f"this server process holds {open_connections} open connections, more than "
        f"PPR_HTTP_MAX_CONNECTIONS ({limit}); retry in a moment",
    )
    body = refusal.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"connection", b"close"),
        (b"retry-after", str(BUSY_RETRY_AFTER_SECONDS).encode("ascii")),
    ]

    async def busy(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return busy
