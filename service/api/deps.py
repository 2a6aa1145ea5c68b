"""Request dependencies: the process runtime and the authenticated caller."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.error_responses import DuplicateHeader
from service.api.runtime import Runtime
from service.errors import Forbidden, Unauthorized
from service.ledger.ledger import LedgerUnavailable
from service.serving.schemas import Principal

#: What an API key looks like; anything else is rejected before touching the database.
_KEY_SHAPE = re.compile(r"^[A-Za-z0-9_\-]{20,200}$")

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`")


async def get_runtime(request: Request) -> Runtime:
    """The process's runtime (async: an attribute read needs no trip to the threadpool);
    503 ``ledger_unavailable`` while the worker has not yet reached its ledger database."""
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:
        raise LedgerUnavailable(
            "this server process has not reached the budget ledger database since it "
            "started; no answer was released. Retry later",
            details={"error": "not_connected"},
        )
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def authenticate(
    request: Request,
    runtime: RuntimeDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller's principal, rate-limited. On the event loop: a key this process
    authenticated within ``PPR_AUTH_CACHE_SECONDS`` and the rate limit (an asyncio Redis
    call) need no thread; a database lookup runs in the threadpool."""
    headers = request.headers.getlist("authorization")
    if len(headers) > 1:  # which one would count? (a proxy may have added one)
        raise DuplicateHeader("Authorization")
    header = headers[0] if headers else None
    if not header:
        raise Unauthorized(
            "missing credentials: send 'Authorization: Bearer <api key>'", reason="missing"
        )
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized(
            "malformed Authorization header: expected 'Bearer <api key>'", reason="malformed"
        )
    key = credentials.credentials.strip()
    if not _KEY_SHAPE.match(key):
        raise Unauthorized("malformed API key", reason="malformed")
    ledger, max_age = runtime.ledger, runtime.settings.auth_cache_seconds
    account = ledger.api_keys.recent_authentication(key, max_age)
    if account is None:
        account = await run_in_threadpool(ledger.api_keys.authenticate_cached, key, max_age)
    if account is None:
        raise Unauthorized(
            "unknown or revoked API key; ask an admin for a new one", reason="invalid"
        )
    request.state.account_id = account.account_id
    await runtime.limiter.check_async(account.account_id)  # 429 past the account's rate
    return Principal(
        account_id=account.account_id,
        type=account.type,
        node_id=account.node_id,
        may_create_seed_accounts=account.may_create_seed_accounts,
        modes=account.modes,
        quota_epsilon=account.quota_epsilon,
    )


PrincipalDep = Annotated[Principal, Depends(authenticate)]


def require_admin(principal: PrincipalDep) -> Principal:
    if principal.type != "admin":
        raise Forbidden("this endpoint is for admin accounts")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]


async def engine_slot(request: Request) -> AsyncIterator[None]:
    """A turn at the engine: waits in the bounded queue, or 503 ``overloaded``."""
    runtime: Runtime = request.app.state.runtime
    async with runtime.gate.slot():
        yield


#: Declare after the principal, so only authenticated, rate-limited requests queue.
EngineTurn = Annotated[None, Depends(engine_slot, scope="function")]


def is_admin_request(request: Request, runtime: Runtime) -> bool:
    """Whether the request carries a valid admin key (never raises: for public endpoints that
    show more to admins)."""
    headers = request.headers.getlist("authorization")
    if len(headers) != 1:
        return False
    scheme, _, key = headers[0].partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not _KEY_SHAPE.match(key):
        return False
    try:
        account = runtime.ledger.api_keys.authenticate(key)
    except Exception:
        return False
    return account is not None and account.type == "admin"
