"""HTTP clients for the tests that spread requests over a server's worker processes."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

import httpx


class PerThreadClients:
    """One ``httpx.Client`` per calling thread, each opening a new TCP connection for every
    request (none kept alive), so the kernel hands each request to any of the server's workers,
    as a new client per request would. A thread pool's threads share this object, never a
    client: one client shared by 15 threads, closing a connection per request, once failed a
    read with EBADF (a descriptor closed by one thread while another read it). A thread builds
    its client (its TLS context, about 20 ms of CPU) once, on its first request."""

    def __init__(self, base_url: str = "", *, timeout: float = 60) -> None:
        self._base_url = base_url
        self._timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: list[httpx.Client] = []
        self._closed = False

    def client(self) -> httpx.Client:
        """The calling thread's client (built on its first call)."""
        found: httpx.Client | None = getattr(self._local, "client", None)
        if found is None:
            found = httpx.Client(
                base_url=self._base_url,
                timeout=self._timeout,
                limits=httpx.Limits(max_keepalive_connections=0),
            )
            with self._lock:
                if self._closed:
                    found.close()
                    raise RuntimeError("the clients are closed")
                self._clients.append(found)
            self._local.client = found
        return found

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self.client().request(method, url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.client().get(url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.client().post(url, **kwargs)

    def close(self) -> None:
        """Close every thread's client."""
        with self._lock:
            self._closed = True
            clients, self._clients = self._clients, []
        for each in clients:
            each.close()

    def __enter__(self) -> PerThreadClients:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def new_connection_each(base_url: str = "", *, timeout: float = 60) -> PerThreadClients:
    """Clients that open a new TCP connection for every request (none is kept alive), one per
    calling thread (see PerThreadClients): safe to share between threads."""
    return PerThreadClients(base_url, timeout=timeout)
