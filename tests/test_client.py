"""The typed client (``service.client``) against the real service: ``serve`` in a subprocess on
SQLite and on PostgreSQL + Redis, reached over real TCP, through a proxy that drops
connections on purpose where a test needs a failure. Every method, the error mapping, and
retries that reuse one Idempotency-Key so a charged query is charged once."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.client import (
    NO_RETRY,
    AccountWithBudget,
    AsyncPprClient,
    BudgetExhausted,
    CreatedAccount,
    Forbidden,
    InvalidParameter,
    ModeNotAllowed,
    NotFound,
    PprClient,
    PprConnectionError,
    RateLimited,
    RetryPolicy,
    ServiceQuotaExhausted,
    Unauthorized,
    UnknownAccount,
    UnknownNode,
)
from service.ledger.records import ChargeRecord
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    Server,
    open_ledger,
    uvicorn_server,
)
from tests.tcp_proxy import FlakyProxy
from tests.test_api import backend_on

#: Retries without the production waits, so that tests stay fast.
# one server per backend for the module (service, tight_service): its tests run on one xdist
# worker
pytestmark = pytest.mark.xdist_group("test_client")

FAST = RetryPolicy(attempts=4, backoff=0.05, max_backoff=0.2)


@dataclass
class Service:
    backend: Backend
    server: Server
    admin_key: str

    @property
    def url(self) -> str:
        return self.server.base_url

    def admin(self) -> PprClient:
        return PprClient(self.url, self.admin_key, retry=FAST)

    def charges(self, account_id: int) -> list[ChargeRecord]:
        """The charged account's charges, read from the ledger itself."""
        with open_ledger(self.backend.database_url) as ledger:
            return ledger.reports.list_charges(account_id, limit=1000)

    def service_account(self, **fields: Any) -> tuple[int, str]:
        with self.admin() as admin:
            created = admin.create_account("service", cap_epsilon=5.0, **fields)
        return created.account_id, created.key.api_key


@contextmanager
def running_service(
    tmp: Path, name: str, extra_env: dict[str, str] | None = None
) -> Iterator[Service]:
    with backend_on(name, tmp) as backend:
        with open_ledger(backend.database_url) as ledger:
            admin = ledger.accounts.create_account(
                "admin", cap_epsilon=1.0, delta=1e-6, label="ops"
            )
            admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
        env = {"PPR_DEFAULT_CAP_EPSILON": "1.0", **(extra_env or {})}
        with uvicorn_server(backend, extra_env=env, forked=True) as server:
            yield Service(backend, server, admin_key)


@pytest.fixture(
    scope="module",
    params=[
        "sqlite",
        pytest.param("postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
    ],
)
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    with running_service(tmp_path_factory.mktemp("client"), request.param) as running:
        yield running


# -- every method -------------------------------------------------------------------------


def test_admin_calls(service: Service) -> None:
    with service.admin() as admin:
        created = admin.create_account("service", label="recs", modes=["edge"], cap_epsilon=5.0)
        assert isinstance(created, CreatedAccount)
        assert created.type == "service" and created.modes == ["edge"]
        assert created.budget.cap_epsilon == 5.0 and created.key.api_key
        user = admin.create_account("user", node_id=5, cap_epsilon=0.5)
        assert user.node_id == "5"

        got = admin.get_account(created.account_id)
        assert isinstance(got, AccountWithBudget) and got.label == "recs"
        listed = admin.list_accounts(type="service", limit=1000)
        assert created.account_id in {a.account_id for a in listed}
        assert {a.type for a in listed} == {"service"}
        assert len(admin.list_accounts(limit=1)) == 1

        assert admin.set_budget(user.account_id, cap_epsilon=0.7).cap_epsilon == 0.7
        daily = admin.set_budget(user.account_id, period="day", period_cap_epsilon=0.2)
        assert daily.model_extra is not None and daily.model_extra["period"] == "day"
        cleared = admin.set_budget(user.account_id, clear_period=True)
        assert not cleared.model_extra or "period" not in cleared.model_extra
        scoped = admin.set_scopes(
            created.account_id, modes=["edge", "personalized"], quota_epsilon=2.0
        )
        assert set(scoped.modes) == {"edge", "personalized"} and scoped.quota_epsilon == 2.0
        assert admin.set_scopes(created.account_id, default_quota=True).quota_epsilon is None

        key = admin.create_key(created.account_id)
        keys = admin.list_keys(created.account_id)
        assert {k.key_id for k in keys} == {created.key.key_id, key.key_id}
        assert admin.revoke_key(key.key_id).revoked_at is not None
        with PprClient(service.url, key.api_key) as revoked, pytest.raises(Unauthorized):
            revoked.budget()

        actions = {(e.action, e.target_account_id) for e in admin.audit_log(limit=100)}
        for action in ("account.create", "budget.set", "scopes.set", "api_key.revoke"):
            assert any(a == action for a, _ in actions), action
        assert ("api_key.create", created.account_id) in actions

        info = admin.graph_info()
        assert (info.nodes, info.edges) == (GRAPH_NODES, GRAPH_EDGES)
        assert admin.reload_graph().version == info.version
        exposure = admin.exposure()
        assert exposure.epsilon >= 0 and exposure.delta > 0


def test_queries_batches_and_budget(service: Service) -> None:
    account_id, key = service.service_account()
    with PprClient(service.url, key) as ppr:
        first = ppr.ppr("7", k=5, epsilon=0.1, mode="edge")
        assert first.node == "7" and len(first.results) == 5 and not first.replayed
        assert first.epsilon_charged == pytest.approx(0.1)
        assert first.mechanism.mode == "edge" and first.mechanism.epsilon == pytest.approx(0.1)
        assert first.budget.account_id == account_id
        again = ppr.ppr(7, k=5, epsilon=0.1, mode="edge")
        assert again.replayed and again.results == first.results and again.epsilon_charged == 0
        assert not ppr.ppr("7", k=5, epsilon=0.1, mode="edge", fresh=True).replayed

        answer = ppr.batch(["8", "no-such-node", 9], k=3, epsilon=0.1, mode="edge")
        assert [item.node for item in answer.items] == ["8", "no-such-node", "9"]
        good, bad, other = answer.items
        assert good.ok and good.results is not None and len(good.results) == 3
        assert other.ok and answer.epsilon_charged == pytest.approx(0.2)
        assert not bad.ok and isinstance(bad.exception(), UnknownNode)
        with pytest.raises(UnknownNode) as refused:
            bad.raise_for_error()
        assert refused.value.node == "no-such-node" and refused.value.status == 404

        budget = ppr.budget()
        assert budget.account_id == account_id and budget.charges == 4
    charges = service.charges(account_id)
    assert sorted(c.seed for c in charges) == ["7", "7", "8", "9"]
    # every call carried an Idempotency-Key of its own, made by the client
    assert len({c.idempotency_key for c in charges}) == 4 and all(
        c.idempotency_key for c in charges
    )
    with service.admin() as admin:
        listed = admin.list_charges(account_id=account_id)
    assert {c.charge_id for c in listed} == {c.charge_id for c in charges}


# -- errors -------------------------------------------------------------------------------


def test_errors_are_typed(service: Service) -> None:
    with PprClient(service.url, "ppr_not-a-key") as stranger, pytest.raises(Unauthorized) as e:
        stranger.budget()
    assert e.value.status == 401 and e.value.code == "unauthorized" and e.value.request_id
    with PprClient(service.url) as anonymous, pytest.raises(Unauthorized):
        anonymous.ppr("1")

    with service.admin() as admin:
        user = admin.create_account("user", node_id="11", cap_epsilon=0.15)
        edge_only_id, edge_only = service.service_account(modes=["edge"])
        with pytest.raises(Forbidden):
            admin.ppr("1")  # admin accounts cannot query
        with pytest.raises(UnknownAccount) as missing:
            admin.get_account(2**31 - 2)
        assert isinstance(missing.value, NotFound) and missing.value.status == 404
        with pytest.raises(UnknownNode):
            admin.create_account("user", node_id="no-such-node")

    with PprClient(service.url, user.key.api_key) as ppr:
        ppr.ppr("11", epsilon=0.1)
        with pytest.raises(BudgetExhausted) as exhausted:
            ppr.ppr("11", epsilon=0.1, fresh=True)
        assert exhausted.value.status == 403
        assert exhausted.value.remaining_epsilon is not None
        assert exhausted.value.remaining_epsilon < 0.1
        with pytest.raises(Forbidden) as other_seed:
            ppr.ppr("12")
        assert type(other_seed.value) is Forbidden
        with pytest.raises(InvalidParameter) as bad_k:
            ppr.ppr("11", k=0)
        assert bad_k.value.parameter == "k" and bad_k.value.status == 422
        with pytest.raises(InvalidParameter) as bad_epsilon:
            ppr.ppr("11", epsilon=50.0)
        assert bad_epsilon.value.parameter == "epsilon"
    assert len(service.charges(user.account_id)) == 1  # refusals charge nothing

    with PprClient(service.url, edge_only) as ppr:
        with pytest.raises(ModeNotAllowed) as not_allowed:
            ppr.ppr("11", mode="personalized")
        assert isinstance(not_allowed.value, Forbidden)
        odd = "a/b?%&#é+;"
        with pytest.raises(UnknownNode) as unknown:
            ppr.ppr(odd, mode="edge")  # percent-encoded in the path, read back intact
        assert unknown.value.node == odd
        ppr.ppr("13", mode="edge", idempotency_key="nightly-13")
        with pytest.raises(InvalidParameter) as reused:
            ppr.ppr("14", mode="edge", idempotency_key="nightly-13")
        assert reused.value.parameter == "Idempotency-Key"
    assert len(service.charges(edge_only_id)) == 1


def test_a_service_quota_is_raised_at_once_with_its_wait(service: Service) -> None:
    with service.admin() as admin:
        for node in ("15", "16"):
            admin.create_account("user", node_id=node)
    _, key = service.service_account(modes=["personalized"], quota_epsilon=0.15)
    with PprClient(service.url, key, retry=RetryPolicy(max_retry_after=1e9)) as ppr:
        ppr.ppr("15", epsilon=0.1)
        with pytest.raises(ServiceQuotaExhausted) as quota:
            ppr.ppr("16", epsilon=0.1)
    assert quota.value.status == 429 and quota.value.retry_after is not None
    assert quota.value.retry_after > 60  # the 24-hour window: never retried by the client
    assert len(_attempts_of(service.server, quota.value.request_id)) == 1


def _attempts_of(server: Server, request_id: str | None) -> list[dict[str, Any]]:
    """The access-log lines of every attempt of the call behind ``request_id``."""
    assert request_id is not None
    call_id = request_id.split(".")[0]
    return [
        line
        for line in server.log_lines()
        if line.get("message") == "request"
        and str(line.get("request_id", "")).startswith(f"{call_id}.")
    ]


# -- retries that charge once ---------------------------------------------------------------


def _idempotency_key(request: bytes) -> str:
    match = re.search(rb"\r\nidempotency-key: ([^\r]+)\r\n", request, re.IGNORECASE)
    assert match is not None
    return match.group(1).decode()


def test_a_dropped_answer_is_retried_with_the_same_key_and_charged_once(
    service: Service,
) -> None:
    account_id, key = service.service_account()
    with (
        FlakyProxy(service.url, drop_answers=1) as proxy,
        PprClient(proxy.base_url, key, retry=FAST) as ppr,
    ):
        answer = ppr.ppr("20", k=4, epsilon=0.1, mode="edge", fresh=True)
    # the first attempt was charged and stored; the retry got that release back
    assert answer.replayed and answer.epsilon_charged == 0
    assert proxy.connections == 2 and len(proxy.dropped) == 1
    (charge,) = service.charges(account_id)
    assert charge.seed == "20" and charge.idempotency_key == _idempotency_key(proxy.dropped[0])

    with (
        FlakyProxy(service.url, drop_answers=1) as proxy,
        PprClient(proxy.base_url, key, retry=FAST) as ppr,
    ):
        batch = ppr.batch(["21", "22"], epsilon=0.1, mode="edge", fresh=True)
    assert [item.replayed for item in batch.items] == [True, True]
    assert sorted(c.seed for c in service.charges(account_id)) == ["20", "21", "22"]


def test_the_caller_retries_later_with_the_key_of_a_failed_call(service: Service) -> None:
    account_id, key = service.service_account()
    with (
        FlakyProxy(service.url, drop_answers=1) as proxy,
        PprClient(proxy.base_url, key, retry=NO_RETRY) as ppr,
        pytest.raises(PprConnectionError) as failed,
    ):
        ppr.ppr("23", epsilon=0.1, mode="edge")
    assert failed.value.attempts == 1 and failed.value.idempotency_key
    with PprClient(service.url, key) as ppr:
        again = ppr.ppr(
            "23", epsilon=0.1, mode="edge", idempotency_key=failed.value.idempotency_key
        )
    assert again.replayed
    assert len(service.charges(account_id)) == 1


def test_account_creation_is_not_sent_twice(service: Service) -> None:
    with (
        FlakyProxy(service.url, drop_answers=1) as proxy,
        PprClient(proxy.base_url, service.admin_key, retry=FAST) as admin,
        pytest.raises(PprConnectionError) as failed,
    ):
        admin.create_account("service", label="created-once")
    assert failed.value.attempts == 1 and proxy.connections == 1
    with service.admin() as admin:
        accounts = admin.list_accounts(type="service", limit=1000)
    assert [a.label for a in accounts].count("created-once") == 1


def test_a_refused_connection_is_retried_until_the_service_listens(service: Service) -> None:
    account_id, key = service.service_account()
    patient = RetryPolicy(attempts=10, backoff=0.2, max_backoff=0.4)
    with (
        FlakyProxy(service.url, listen_after=0.6) as proxy,
        PprClient(proxy.base_url, key, retry=patient) as ppr,
    ):
        answer = ppr.ppr("24", epsilon=0.1, mode="edge")
    assert not answer.replayed and len(service.charges(account_id)) == 1
    with (
        FlakyProxy(service.url, listen_after=5) as proxy,
        PprClient(proxy.base_url, key, retry=FAST) as ppr,
        pytest.raises(PprConnectionError) as refused,
    ):
        ppr.ppr("24", epsilon=0.1, mode="edge")
    assert refused.value.attempts == FAST.attempts


# -- async ---------------------------------------------------------------------------------


def test_async_client_concurrent_calls(service: Service) -> None:
    account_id, key = service.service_account()
    nodes = [str(n) for n in range(30, 46)]

    async def run() -> tuple[list[Any], list[Any], Any, Any]:
        async with AsyncPprClient(service.url, key, retry=FAST) as ppr:
            answers = await asyncio.gather(
                *(ppr.ppr(node, k=3, epsilon=0.05, mode="edge") for node in nodes)
            )
            mixed = await asyncio.gather(
                ppr.ppr("no-such-node", mode="edge"),
                ppr.batch(["46", "47"], epsilon=0.05, mode="edge"),
                return_exceptions=True,
            )
            mixed.append(await ppr.budget())
        with FlakyProxy(service.url, drop_answers=1) as proxy:
            async with AsyncPprClient(proxy.base_url, key, retry=FAST) as ppr:
                retried = await ppr.ppr("48", epsilon=0.05, mode="edge", fresh=True)
        async with AsyncPprClient(service.url, "ppr_not-a-key") as stranger:
            refused = await asyncio.gather(stranger.budget(), return_exceptions=True)
        return answers, mixed, retried, refused[0]

    answers, (unknown, batch, budget), retried, refused = asyncio.run(run())
    assert [a.node for a in answers] == nodes
    assert all(not a.replayed and len(a.results) == 3 for a in answers)
    assert isinstance(unknown, UnknownNode)
    assert [item.ok for item in batch.items] == [True, True]
    assert budget.charges == 18
    assert retried.replayed
    assert isinstance(refused, Unauthorized)
    charges = service.charges(account_id)
    assert len(charges) == 19
    assert len({c.idempotency_key for c in charges}) == 19


# -- a service at its limits --------------------------------------------------------------


@pytest.fixture(scope="module")
def tight_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One query computing at a time and none waiting; 2 requests/s per account."""
    env = {
        "PPR_ENGINE_CONCURRENCY": "1",
        "PPR_ENGINE_QUEUE": "0",
        "PPR_RATE_LIMIT_PER_SECOND": "2",
        "PPR_RATE_LIMIT_BURST": "3",
    }
    with running_service(tmp_path_factory.mktemp("tight"), "sqlite", env) as running:
        yield running


def _direct_account(service: Service) -> tuple[int, str]:
    """A service account made in the ledger (the admin is rate-limited too)."""
    with open_ledger(service.backend.database_url) as ledger:
        account = ledger.accounts.create_account("service", cap_epsilon=100.0, delta=1e-6)
        key, _ = ledger.api_keys.create_api_key(account.account_id)
    return account.account_id, key


def test_overloaded_is_retried_after_its_retry_after(tight_service: Service) -> None:
    _, busy_key = _direct_account(tight_service)
    waiting = [_direct_account(tight_service) for _ in range(3)]
    patient = RetryPolicy(attempts=40, backoff=0.1, max_backoff=0.5)

    async def run() -> tuple[Any, list[Any]]:
        # One turn of the engine, none waiting: a batch holds the turn for a while, and the
        # three queries sent meanwhile (or each other) are refused with 503 until it is free.
        async with AsyncPprClient(tight_service.url, busy_key, retry=patient) as busy:
            nodes = [str(n) for n in range(100)]
            holding = asyncio.ensure_future(busy.batch(nodes, epsilon=0.01, mode="edge"))
            await asyncio.sleep(0.05)
            clients = [AsyncPprClient(tight_service.url, k, retry=patient) for _, k in waiting]
            answers = await asyncio.gather(
                *(c.ppr("50", epsilon=0.1, mode="edge") for c in clients)
            )
            for client in clients:
                await client.close()
            return await holding, answers

    batch, answers = asyncio.run(run())
    assert all(item.ok for item in batch.items)
    for (account_id, _), answer in zip(waiting, answers, strict=True):
        attempts = _attempts_of(tight_service.server, answer.request_id)
        statuses = [line["status"] for line in attempts]
        assert statuses[-1] == 200 and set(statuses[:-1]) <= {503}
        assert len(tight_service.charges(account_id)) == 1
    overloaded = [
        line
        for _, answer in zip(waiting, answers, strict=True)
        for line in _attempts_of(tight_service.server, answer.request_id)
        if line["status"] == 503
    ]
    assert overloaded, "no call met the busy engine"


def test_rate_limited_is_raised_or_retried_as_configured(tight_service: Service) -> None:
    _, key = _direct_account(tight_service)

    async def burst() -> list[Any]:
        async with AsyncPprClient(tight_service.url, key) as ppr:
            return await asyncio.gather(*(ppr.budget() for _ in range(10)), return_exceptions=True)

    limited = [r for r in asyncio.run(burst()) if isinstance(r, RateLimited)]
    assert limited, "ten requests at once passed a burst of three"
    assert all(r.status == 429 and r.retry_after is not None for r in limited)
    assert all(r.retry_after >= 1 for r in limited)
    _, other = _direct_account(tight_service)
    polite = RetryPolicy(attempts=10, backoff=0.05, retry_rate_limited=True)
    with PprClient(tight_service.url, other, retry=polite) as ppr:
        budgets = [ppr.budget() for _ in range(6)]
    assert len(budgets) == 6
