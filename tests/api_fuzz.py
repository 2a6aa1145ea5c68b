"""Schemathesis over every operation of the served OpenAPI schema, with each kind of key.

Used by the suite (``tests/test_api_fuzz.py``: one generated example per operation, mode and key,
each operation's coverage cases with one key it is not refused to) and by the longer run
(``make fuzz``: ``PPR_FUZZ_EXAMPLES`` examples, every coverage case with every key). Requests go
through the real app (its lifespan open: ledger, graph, caches) by Schemathesis's ASGI transport.
Each case is generated from the schema, valid (``positive``) or not (``negative``), sent with one
account's key, and its response checked: never a 5xx, and status code, content type, headers and
body as the schema documents them. Failures are collected, not raised one by one, so one run
shows every kind of failure at once.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

#: Schema-valid requests the server may refuse with ``422 invalid_parameter`` because of what
#: the OpenAPI document cannot state: the type of the account a path names or the caller is,
#: or one parameter's value given another's. (operation, parameter named in the error)
RULES_BEYOND_THE_SCHEMA = {
    # only service accounts have a read figure, or scopes
    ("GET /v1/admin/accounts/{account_id}/reads", "account_id"),
    ("PUT /v1/admin/accounts/{account_id}/scopes", "account_id"),
    # scopes (modes, quota, read cap, seed-account creation) are for service accounts only,
    # a node id for user accounts only
    ("POST /v1/admin/accounts", "modes"),
    ("POST /v1/admin/accounts", "may_create_seed_accounts"),
    ("POST /v1/admin/accounts", "quota_epsilon"),
    ("POST /v1/admin/accounts", "read_cap_epsilon"),
    ("POST /v1/admin/accounts", "node_id"),
    # a ranking offered in one mode only; exclude_neighbors for the seed user only
    ("GET /v1/ppr/{node_id}", "mechanism"),
    ("GET /v1/ppr/{node_id}", "exclude_neighbors"),
    ("POST /v1/ppr/batch", "mechanism"),
    ("POST /v1/ppr/batch", "exclude_neighbors"),
    # a free embedding is of a stored per-query release: popular has none
    ("GET /v1/embeddings/free/{node_id}", "mechanism"),
    # a quota (read cap) given together with "back to the default quota (read cap)"
    ("PUT /v1/admin/accounts/{account_id}/scopes", "quota_epsilon"),
    ("PUT /v1/admin/accounts/{account_id}/scopes", "read_cap_epsilon"),
    # a budget period's cap without a period (or a period without a cap) for an account that
    # has none, or a period given with clear_period
    ("PUT /v1/admin/accounts/{account_id}/budget", "period"),
    ("PUT /v1/admin/accounts/{account_id}/budget", "period_cap_epsilon"),
    ("PUT /v1/admin/accounts/{account_id}/budget", "clear_period"),
    # an Idempotency-Key the caller already used for another query (the ledger's state)
    ("GET /v1/ppr/{node_id}", "Idempotency-Key"),
    ("POST /v1/ppr/batch", "Idempotency-Key"),
    ("GET /v1/embeddings/{node_id}", "Idempotency-Key"),
    ("POST /v1/embeddings/batch", "Idempotency-Key"),
}


@schemathesis.check
def positive_data_accepted(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """Schemathesis's positive-data check (a schema-valid request is not refused as malformed,
    as ``k=215.0`` was), but for the refusals listed in :data:`RULES_BEYOND_THE_SCHEMA`."""
    try:
        return positive_data_acceptance(ctx, response, case)  # type: ignore[no-any-return]
    except RejectedPositiveData:
        if response.status_code == 422:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                named = response.json()["error"]["details"]["parameter"]
                label = case.operation.label
                if all((label, part) in RULES_BEYOND_THE_SCHEMA for part in named.split("/")):
                    return None
        raise


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    positive_data_accepted,
]


@dataclass
class FuzzReport:
    """What one run sent and what came back."""

    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    failures: dict[str, str] = field(default_factory=dict)  # one example per kind of failure

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def add(self, other: FuzzReport) -> None:
        self.requests += other.requests
        self.statuses.update(other.statuses)
        self.by_operation.update(other.by_operation)
        for kind, example in other.failures.items():
            self.failures.setdefault(kind, example)

    def table(self, title: str) -> str:
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        lines = [
            f"{title}: {self.requests} requests, {self.server_errors} with a 5xx, "
            f"{len(self.failures)} kinds of check failure",
            f"  statuses: {statuses}",
        ]
        lines += [f"  FAIL {kind}: {example}" for kind, example in sorted(self.failures.items())]
        return "\n".join(lines)


def fuzz_app(
    client: TestClient,
    keys: Mapping[str, str],
    *,
    examples: int,
    own_nodes: Mapping[str, str] | None = None,
    coverage_with_every_key: bool = True,
    coverage_share: tuple[int, int] = (0, 1),
) -> FuzzReport:
    """Send Schemathesis's coverage cases (boundary values, both modes) and ``examples``
    generated cases per operation, generation mode and key through ``client``.

    ``keys`` maps a role (``user``, ``service``, ``admin``) to its API key; ``own_nodes`` maps a
    role to a node it may query, so that answers (not only refusals) are checked as well.
    ``client`` is a ``TestClient`` whose context (the app's lifespan) is open. Without
    ``coverage_with_every_key``, an operation's coverage cases after its first go with one key
    only: one of the roles its first case was not refused to (401, 403), taken in turn over
    the operations (a refused role's cases would all stop at the same refusal); the first case
    and the generated ones still go with every key. ``coverage_share`` ``(i, parts)``: only the
    operations numbered ``i`` modulo ``parts`` send their coverage cases (two runs on two
    backends with ``(0, 2)`` and ``(1, 2)`` send each case once between them).
    """
    share, parts = coverage_share
    app = client.app
    schema = schemathesis.openapi.from_dict(app.openapi())  # type: ignore[attr-defined]
    report = FuzzReport()
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    transport = _InLoop(client)
    senders = {role: _Sender(transport, key, report, role) for role, key in keys.items()}
    try:
        for number, result in enumerate(schema.get_all_operations()):
            operation = result.ok()
            if number % parts != share:
                coverage: list[schemathesis.Case] = []
            else:
                coverage = list(
                    schema.iter_coverage_cases(
                        operation,
                        generation_modes=modes,
                        generation_config=schema.config.generation_for(operation=operation),
                    )
                )[:COVERAGE_CASES_MAX]
            # the roles taken in turn over the operations that send their coverage cases
            turn = number // parts
            _send_coverage(coverage, senders, turn, every_key=coverage_with_every_key)
            for role, sender in senders.items():
                _generate_for(operation, modes, examples, sender, (own_nodes or {}).get(role))
    finally:
        transport.close()
    return report


#: Statuses that refuse a key for who it is, whatever the request says.
REFUSED_KEY = (401, 403)


def _send_coverage(
    coverage: list[schemathesis.Case], senders: Mapping[str, _Sender], number: int, *,
    every_key: bool,
) -> None:  # fmt: skip
    if not coverage:
        return
    if every_key:
        for sender in senders.values():
            for case in coverage:
                sender.send(case)
        return
    allowed = [sender for sender in senders.values() if sender.send(coverage[0]) not in REFUSED_KEY]
    chosen = allowed or list(senders.values())
    sender = chosen[number % len(chosen)]
    for case in coverage[1:]:
        sender.send(case)


def _generate_for(
    operation: Any, modes: list[GenerationMode], examples: int, sender: _Sender, node: str | None
) -> None:
    strategies = [operation.as_strategy(generation_mode=mode) for mode in modes]
    if node is not None and "{node_id}" in operation.path:
        strategies.append(operation.as_strategy(path_parameters={"node_id": node}))
    _generate(st.one_of(strategies), examples * len(strategies), sender)


class _InLoop:
    """Requests to the app of an open ``TestClient`` sent from inside the client's event loop
    (the one the app's lifespan runs in) by an ASGI transport: one hop into that loop per
    request, where the test client makes one per ASGI message. The app, its lifespan and what
    it answers are the same; like the test client, an exception in the app is a 500."""

    def __init__(self, client: TestClient) -> None:
        self.base_url = str(client.base_url)
        portal = client.portal
        assert portal is not None, "the TestClient's context must be open"
        self.portal = portal
        transport = httpx2.ASGITransport(
            app=client.app, raise_app_exceptions=False, client=("testclient", 50000)
        )

        async def opened() -> httpx2.AsyncClient:
            return httpx2.AsyncClient(
                transport=transport, base_url=self.base_url,
                headers={"user-agent": "testclient"},
            )  # fmt: skip

        self.client = self.portal.call(opened)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx2.Response:
        return self.portal.call(functools.partial(self.client.request, method, url, **kwargs))

    def close(self) -> None:
        self.portal.call(self.client.aclose)


#: Most coverage cases sent per operation and key (they are deterministic boundary values).
COVERAGE_CASES_MAX = 200


@dataclass
class _Sender:
    client: _InLoop
    key: str
    report: FuzzReport
    role: str

    def send(self, case: schemathesis.Case) -> int:
        headers = {"Authorization": f"Bearer {self.key}"}
        kwargs = case.as_transport_kwargs(base_url=str(self.client.base_url), headers=headers)
        content = kwargs.pop("data", None)
        if isinstance(content, str):
            content = content.encode()
        response = self.client.request(
            kwargs.pop("method"),
            kwargs.pop("url"),
            params=kwargs.pop("params", None),
            headers=kwargs.pop("headers", None),
            cookies=kwargs.pop("cookies", None) or None,
            json=kwargs.pop("json", None) if "json" in kwargs else None,
            content=content,
        )
        label = case.operation.label
        self.report.requests += 1
        self.report.statuses[response.status_code] += 1
        self.report.by_operation[label] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (Exception, FailureGroup) as exc:  # one example per kind of failure
            for failure in getattr(exc, "exceptions", [exc]):
                kind = f"{label} [{type(failure).__name__}] -> {response.status_code}"
                self.report.failures.setdefault(
                    kind,
                    f"{self.role}: {case.as_curl_command()} :: "
                    f"{str(failure).splitlines()[0][:300]} :: {response.text[:300]}",
                )
        return response.status_code


def _generate(strategy: st.SearchStrategy[Any], examples: int, sender: _Sender) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: collect, do not minimise
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def send(case: schemathesis.Case) -> None:
        sender.send(case)

    send()
