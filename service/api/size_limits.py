"""Request size limits, before any route runs (an ASGI middleware).

* Headers: the total bytes of names and values above ``PPR_MAX_HEADER_BYTES`` get
  ``431 headers_too_large``.
* Body: a ``Content-Length`` above ``PPR_MAX_BODY_BYTES`` gets ``413 payload_too_large`` before
  the body is read; a body without a length (chunked) is counted as it arrives and refused the
  same way once it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ServiceError


class PayloadTooLarge(ServiceError):
    code = "payload_too_large"
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than {limit} bytes (PPR_MAX_BODY_BYTES)",
            details={"limit_bytes": limit},
        )


class HeadersTooLarge(ServiceError):
    code = "headers_too_large"
    status = 431

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request headers are larger than {limit} bytes (PPR_MAX_HEADER_BYTES)",
            details={"limit_bytes": limit},
        )


class RequestLimits:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if sum(len(name) + len(value) for name, value in headers) > self.max_header_bytes:
            await _refuse(send, HeadersTooLarge(self.max_header_bytes))
            return
        length = next((value for name, value in headers if name == b"content-length"), None)
        if length is not None:
            try:
                too_large = int(length) > self.max_body_bytes
            except ValueError:
                too_large = False  # the server itself rejects a malformed length
            if too_large:
                await _refuse(send, PayloadTooLarge(self.max_body_bytes))
                return

        received = 0
        too_large = False
        started = False

        async def counted_receive() -> Message:
            nonlocal received, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    too_large = True  # the app sees a client gone; the client gets the 413
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large:
                return  # whatever the app says about the cut body is replaced by the 413
            started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await _refuse(send, PayloadTooLarge(self.max_body_bytes))


async def _refuse(send: Send, error: ServiceError) -> None:
    body = json.dumps({"error": error.to_dict()}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
