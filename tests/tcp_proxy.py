"""A real TCP proxy on 127.0.0.1 in front of a test server, failing on purpose.

* ``drop_answers=N``: on each of the first N connections, one HTTP request is forwarded, the
  server's whole answer is read (so the server has acted and committed), and the client's
  connection is then closed without a byte of it: the client sees the connection drop.
* ``listen_after=s``: nothing listens on the port for the first ``s`` seconds (connections
  are refused), then the proxy starts forwarding.

Every other connection is forwarded both ways untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from tests.api_support import free_port


def read_http_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message with a Content-Length body (or none), as received."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class FlakyProxy:
    def __init__(self, upstream: str, *, drop_answers: int = 0, listen_after: float = 0.0) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.drop_answers = drop_answers
        self.listen_after = listen_after
        self.connections = 0
        self.dropped: list[bytes] = []  # the requests whose answers were dropped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        if self._stop.wait(self.listen_after):
            return
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            listener.settimeout(0.05)
            while not self._stop.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                self.connections += 1
                drop = self.connections <= self.drop_answers
                target = self._drop_answer if drop else self._forward
                threading.Thread(target=target, args=(client,), daemon=True).start()

    def _drop_answer(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server:
            request = read_http_message(client)
            server.sendall(request)
            read_http_message(server)  # the server answered: it has charged and stored
            self.dropped.append(request)

    def _forward(self, client: socket.socket) -> None:
        server = socket.create_connection(self.upstream)
        back = threading.Thread(target=_pipe, args=(server, client), daemon=True)
        back.start()
        _pipe(client, server)
        back.join(timeout=30)
        client.close()
        server.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
