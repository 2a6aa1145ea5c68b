"""Request dependencies: the process runtime and the authenticated caller."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.runtime import Runtime
from service.errors import Forbidden, Unauthorized
from service.serving.schemas import Principal

#: What an API key looks like; anything else is rejected before touching the database.
_KEY_SHAPE = re.compile(r"^[A-Za-z0-9_\-]{20,200}$")

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`")


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def authenticate(
    request: Request,
    runtime: RuntimeDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    header = request.headers.get("authorization")
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
    account = runtime.ledger.authenticate(key)
    if account is None:
        raise Unauthorized(
            "unknown or revoked API key; ask an admin for a new one", reason="invalid"
        )
    request.state.account_id = account.account_id
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
