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
* the connection bound: ``PPR_HTTP_MAX_CONNECTIONS``, or fewer when the worker's open-file
  limit leaves room for fewer (:func:`connection_bound`). Connections are counted from the
  moment they are accepted, whether or not their request head has arrived. A connection
  accepted beyond the bound sheds the oldest connection of the worker that is still waiting
  for its request head (a client that opened it and sent nothing, or part of a head): that
  one is answered ``503 overloaded`` (with ``Retry-After``) and closed. When none is waiting
  (every connection is in a request, or idle between kept-alive requests), the new connection
  itself is answered ``503 overloaded`` as soon as its head arrives. So the worker never
  holds more descriptors than its file limit allows, and a new client always gets an HTTP
  answer: a worker out of descriptors cannot accept, and uvloop (libuv) then accepts and
  closes the waiting connections without a word. Both are logged (at most one line per
  ``LOG_EVERY_SECONDS``) and counted in ``ppr_http_connections_shed_total``.
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
import os
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.api.observability import CONNECTIONS_SHED
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
    reserved_files: int = 256

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            head_timeout_seconds=settings.http_head_timeout_seconds,
            body_timeout_seconds=settings.http_body_timeout_seconds,
            write_timeout_seconds=settings.http_write_timeout_seconds,
            max_connections=settings.http_max_connections,
            max_url_bytes=settings.http_max_url_bytes,
            max_header_bytes=settings.max_header_bytes,
            reserved_files=settings.http_reserved_files,
        )


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str
    retry_after: int | None = None

    def body(self) -> bytes:
        error = {"code": self.code, "message": self.message}
        return json.dumps({"error": error}, separators=(",", ":")).encode()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the refusal is on the protocol."""


#: Seconds a client refused for the connection bound is told to wait.
BUSY_RETRY_AFTER_SECONDS = 1
#: Shortest time between two log lines about shed or refused connections (a flood would
#: otherwise write one line per connection).
LOG_EVERY_SECONDS = 10.0


def open_files_now() -> int | None:
    """How many file descriptors this process holds (None where the system does not say)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(directory)) - 1)  # less the listing's own
        except OSError:
            continue
    return None


def connection_bound(limits: ConnectionLimits) -> tuple[int, str]:
    """The most connections one worker holds, and why: ``PPR_HTTP_MAX_CONNECTIONS``, or what
    its soft open-file limit leaves after the descriptors it holds now and
    ``PPR_HTTP_RESERVED_FILES`` for the ones it opens later (ledger and Redis pools, graph
    files, logs, metrics); a limit that leaves less than that reserve gives half of what it
    leaves. Never below 1."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections, "PPR_HTTP_MAX_CONNECTIONS"
    held = open_files_now() or 0
    free = soft - held
    by_files = free - limits.reserved_files
    if by_files < 1:
        by_files = free // 2
    by_files = max(1, by_files)
    if by_files < limits.max_connections:
        why = (
            f"the open-file limit ({soft}, {held} held, "
            f"PPR_HTTP_RESERVED_FILES={limits.reserved_files})"
        )
        return by_files, why
    return limits.max_connections, "PPR_HTTP_MAX_CONNECTIONS"


class _Bound:
    """One worker's connection bound and its connections waiting for a request head, oldest
    first (a dict keeps insertion order: adding and removing one is O(1))."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.pid = os.getpid()
        self.most, self.why = connection_bound(limits)
        self.waiting: dict[GuardedHttpProtocol, None] = {}
        self._unlogged = {"shed": 0, "refused": 0}
        self._logged_at = -LOG_EVERY_SECONDS
        if self.most < limits.max_connections:
            log.warning(
                "this worker holds at most %d connections, fewer than PPR_HTTP_MAX_CONNECTIONS "
                "(%d), because of %s; raise the open-file limit to hold more",
                self.most, limits.max_connections, self.why,
            )  # fmt: skip

    def note(self, action: str) -> None:
        """Count one shed (an older half-sent connection closed) or refused (a new one
        answered 503) connection; log the counts at most once per LOG_EVERY_SECONDS."""
        CONNECTIONS_SHED.labels(action).inc()
        self._unlogged[action] += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            log.warning(
                "at its connection bound (%d, %s): %d connections waiting for a request head "
                "shed, %d new connections refused with 503 overloaded since the last such line",
                self.most, self.why, self._unlogged["shed"], self._unlogged["refused"],
            )  # fmt: skip
            self._unlogged = {"shed": 0, "refused": 0}
            self._logged_at = now


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and bounds of the module docstring."""

    #: Set by :func:`configure` before the server starts; else read from the environment.
    limits: ClassVar[ConnectionLimits | None] = None
    #: This worker's bound and waiting connections (made at its first connection, after fork).
    _bound: ClassVar[_Bound | None] = None

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
        self._over_bound = False  # accepted beyond the bound with nothing to shed: 503

    # --- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a byte is closed too
        bound = self._worker_bound()
        bound.waiting[self] = None
        if len(self.connections) > bound.most and not self._shed_oldest(bound):
            self._over_bound = True  # answered 503 when its head arrives (or shed before)
            bound.note("refused")

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._stop_waiting()
        super().connection_lost(exc)

    @classmethod
    def _worker_bound(cls) -> _Bound:
        bound = cls._bound
        if bound is None or bound.pid != os.getpid():  # first connection of this worker
            assert cls.limits is not None
            bound = cls._bound = _Bound(cls.limits)
        return bound

    def _stop_waiting(self) -> None:
        bound = GuardedHttpProtocol._bound
        if bound is not None:
            bound.waiting.pop(self, None)

    def _shed_oldest(self, bound: _Bound) -> bool:
        """Close the oldest other connection still waiting for its request head, with
        ``503 overloaded``; False if there is none."""
        while bound.waiting:
            oldest = next(iter(bound.waiting))
            if oldest is self:
                if len(bound.waiting) == 1:
                    return False
                # self is the newest; move it behind the others and look again
                del bound.waiting[self]
                bound.waiting[self] = None
                continue
            del bound.waiting[oldest]
            if oldest.transport.is_closing() or oldest._busy():
                continue
            oldest._send_and_close(
                Refusal(
                    503,
                    "overloaded",
                    f"this server process is at its connection bound ({bound.most}, "
                    f"{bound.why}) and this connection had not sent a complete request head "
                    "while newer ones arrived; retry in a moment",
                    retry_after=BUSY_RETRY_AFTER_SECONDS,
                )
            )
            bound.note("shed")
            return True
        return False

    def _busy(self) -> bool:
        """A request of this connection is being answered (a head behind it is pipelined)."""
        return self.cycle is not None and not self.cycle.response_complete

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
        bound = GuardedHttpProtocol._bound
        if bound is not None and self not in bound.waiting and not self._busy():
            bound.waiting[self] = None  # a kept-alive connection's next head: waiting again

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
        self._stop_waiting()
        if _has_body(self.headers):
            self._body_timer = self.loop.call_later(
                self.bounds.body_timeout_seconds, self._body_timed_out
            )
        if not self._over_bound:
            super().on_headers_complete()
            return
        bound = self._worker_bound()
        app, self.app = self.app, _busy_app(len(self.connections), bound.most, bound.why)
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
        if refusal.retry_after is not None:
            content.append(b"retry-after: " + str(refusal.retry_after).encode("ascii") + b"\r\n")
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
    """Take this process's connection limits from ``settings`` (before the server starts);
    each worker computes its bound at its first connection."""
    GuardedHttpProtocol.limits = ConnectionLimits.from_settings(settings)
    GuardedHttpProtocol._bound = None


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


def _busy_app(open_connections: int, limit: int, why: str) -> Any:
    """An ASGI app answering ``503 overloaded`` and closing the connection."""
    refusal = Refusal(
        503,
        "overloaded",
        f"this server process holds {open_connections} open connections, more than its bound "
        f"of {limit} (set by {why}), and none of them is waiting for a request head; retry "
        "in a moment",
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
