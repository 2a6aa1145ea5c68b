"""Every call of the API as data: method, path, query, body, headers and how to read the answer.

A :class:`Call` is built once per logical call (so its Idempotency-Key and request id are
fixed), then sent as many times as the retry policy allows by the sync or the async client.
Only parameters the caller gave are sent, so that an older server is not sent fields it does
not know and a newer server's defaults apply.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from service.client.errors import InvalidResponse, PprError, error_class
from service.client.models import Account as AccountModel
from service.client.models import (
    AccountWithBudget,
    ApiKey,
    AuditEntry,
    BatchAnswer,
    Budget,
    Charge,
    CreatedAccount,
    Exposure,
    GraphInfo,
    NewApiKey,
    PprAnswer,
)
from service.client.retry import parse_retry_after

T = TypeVar("T")

Mode = Literal["personalized", "edge"]
AccountType = Literal["user", "service", "admin"]
NodeId = str | int


@dataclass(frozen=True)
class Call(Generic[T]):
    """One logical call: sent again on a retry exactly as it was the first time."""

    method: str
    path: str
    parse: Callable[[bytes], T]  # the JSON body, read straight into the typed answer
    params: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    idempotency_key: str | None = None
    #: Whether a request that may have reached the service can be sent again (the service
    #: either dedups it by Idempotency-Key or the call has the same effect twice).
    resend_safe: bool = True
    #: Sent as X-Request-ID, so the service's log and ledger tie every attempt to this call.
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def request(self, build: Callable[..., httpx.Request]) -> httpx.Request:
        """The request, from ``httpx.Client.build_request`` (or the async client's)."""
        headers = {"X-Request-ID": self.call_id}
        if self.idempotency_key is not None:
            headers["Idempotency-Key"] = self.idempotency_key
        params = {name: value for name, value in self.params.items() if value is not None}
        return build(self.method, self.path, params=params, json=self.body, headers=headers)

    def result(self, response: httpx.Response) -> T:
        """The typed answer of a 2xx ``response``."""
        try:
            return self.parse(response.content)
        except ValueError as exc:  # not JSON, or not the shape this client reads
            raise InvalidResponse(
                f"{self.method} {self.path}: the answer could not be read: {exc}",
                status=response.status_code,
                request_id=response.headers.get("x-request-id"),
            ) from exc


def error_from_response(response: httpx.Response) -> PprError:
    """The typed exception of a non-2xx answer (``InvalidResponse`` if it is not the service's
    error body, e.g. a proxy's page)."""
    request_id = response.headers.get("x-request-id")
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    try:
        payload = response.json()
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not (isinstance(error, dict) and isinstance(error.get("code"), str)):
        snippet = response.text[:200]
        return InvalidResponse(
            f"HTTP {response.status_code} without an error body of the service: {snippet!r}",
            status=response.status_code,
            request_id=request_id,
            retry_after=retry_after,
        )
    code: str = error["code"]
    given = error.get("details")
    details: dict[str, Any] = given if isinstance(given, dict) else {}
    if retry_after is None and isinstance(details.get("retry_after_seconds"), int | float):
        retry_after = float(details["retry_after_seconds"])
    return error_class(code)(
        str(error.get("message", code)),
        status=response.status_code,
        code=code,
        details=details,
        request_id=request_id,
        retry_after=retry_after,
    )


def _reader(shape: Any) -> Callable[[bytes], Any]:
    return TypeAdapter(shape).validate_json


_read_accounts = _reader(list[AccountWithBudget])
_read_keys = _reader(list[ApiKey])
_read_charges = _reader(list[Charge])
_read_audit = _reader(list[AuditEntry])


def _given(**fields: Any) -> dict[str, Any]:
    """The fields the caller gave (not None; booleans only when true)."""
    return {
        name: value for name, value in fields.items() if value is not None and value is not False
    }


# -- queries ---------------------------------------------------------------------------------


class QueryOptions(TypedDict, total=False):
    """The options of ``ppr`` and ``batch``; any left out takes the service's default.

    ``k``: results per seed; ``epsilon``: per-query epsilon; ``mode``: ``"personalized"`` (the
    service's default: the seed user's account is charged) or ``"edge"`` (the caller is);
    ``fresh``: draw new noise even where a release exists; ``exclude_neighbors``: drop the
    seed's own neighbours (personalized mode); ``mechanism``: a mechanism by name, on services
    that offer several; ``idempotency_key``: the key every attempt of this call carries (a
    fresh UUID per call if not given; give your own to retry a failed call later).
    """

    k: int
    epsilon: float
    mode: Mode
    fresh: bool
    exclude_neighbors: bool
    mechanism: str
    idempotency_key: str


def charged_options(options: Mapping[str, object]) -> tuple[dict[str, Any], str]:
    """A charged call's options to send (only those given) and its Idempotency-Key: the
    caller's, or a fresh UUID, reused by every attempt."""
    sent = {name: value for name, value in options.items() if name != "idempotency_key"}
    key = options.get("idempotency_key")
    return _given(**sent), key if isinstance(key, str) and key else uuid.uuid4().hex


def batch_call(
    path: str, nodes: Sequence[NodeId], options: Mapping[str, object], parse: Callable[[bytes], T]
) -> Call[T]:
    """A batch of seeds at ``path``: one body, one Idempotency-Key for every attempt (the
    service derives each item's key from it, so a retry charges no item twice)."""
    fields, key = charged_options(options)
    body = {"nodes": [str(node) for node in nodes], **fields}
    return Call("POST", path, parse, body=body, idempotency_key=key)


def ppr(node: NodeId, **options: Unpack[QueryOptions]) -> Call[PprAnswer]:
    """``GET /v1/ppr/{node}``: a private PPR answer for ``node``, charged at most once however
    many attempts it takes (see :class:`QueryOptions`)."""
    params, key = charged_options(options)
    path = f"/v1/ppr/{quote(str(node), safe='')}"
    return Call("GET", path, PprAnswer.model_validate_json, params=params, idempotency_key=key)


def batch(nodes: Sequence[NodeId], **options: Unpack[QueryOptions]) -> Call[BatchAnswer]:
    """``POST /v1/ppr/batch``: one item per node, in order, each an answer or its own error
    (``BatchItem.raise_for_error()``); a retry charges no item twice (see
    :class:`QueryOptions`)."""
    return batch_call("/v1/ppr/batch", nodes, options, BatchAnswer.model_validate_json)


def budget() -> Call[Budget]:
    """``GET /v1/me/budget``: the caller's own budget."""
    return Call("GET", "/v1/me/budget", Budget.model_validate_json)


# -- admin -----------------------------------------------------------------------------------


def list_accounts(
    *, type: AccountType | None = None, limit: int | None = None, offset: int | None = None
) -> Call[list[AccountWithBudget]]:
    """``GET /v1/admin/accounts``, with each account's budget."""
    params = _given(type=type, limit=limit, offset=offset)
    return Call("GET", "/v1/admin/accounts", _read_accounts, params=params)


def get_account(account_id: int) -> Call[AccountWithBudget]:
    """``GET /v1/admin/accounts/{account_id}``."""
    return Call(
        "GET", f"/v1/admin/accounts/{int(account_id)}", AccountWithBudget.model_validate_json
    )


def create_account(
    type: AccountType,
    *,
    node_id: NodeId | None = None,
    cap_epsilon: float | None = None,
    delta: float | None = None,
    label: str | None = None,
    may_create_seed_accounts: bool = False,
    modes: Sequence[Mode] | None = None,
    quota_epsilon: float | None = None,
) -> Call[CreatedAccount]:
    """``POST /v1/admin/accounts``: the account and its first API key (``.key.api_key``, shown
    once). Not re-sent after a dropped connection: that could create two accounts."""
    body = _given(
        type=type,
        node_id=None if node_id is None else str(node_id),
        cap_epsilon=cap_epsilon,
        delta=delta,
        label=label,
        may_create_seed_accounts=may_create_seed_accounts,
        modes=None if modes is None else list(modes),
        quota_epsilon=quota_epsilon,
    )
    return Call(
        "POST",
        "/v1/admin/accounts",
        CreatedAccount.model_validate_json,
        body=body,
        resend_safe=False,
    )


def set_budget(
    account_id: int,
    *,
    cap_epsilon: float | None = None,
    delta: float | None = None,
    period: str | None = None,
    period_cap_epsilon: float | None = None,
    clear_period: bool = False,
) -> Call[Budget]:
    """``PUT /v1/admin/accounts/{account_id}/budget``: a new cap and/or delta, and a budget
    period (``day``, ``week`` or ``month`` with ``period_cap_epsilon``; ``clear_period``
    removes it). The budget's period figures are in ``model_extra``."""
    body = _given(
        cap_epsilon=cap_epsilon, delta=delta, period=period,
        period_cap_epsilon=period_cap_epsilon, clear_period=clear_period,
    )  # fmt: skip
    return Call(
        "PUT", f"/v1/admin/accounts/{int(account_id)}/budget", Budget.model_validate_json, body=body
    )


def set_scopes(
    account_id: int,
    *,
    modes: Sequence[Mode] | None = None,
    may_create_seed_accounts: bool | None = None,
    quota_epsilon: float | None = None,
    default_quota: bool = False,
) -> Call[AccountModel]:
    """``PUT /v1/admin/accounts/{account_id}/scopes``: a service account's modes, whether it
    may create seed users' accounts, and its 24-hour quota (``default_quota``: the configured
    one again)."""
    body = _given(
        modes=None if modes is None else list(modes),
        quota_epsilon=quota_epsilon,
        default_quota=default_quota,
    )
    if may_create_seed_accounts is not None:
        body["may_create_seed_accounts"] = may_create_seed_accounts
    return Call(
        "PUT",
        f"/v1/admin/accounts/{int(account_id)}/scopes",
        AccountModel.model_validate_json,
        body=body,
    )


def list_keys(account_id: int) -> Call[list[ApiKey]]:
    """``GET /v1/admin/accounts/{account_id}/keys`` (prefixes only; keys are never shown again)."""
    return Call("GET", f"/v1/admin/accounts/{int(account_id)}/keys", _read_keys)


def create_key(account_id: int) -> Call[NewApiKey]:
    """``POST /v1/admin/accounts/{account_id}/keys``: a new key (``.api_key``, shown once).
    Not re-sent after a dropped connection: that could create two keys."""
    return Call(
        "POST",
        f"/v1/admin/accounts/{int(account_id)}/keys",
        NewApiKey.model_validate_json,
        resend_safe=False,
    )


def revoke_key(key_id: int) -> Call[ApiKey]:
    """``POST /v1/admin/keys/{key_id}/revoke`` (idempotent)."""
    return Call("POST", f"/v1/admin/keys/{int(key_id)}/revoke", ApiKey.model_validate_json)


def list_charges(
    *, account_id: int | None = None, limit: int | None = None, offset: int | None = None
) -> Call[list[Charge]]:
    """``GET /v1/admin/charges``, newest first; optionally of one charged account."""
    params = _given(account_id=account_id, limit=limit, offset=offset)
    return Call("GET", "/v1/admin/charges", _read_charges, params=params)


def audit_log(*, limit: int | None = None) -> Call[list[AuditEntry]]:
    """``GET /v1/admin/audit``, newest first."""
    return Call("GET", "/v1/admin/audit", _read_audit, params=_given(limit=limit))


def exposure(*, delta: float | None = None) -> Call[Exposure]:
    """``GET /v1/admin/exposure``: the graph-wide composed exposure of all accounts."""
    return Call(
        "GET", "/v1/admin/exposure", Exposure.model_validate_json, params=_given(delta=delta)
    )


def graph_info() -> Call[GraphInfo]:
    """``GET /v1/admin/graph``: the loaded graph's version, size and degrees."""
    return Call("GET", "/v1/admin/graph", GraphInfo.model_validate_json)


def reload_graph() -> Call[GraphInfo]:
    """``POST /v1/admin/graph/reload``: load the graph again and swap it in (a broken file
    raises ``GraphLoadError`` and the old graph keeps serving)."""
    return Call("POST", "/v1/admin/graph/reload", GraphInfo.model_validate_json)
