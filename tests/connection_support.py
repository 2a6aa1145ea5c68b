"""HTTP clients for the tests that spread requests over a server's worker processes."""

from __future__ import annotations

import httpx


def new_connection_each(base_url: str = "", *, timeout: float = 60) -> httpx.Client:
    """A client that opens a new TCP connection for every request (none is kept alive), so
    the kernel hands each request to any of the server's workers, as a new client per request
    would; safe to share between threads, and without building a client (its TLS context,
    about 20 ms of CPU) per request."""
    return httpx.Client(
        base_url=base_url, timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0)
    )
