"""The cap means what it says, and what a service account has read (issue 19, findings 4, 5, 8).

* An account pays the version's DP degree release (eps_d) once per graph version, with its first
  answer built on it (``popular``, ``blended``), admitted in the same transaction as the query,
  refused past the cap before anything is drawn, never twice for one version (a unique index:
  the database decides, also under concurrent requests).
* A service account's read figure composes every distinct release it received (fresh or
  replayed, the degree release once per version); an optional cap refuses with
  ``read_cap_exhausted`` before a replay is sent. ``exclude_neighbors`` is the seed user's only.
* The "who learns what" tables name admins, coalitions, both backend scopes and the degree
  release.

On SQLite and on PostgreSQL (+ Redis for the API).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from service.ledger import BudgetExhausted, DegreeCharge, Ledger, ReadCapExhausted, upgrade
from service.ledger.records import Admission
from service.ledger.tables import DEGREE_RELEASE_CHARGE, Charge
from service.privacy.accountant import RdpCurve
from service.privacy.curves import laplace_curve
from service.privacy.laplace import plan_laplace
from service.serving.rankings import degree_release_name
from tests import test_api
from tests.api_support import Backend, bearer, ledger_of, running_app
from tests.test_api import Accounts, query

backend = test_api.backend

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-6
EPS_D = plan_laplace(0.1, 2.0).epsilon  # the default PPR_POPULAR_EPSILON, as released


def degree(version: str = "v1") -> DegreeCharge:
    return DegreeCharge(version, EPS_D, laplace_curve(EPS_D))


def admission(
    account_id: int, epsilon: float, *, version: str = "v1", principal: int | None = None,
    with_degree: bool = True, request_id: str = "r",
) -> Admission:  # fmt: skip
    return Admission(
        charged_account_id=account_id,
        principal_account_id=account_id if principal is None else principal,
        seed="1",
        mechanism="blended",
        mode="personalized",
        params={"name": "blended"},
        query_curve=laplace_curve(epsilon),
        query_epsilon=epsilon,
        graph_version=version,
        request_id=request_id,
        degree=degree(version) if with_degree else None,
    )


def degree_charges(ledger: Ledger, account_id: int) -> list[Any]:
    return [
        c for c in ledger.reports.list_charges(account_id, limit=1000)
        if c.mechanism == DEGREE_RELEASE_CHARGE
    ]  # fmt: skip


# -- the ledger: eps_d once per version, composed with the query ---------------------------


def test_the_degree_release_is_charged_once_per_version_with_the_query(ledger: Ledger) -> None:
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=1.0, delta=DELTA
    ).account_id
    q = laplace_curve(0.1)
    first = ledger.admission.admit_and_charge(admission(user, 0.1))
    assert first.degree_epsilon == EPS_D
    assert first.budget.spent_epsilon == pytest.approx((q + laplace_curve(EPS_D)).epsilon(DELTA))
    second = ledger.admission.admit_and_charge(admission(user, 0.1, request_id="r2"))
    assert second.degree_epsilon == 0.0  # paid already for this version
    assert second.budget.spent_epsilon == pytest.approx(
        (q + q + laplace_curve(EPS_D)).epsilon(DELTA)
    )
    # popular for the same version: free now
    paid = ledger.quota_and_degree.admit_degree_release(
        charged_account_id=user, principal_account_id=user, seed="1", mode="personalized",
        degree=degree(), request_id="r3",
    )  # fmt: skip
    assert not paid.charged and paid.budget.charges == 3
    # a new graph version is a new release: paid again, once
    again = ledger.quota_and_degree.admit_degree_release(
        charged_account_id=user, principal_account_id=user, seed="1", mode="personalized",
        degree=degree("v2"), request_id="r4",
    )  # fmt: skip
    assert again.charged and again.budget.charges == 4
    assert [c.graph_version for c in degree_charges(ledger, user)] == ["v2", "v1"]
    assert all(c.state == "released" for c in degree_charges(ledger, user))
    report = ledger.reports.verify()
    assert report.ok, report.mismatches
    # the graph-wide exposure holds the query charges, not one degree release per account
    assert ledger.reports.exposure(delta=DELTA).epsilon == pytest.approx((q + q).epsilon(DELTA))


def test_the_degree_release_is_refused_past_the_cap_writing_nothing(ledger: Ledger) -> None:
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=0.15, delta=DELTA
    ).account_id
    ledger.admission.admit_and_charge(admission(user, 0.1, with_degree=False))
    with pytest.raises(BudgetExhausted):  # popular was free (and answered) before
        ledger.quota_and_degree.admit_degree_release(
            charged_account_id=user, principal_account_id=user, seed="1", mode="personalized",
            degree=degree(), request_id="p",
        )  # fmt: skip
    with pytest.raises(BudgetExhausted):  # the query alone fits; with the release it does not
        ledger.admission.admit_and_charge(admission(user, 0.01))
    assert degree_charges(ledger, user) == []
    assert ledger.budgets.budget(user).charges == 1


def test_a_service_accounts_personalized_query_charges_the_seed_for_the_release(
    ledger: Ledger,
) -> None:
    """Attributed like the query's own charge: to the seed user in personalized mode."""
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=1.0, delta=DELTA
    ).account_id
    service = ledger.accounts.create_account(
        "service", cap_epsilon=1.0, delta=DELTA, modes=("edge", "personalized")
    ).account_id
    receipt = ledger.admission.admit_and_charge(admission(user, 0.1, principal=service))
    assert receipt.degree_epsilon == EPS_D
    assert len(degree_charges(ledger, user)) == 1
    assert degree_charges(ledger, service) == []


def test_the_database_refuses_a_second_live_degree_charge(ledger: Ledger) -> None:
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=1.0, delta=DELTA
    ).account_id
    ledger.quota_and_degree.admit_degree_release(
        charged_account_id=user, principal_account_id=user, seed="1", mode="personalized",
        degree=degree(), request_id="p",
    )  # fmt: skip
    curve = laplace_curve(EPS_D)
    row = {
        "charged_account_id": user, "principal_account_id": user, "seed": "1",
        "mechanism": DEGREE_RELEASE_CHARGE, "mode": "personalized", "params": {},
        "epsilon": EPS_D, "rdp": curve.to_json(), "pure_epsilon": curve.pure,
        "grid_version": 1, "graph_version": "v1", "request_id": "x", "state": "released",
        "exposure_shard": 0,
    }  # fmt: skip
    with pytest.raises(IntegrityError), ledger.engine.begin() as conn:
        conn.execute(insert(Charge.__table__), row)  # type: ignore[arg-type]


def test_one_account_pays_the_release_once_under_concurrent_requests(ledger_url: str) -> None:
    """Two workers (each its own engine and connection pool), released at once, each asking
    many times for answers built on the release: exactly one degree charge."""
    upgrade(ledger_url)
    setup = Ledger.from_url(ledger_url)
    try:
        user = setup.accounts.create_account(
            "user", node_id="1", cap_epsilon=5.0, delta=DELTA
        ).account_id
    finally:
        setup.dispose()
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        ledger = Ledger.from_url(ledger_url)
        try:
            start.wait()
            for i in range(8):
                if i % 2:
                    ledger.quota_and_degree.admit_degree_release(
                        charged_account_id=user, principal_account_id=user, seed="1",
                        mode="personalized", degree=degree(), request_id=f"p{n}-{i}",
                    )  # fmt: skip
                else:
                    ledger.admission.admit_and_charge(admission(user, 0.01, request_id=f"q{n}-{i}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            ledger.dispose()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ledger = Ledger.from_url(ledger_url)
    try:
        assert len(degree_charges(ledger, user)) == 1
        assert ledger.budgets.budget(user).charges == 8 + 1
        expected = laplace_curve(0.01) * 8 + laplace_curve(EPS_D)
        assert ledger.budgets.budget(user).spent_epsilon == pytest.approx(expected.epsilon(DELTA))
        report = ledger.reports.verify()
        assert report.ok, report.mismatches
    finally:
        ledger.dispose()


# -- the ledger: what a service account has read -------------------------------------------


def test_the_read_figure_counts_each_distinct_release_once(ledger: Ledger) -> None:
    service = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=5.0, delta=DELTA
    ).account_id
    c1 = ledger.admission.admit_and_charge(
        admission(user, 0.1, with_degree=False, request_id="a")
    ).charge_id
    c2 = ledger.admission.admit_and_charge(
        admission(user, 0.2, with_degree=False, request_id="b")
    ).charge_id
    c3 = ledger.admission.admit_and_charge(
        admission(user, 0.3, with_degree=False, request_id="c")
    ).charge_id
    name = degree_release_name(20.0)
    ledger.graph_releases.graph_release(
        "v1", name, epsilon=EPS_D, curve=laplace_curve(EPS_D), draw=lambda: b"released"
    )
    assert ledger.read_figures.read_view(service).releases == 0
    assert ledger.read_figures.record_reads(service, charge_ids=[c1]).releases == 1
    assert (
        ledger.read_figures.record_reads(service, charge_ids=[c1]).releases == 1
    )  # a replay: counted once
    view = ledger.read_figures.record_reads(
        service, charge_ids=[c2, c1], graph_release=("v1", name)
    )
    view = ledger.read_figures.record_reads(service, graph_release=("v1", name))  # the release once
    expected = laplace_curve(0.1) + laplace_curve(0.2) + laplace_curve(EPS_D)
    assert view.releases == 3 and view.epsilon == pytest.approx(expected.epsilon(DELTA))
    assert view.cap_epsilon is None
    # a cap: the release that would pass it is refused and not recorded
    ledger.budgets.set_scopes(service, read_cap_epsilon=view.epsilon + 0.05)
    with pytest.raises(ReadCapExhausted) as refused:
        ledger.read_figures.record_reads(service, charge_ids=[c3])
    assert refused.value.code == "read_cap_exhausted" and refused.value.status == 403
    after = ledger.read_figures.read_view(service)
    assert after.releases == 3 and after.epsilon == pytest.approx(view.epsilon)
    assert (
        ledger.read_figures.record_reads(service, charge_ids=[c1]).releases == 3
    )  # a known one: fine
    # the default cap applies when the account has none of its own
    ledger.budgets.set_scopes(service, clear_read_cap=True)
    assert ledger.read_figures.read_view(service, default_cap_epsilon=9.0).cap_epsilon == 9.0
    assert ledger.read_figures.record_reads(service, charge_ids=[c3]).releases == 4


# -- the API: findings 4 and 5 against a real app -------------------------------------------


@pytest.fixture
def client(backend: Backend) -> Iterator[TestClient]:
    with running_app(backend) as client:
        yield client


@pytest.fixture
def accounts(client: TestClient) -> Accounts:
    return Accounts(client)


def test_popular_is_not_free_and_not_answered_past_the_cap(
    client: TestClient, accounts: Accounts
) -> None:
    """Finding 4: a user at its cap still got `popular` for free."""
    _, key = accounts.user("5", cap_epsilon=0.15)
    first = query(client, key, "5", k=10, epsilon=0.1, mechanism="friends_of_friends")
    assert first.status_code == 200, first.text
    refused = query(client, key, "5", k=10, mechanism="popular")
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "budget_exhausted"
    assert refused.json()["error"]["details"]["query_epsilon"] == pytest.approx(EPS_D)

    # an account that paid for the release first keeps receiving popular after its cap
    _, other = accounts.user("6", cap_epsilon=0.15)
    paid = query(client, other, "6", k=10, mechanism="popular")
    assert paid.status_code == 200 and paid.json()["epsilon_charged"] == pytest.approx(EPS_D)
    spent = paid.json()["budget"]["spent_epsilon"]
    assert spent == pytest.approx(laplace_curve(EPS_D).epsilon(DELTA))
    exhausted = query(client, other, "6", k=10, epsilon=0.1, mechanism="friends_of_friends")
    assert exhausted.json()["error"]["code"] == "budget_exhausted"
    again = query(client, other, "6", k=10, mechanism="popular")
    assert again.status_code == 200 and again.json()["epsilon_charged"] == 0.0
    # blended after popular: the release is not charged again
    _, third = accounts.user("7", cap_epsilon=1.0)
    assert query(client, third, "7", k=5, mechanism="popular").json()["epsilon_charged"] > 0
    blended = query(client, third, "7", k=5, epsilon=0.1, mechanism="blended").json()
    assert blended["epsilon_charged"] == pytest.approx(0.1)
    assert ledger_of(client).reports.verify().ok


def test_a_service_accounts_read_figure_and_cap(client: TestClient, accounts: Accounts) -> None:
    """Finding 5: a personalized-scope key replayed seeds' stored answers at no charge to
    anyone and with nothing recording what it had read."""
    service_id, service = accounts.service(modes=["edge", "personalized"])
    seeds = ["11", "12", "13"]
    for node in seeds:
        _, key = accounts.user(node)
        own = query(client, key, node, k=10, epsilon=0.1, mechanism="friends_of_friends")
        assert own.status_code == 200, own.text
    assert client.get("/v1/me/reads", headers=bearer(service)).json()["releases"] == 0
    # decided: a service account may replay a seed user's stored personalized answer; it is
    # free for the seed and counted in the service account's read figure
    for node in seeds[:2]:
        for _ in range(2):
            replay = query(client, service, node, k=10, epsilon=0.1, mechanism="friends_of_friends")
            assert replay.status_code == 200 and replay.json()["replayed"] is True
    reads = client.get("/v1/me/reads", headers=bearer(service)).json()
    expected = laplace_curve(0.1) * 2
    assert reads["releases"] == 2  # distinct releases, each once
    assert reads["read_epsilon"] == pytest.approx(expected.epsilon(DELTA))
    admin_view = client.get(
        f"/v1/admin/accounts/{service_id}/reads", headers=bearer(accounts.admin_key)
    ).json()
    assert admin_view == reads
    usage = client.get(
        f"/v1/admin/accounts/{service_id}/service-usage",
        headers=bearer(accounts.admin_key),
    ).json()
    assert usage["read_releases"] == 2 and usage["read_epsilon"] == pytest.approx(
        reads["read_epsilon"]
    )
    # a read cap refuses the next new release before it is sent (a known one still replays)
    capped = client.put(
        f"/v1/admin/accounts/{service_id}/scopes",
        json={"read_cap_epsilon": reads["read_epsilon"] + 0.01},
        headers=bearer(accounts.admin_key),
    )
    assert capped.status_code == 200 and capped.json()["read_cap_epsilon"] > 0
    refused = query(client, service, seeds[2], k=10, epsilon=0.1, mechanism="friends_of_friends")
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "read_cap_exhausted"
    assert "results" not in refused.json()
    known = query(client, service, seeds[0], k=10, epsilon=0.1, mechanism="friends_of_friends")
    assert known.status_code == 200
    # a fresh draw past the cap: refused by its admission, before any charge or noise
    fresh = query(client, service, "9", mode="edge", k=5, epsilon=0.1, fresh="true")
    assert fresh.json()["error"]["code"] == "read_cap_exhausted"
    # so is a DP-IE embedding, alone or in a batch: nothing charged, no noise drawn
    embedding = client.get(
        "/v1/embeddings/9", params={"mode": "edge", "epsilon": 0.1, "k": 8},
        headers=bearer(service),
    )  # fmt: skip
    assert embedding.status_code == 403, embedding.text
    assert embedding.json()["error"]["code"] == "read_cap_exhausted"
    assert "embedding" not in embedding.json()
    batch = client.post(
        "/v1/embeddings/batch", json={"nodes": ["9", "10"], "mode": "edge", "epsilon": 0.1, "k": 8},
        headers=bearer(service),
    )  # fmt: skip
    assert batch.status_code == 200, batch.text
    assert [item["error"]["code"] for item in batch.json()["items"]] == ["read_cap_exhausted"] * 2
    ledger = ledger_of(client)
    assert ledger.reports.list_charges(service_id) == []
    assert ledger.read_figures.read_view(service_id).releases == 2
    assert ledger.reports.verify().ok
    # decided: exclude_neighbors is the seed user's only (it names the neighbour list)
    excluded = query(client, service, seeds[0], k=10, exclude_neighbors="true")
    assert excluded.status_code == 422
    assert excluded.json()["error"]["details"]["parameter"] == "exclude_neighbors"
    assert client.get("/v1/me/reads", headers=bearer(accounts.user("20")[1])).status_code == 403


def test_a_batch_counts_its_reads_in_its_admission_and_refuses_past_the_read_cap(
    client: TestClient, accounts: Accounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service account's batch is counted in its read figure by the batch's admission
    transaction (no transaction of its own): the items that fit its read cap, in order, are
    charged and answered; the rest are refused by admission, nothing charged, no noise drawn."""
    service_id, service = accounts.service(modes=["edge"])
    ledger = ledger_of(client)
    calls: list[int] = []
    record_reads = ledger.read_figures.record_reads

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(kwargs.get("charge_ids", ())))
        return record_reads(*args, **kwargs)

    monkeypatch.setattr(ledger.read_figures, "record_reads", counted)

    def batch(nodes: list[str]) -> list[dict[str, Any]]:
        body = {"nodes": nodes, "mode": "edge", "epsilon": 0.1, "k": 5}
        response = client.post("/v1/ppr/batch", json=body, headers=bearer(service))
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    first = batch(["1", "2", "3", "4"])
    assert all("results" in item for item in first), first
    assert calls == []  # counted by the admission, in its transaction
    assert ledger.read_figures.read_view(service_id).releases == 4
    # a cap with room for two more of the same release
    with ledger.engine.connect() as conn:  # the four charges' curve (one plan for all)
        rdp = conn.execute(
            select(Charge.rdp).where(Charge.principal_account_id == service_id).limit(1)
        ).scalar_one()
    one = RdpCurve.from_json(rdp)
    cap = ((one * 6).epsilon(DELTA) + (one * 7).epsilon(DELTA)) / 2
    capped = client.put(
        f"/v1/admin/accounts/{service_id}/scopes",
        json={"read_cap_epsilon": cap},
        headers=bearer(accounts.admin_key),
    )
    assert capped.status_code == 200, capped.text
    second = batch(["5", "6", "7", "8"])
    answered = [item["node"] for item in second if "results" in item]
    refused = [item["error"]["code"] for item in second if "error" in item]
    assert answered == ["5", "6"] and refused == ["read_cap_exhausted"] * 2
    assert calls == []
    assert ledger.read_figures.read_view(service_id).releases == 6
    charges = ledger.reports.list_charges(service_id)
    assert len(charges) == 6 and all(c.state == "released" for c in charges)
    assert ledger.reports.verify().ok


def test_a_service_account_reads_the_degree_release_once_per_version(
    client: TestClient, accounts: Accounts
) -> None:
    service_id, service = accounts.service(modes=["edge"])
    for node in ("3", "4", "5"):
        answer = query(client, service, node, mode="edge", k=5, mechanism="popular")
        assert answer.status_code == 200, answer.text
    ledger = ledger_of(client)
    reads = ledger.read_figures.read_view(service_id)
    assert reads.releases == 1
    assert reads.epsilon == pytest.approx(laplace_curve(EPS_D).epsilon(DELTA))
    # in edge mode the service account itself pays the release, once
    assert len(degree_charges(ledger, service_id)) == 1


# -- the docs: who learns what, row by row (finding 8 and the corrected rows) ---------------


def _table_after(text: str, marker: str) -> str:
    start = text.index(marker)
    block: list[str] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            break
    assert block
    return "\n".join(block)


@pytest.mark.parametrize(
    ("path", "marker"),
    [("README.md", "**Who learns what:**"), ("docs/privacy.md", "## 2. Who learns what")],
)
def test_who_learns_what_names_every_party(path: str, marker: str) -> None:
    table = _table_after((REPO / path).read_text(), marker).lower()
    for party in ("admin", "coalition", "personalized", "edge", "degree release", "operator"):
        assert party in table, f"{path}: the who-learns-what table does not name {party!r}"
    assert "/v1/admin/graph" in table  # admins see exact graph statistics there
    # the old claim that a personalized-scope backend is bounded by each seed's cap is gone
    assert "within each seed user's cap" not in table
    assert "composition over every seed" in table or "composed over every seed" in table


def test_ranking_doc_states_what_is_charged_for_the_degree_release() -> None:
    text = (REPO / "docs/ranking.md").read_text()
    assert "- `popular`: nothing per query." not in text  # what it said before
    assert "| Lap(2/eps_d) | none |" not in text
    assert "pays eps_d once per graph version" in text
    assert "exactly eps + eps_d composed" in text


def test_the_batch_path_charges_each_seed_the_release_once(
    client: TestClient, accounts: Accounts
) -> None:
    service_id, service = accounts.service(modes=["personalized"])
    users = {node: accounts.user(node)[0] for node in ("11", "12")}
    for fresh in (False, True):
        answer = client.post(
            "/v1/ppr/batch",
            json={"nodes": ["11", "12"], "k": 5, "epsilon": 0.1, "mechanism": "blended",
                  "fresh": fresh},
            headers=bearer(service),
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        charged = [item["epsilon_charged"] for item in answer.json()["items"]]
        assert charged == pytest.approx([0.1 + EPS_D] * 2 if not fresh else [0.1] * 2)
    ledger = ledger_of(client)
    for account_id in users.values():
        assert len(degree_charges(ledger, account_id)) == 1
    reads = ledger.read_figures.read_view(service_id)
    assert reads.releases == 4 + 1  # four count releases, the degree release once
    expected = laplace_curve(0.1) * 4 + laplace_curve(EPS_D)
    assert reads.epsilon == pytest.approx(expected.epsilon(DELTA))
    assert ledger.reports.verify().ok


def test_the_cli_shows_and_caps_what_a_service_account_has_read(
    capsys: pytest.CaptureFixture[str], ledger: Ledger, ledger_url: str
) -> None:
    import json

    from service.cli import main

    service = ledger.accounts.create_account("service", cap_epsilon=1.0, delta=DELTA).account_id
    db = ("--database-url", ledger_url)
    assert main(["accounts", "set-scopes", str(service), "--read-cap-epsilon", "2.5", *db]) == 0
    assert "read cap 2.5" in capsys.readouterr().out
    assert main(["accounts", "reads", str(service), "--json", *db]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "account_id": service, "read_epsilon": 0.0, "delta": DELTA, "releases": 0,
        "read_cap_epsilon": 2.5,
    }  # fmt: skip
    assert main(["accounts", "set-scopes", str(service), "--default-read-cap", *db]) == 0
    capsys.readouterr()
    assert main(["accounts", "reads", str(service), *db]) == 0
    assert "read epsilon 0 at delta 1e-06 over 0 distinct releases" in capsys.readouterr().out
    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=1.0, delta=DELTA
    ).account_id
    assert main(["accounts", "reads", str(user), *db]) == 2
    assert "only service accounts have a read figure" in capsys.readouterr().err
