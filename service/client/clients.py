"""``PprClient`` (sync) and ``AsyncPprClient`` (asyncio), on httpx.

Both are the same client: every method is declared once (an :class:`Endpoint` over a builder
in :mod:`service.client.calls`), and one :class:`Exchange` decides, attempt by attempt, whether
an answer is the result, a typed error to raise, or a reason to wait and send the same request
again. The two classes differ only in how they send a request and how they wait.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Self, TypeVar, overload

import httpx

from service.client import calls, embedding_calls
from service.client.calls import Call, error_from_response
from service.client.errors import PprConnectionError
from service.client.retry import RetryPolicy

__all__ = ["DEFAULT_TIMEOUT", "AsyncPprClient", "PprClient"]

P = ParamSpec("P")
T = TypeVar("T")
TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)

#: 5 s to connect, 60 s for an answer (a large batch on a busy service takes a while).
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
_USER_AGENT = f"dp-ppr-client httpx/{httpx.__version__}"


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


class Exchange(Generic[T]):
    """The attempts of one call: each outcome becomes the result, the error to raise, or the
    seconds to wait before sending the same request (same Idempotency-Key) again."""

    def __init__(
        self, call: Call[T], policy: RetryPolicy, build: Callable[..., httpx.Request]
    ) -> None:
        self.call = call
        self.policy = policy
        self.attempt = 0
        self._build = build

    def request(self) -> httpx.Request:
        self.attempt += 1
        return self.call.request(self._build)

    def after(self, outcome: httpx.Response | httpx.TransportError) -> Done[T] | float:
        call, safe = self.call, self.call.resend_safe
        if isinstance(outcome, httpx.Response):
            if outcome.is_success:
                return Done(call.result(outcome))
            error = error_from_response(outcome)
            wait = self.policy.after_error(error, self.attempt, resend_safe=safe)
            if wait is None:
                raise error
            return wait
        wait = self.policy.after_transport_error(outcome, self.attempt, resend_safe=safe)
        if wait is None:
            raise PprConnectionError(
                f"{call.method} {call.path}: no answer after {self.attempt} attempt(s): "
                f"{type(outcome).__name__}: {outcome}",
                attempts=self.attempt,
                idempotency_key=call.idempotency_key,
            ) from outcome
        return wait


class _Client(Generic[TransportT]):
    """What both clients hold and how they are made; the subclasses open their httpx client.

    ``timeout``: seconds, or an ``httpx.Timeout``; ``retry``: a :class:`RetryPolicy`
    (``NO_RETRY`` to try each call once); ``transport``: an httpx transport (e.g. with local
    address or TLS options); ``headers``: sent with every request.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: TransportT | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.retry = retry if retry is not None else RetryPolicy()
        sent = {"User-Agent": _USER_AGENT, "Accept": "application/json", **(headers or {})}
        if api_key is not None:
            sent["Authorization"] = f"Bearer {api_key}"
        self._open(transport, {"base_url": base_url, "timeout": timeout, "headers": sent})

    def _open(self, transport: TransportT | None, options: dict[str, Any]) -> None:
        raise NotImplementedError


class SyncSender(_Client[httpx.BaseTransport]):
    def _open(self, transport: httpx.BaseTransport | None, options: dict[str, Any]) -> None:
        self._http = httpx.Client(transport=transport, **options)

    def _send(self, call: Call[T]) -> T:
        exchange = Exchange(call, self.retry, self._http.build_request)
        while True:
            try:
                outcome = exchange.after(self._http.send(exchange.request()))
            except httpx.TransportError as exc:
                outcome = exchange.after(exc)
            if isinstance(outcome, Done):
                return outcome.value
            time.sleep(outcome)


class AsyncSender(_Client[httpx.AsyncBaseTransport]):
    def _open(self, transport: httpx.AsyncBaseTransport | None, options: dict[str, Any]) -> None:
        self._http = httpx.AsyncClient(transport=transport, **options)

    async def _send(self, call: Call[T]) -> T:
        exchange = Exchange(call, self.retry, self._http.build_request)
        while True:
            try:
                outcome = exchange.after(await self._http.send(exchange.request()))
            except httpx.TransportError as exc:
                outcome = exchange.after(exc)
            if isinstance(outcome, Done):
                return outcome.value
            await asyncio.sleep(outcome)


class Endpoint(Generic[P, T]):
    """A method of both clients, from the builder of its :class:`Call`: on ``PprClient`` it
    returns the answer, on ``AsyncPprClient`` an awaitable of it (same parameters, same
    documentation)."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, client: SyncSender, owner: type[Any] | None = None) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, client: AsyncSender, owner: type[Any] | None = None
    ) -> Callable[P, Awaitable[T]]: ...

    @overload
    def __get__(self, client: None, owner: type[Any] | None = None) -> Endpoint[P, T]: ...

    def __get__(self, client: Any, owner: type[Any] | None = None) -> Any:
        if client is None:
            return self
        build = self.build

        @functools.wraps(build)
        def method(*args: P.args, **kwargs: P.kwargs) -> Any:
            return client._send(build(*args, **kwargs))

        return method


class _Api:
    """Every call of the service, declared once for both clients."""

    # queries: any account
    ppr = Endpoint(calls.ppr)
    batch = Endpoint(calls.batch)
    budget = Endpoint(calls.budget)
    # embeddings (docs/embeddings.md)
    embedding = Endpoint(embedding_calls.embedding)
    embedding_batch = Endpoint(embedding_calls.embedding_batch)
    free_embedding = Endpoint(embedding_calls.free_embedding)
    similar = Endpoint(embedding_calls.similar)
    # admin accounts only
    list_accounts = Endpoint(calls.list_accounts)
    get_account = Endpoint(calls.get_account)
    create_account = Endpoint(calls.create_account)
    set_budget = Endpoint(calls.set_budget)
    set_scopes = Endpoint(calls.set_scopes)
    list_keys = Endpoint(calls.list_keys)
    create_key = Endpoint(calls.create_key)
    revoke_key = Endpoint(calls.revoke_key)
    list_charges = Endpoint(calls.list_charges)
    audit_log = Endpoint(calls.audit_log)
    exposure = Endpoint(calls.exposure)
    graph_info = Endpoint(calls.graph_info)
    reload_graph = Endpoint(calls.reload_graph)


class PprClient(_Api, SyncSender):
    """The service's API, blocking. Use it as a context manager, or ``close()`` it:
    ``PprClient(base_url, api_key, timeout=, retry=, transport=, headers=)``."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncPprClient(_Api, AsyncSender):
    """The service's API for asyncio: the same methods as :class:`PprClient`, awaited. Calls
    may run concurrently (``asyncio.gather``); each keeps its own Idempotency-Key."""

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
