"""Every answer an account receives from a sandbox is inside its promise.

A sandbox serves a synthetic release (exact PPR on it). The release is charged once to each
account that receives an answer computed from it, like a graph version's degree release
(docs/privacy.md, section 6b): admitted in one transaction before anything computed from the
release leaves, refused with ``budget_exhausted`` past the cap (nothing charged), once per
account whatever the number of requests and workers (the database decides), counted in a
service account's read figure, and ``ledger verify`` holds. A ``chung_lu`` release is
post-processing of the version's degree release: the charge is that release's, the same one
``popular`` makes. A service account asking in ``personalized`` mode charges the seed user, as
the degree release does, and counts the release in its own read figure.

Before this, a user at its cap read synthetic neighbourhoods for free (an audit measured an
empirical lower bound of 0.1525 against a cap of 0.1) and a service account's read figure
stayed at 0 with 0 releases. SQLite and PostgreSQL + Redis in-process; PostgreSQL + Redis with
two workers under concurrent requests.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.cli import main
from service.ledger import Ledger
from service.ledger.tables import DEGREE_RELEASE_CHARGE, SYNTHETIC_RELEASE_CHARGE
from service.privacy.laplace import plan_laplace
from tests import test_api
from tests.api_support import Backend, bearer, ledger_of, open_ledger, running_app, uvicorn_server
from tests.test_api import Accounts, query

backend = test_api.backend

DELTA = 1e-6
EPS_D = plan_laplace(0.1, 2.0).epsilon  # the default PPR_POPULAR_EPSILON, as released
RELEASE_EPSILON = 0.5  # the communities releases published here


def publish(backend: Backend, out: Path, method: str, epsilon: float | None = None) -> str:
    """``synthesize`` on the backend's graph into its ledger; the release's ledger name."""
    args = ["synthesize", "--graph", str(backend.graph_path), "--method", method,
            "--database-url", backend.database_url, "--out", str(out), "--no-progress"]  # fmt: skip
    if epsilon is not None:
        args += ["--epsilon", str(epsilon)]
    assert main(args) == 0
    with open_ledger(backend.database_url) as ledger:
        jobs, _ = ledger.synthesis.synthesis_jobs()
    return str(next(j.release_name for j in jobs if j.method == method))


def synthetic_node(out: Path) -> str:
    return out.read_text().split()[0]


def charges_of(ledger: Ledger, account_id: int | None, mechanism: str) -> list[Any]:
    return [
        c for c in ledger.reports.list_charges(account_id, limit=1000) if c.mechanism == mechanism
    ]


def sandbox(backend: Backend, out: Path) -> Any:
    return running_app(backend, graph_path=out, graph_is_synthetic=True)


def batch(client: TestClient, key: str, nodes: list[str], **body: Any) -> Any:
    return client.post("/v1/ppr/batch", json={"nodes": nodes, **body}, headers=bearer(key))


def refused(response: Any, code: str = "budget_exhausted") -> bool:
    return bool(response.status_code == 403 and response.json()["error"]["code"] == code)


# -- a user at its cap --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["chung_lu", "communities"])
def test_a_user_at_its_cap_gets_nothing_from_a_sandbox(
    backend: Backend, tmp_path: Path, method: str
) -> None:
    """The audit's case: a user spends its cap on friends_of_friends, popular is refused, and
    the sandbox (a chung_lu release: post-processing of the degree release popular charges)
    answered the same key for free, at any node, k=1000, with and without exclude_neighbors."""
    out = tmp_path / f"{method}.txt"
    publish(backend, out, method, None if method == "chung_lu" else RELEASE_EPSILON)
    with running_app(backend) as client:
        accounts = Accounts(client)
        at_cap, key = accounts.user("5", cap_epsilon=0.1)
        _, tiny = accounts.user("6", cap_epsilon=1e-4)
        spent = query(client, key, "5", k=10, epsilon=0.1, mechanism="friends_of_friends")
        assert spent.status_code == 200, spent.text
        assert refused(query(client, key, "5", k=10, mechanism="popular"))
        charges = len(ledger_of(client).reports.list_charges(None, limit=1000))
    node = synthetic_node(out)
    with sandbox(backend, out) as client:
        ledger = ledger_of(client)
        for who in (key, tiny):
            for params in ({"k": 1000}, {"k": 1000, "exclude_neighbors": "true"},
                           {"k": 5, "mode": "edge"}):  # fmt: skip
                for seed in (node, "5", "no-such-node"):
                    # refused before anything computed from the release, a node's presence
                    # in the synthetic graph included, leaves
                    assert refused(query(client, who, seed, **params))
            answered = batch(client, who, [node, "5", "no-such-node"], k=1000)
            assert answered.status_code == 200, answered.text
            body = answered.json()
            assert body["synthetic"] is True and body["epsilon_charged"] == 0.0
            assert [item["error"]["code"] for item in body["items"]] == ["budget_exhausted"] * 3
        assert len(ledger.reports.list_charges(None, limit=1000)) == charges  # nothing charged
        assert ledger.budgets.budget(at_cap).spent_epsilon <= 0.1 * (1 + 1e-9)
        assert ledger.reports.verify().ok


def test_a_sandbox_charges_its_release_once_per_account(backend: Backend, tmp_path: Path) -> None:
    out = tmp_path / "communities.txt"
    name = publish(backend, out, "communities", RELEASE_EPSILON)
    node = synthetic_node(out)
    with sandbox(backend, out) as client:
        ledger = ledger_of(client)
        accounts = Accounts(client)
        user, key = accounts.user("5", cap_epsilon=1.0)
        before = ledger.reports.exposure(delta=1e-5)
        first = query(client, key, node, k=5)
        assert first.status_code == 200, first.text
        body = first.json()
        release_epsilon = body["mechanism"]["epsilon"]
        assert release_epsilon == pytest.approx(RELEASE_EPSILON)
        assert body["epsilon_charged"] == release_epsilon and body["synthetic"] is True
        assert body["mechanism"]["release"] == name and body["mechanism"]["privacy_unit"] == "edge"
        assert body["budget"]["charges"] == 1
        # everything after is post-processing of the same release: free
        again = query(client, key, node, k=50, exclude_neighbors="true")
        assert again.status_code == 200 and again.json()["epsilon_charged"] == 0.0
        answered = batch(client, key, [node, "5", "no-such-node"], k=3).json()
        assert answered["epsilon_charged"] == 0.0
        assert answered["items"][2]["error"]["code"] == "unknown_node"
        paid = charges_of(ledger, user, SYNTHETIC_RELEASE_CHARGE)
        assert len(paid) == 1 and paid[0].epsilon == release_epsilon
        # its recorded curve (a sum of Laplace curves) converts to a little under its epsilon
        assert 0.99 * release_epsilon < ledger.budgets.budget(user).spent_epsilon <= release_epsilon
        # the release is in the graph-wide exposure once (at synthesis), not once per account
        after = ledger.reports.exposure(delta=1e-5)
        assert (after.epsilon, after.charges) == (before.epsilon, before.charges)
        # a batch that pays charges once, on its first answered item
        other, other_key = accounts.user("6", cap_epsilon=1.0)
        got = batch(client, other_key, ["no-such-node", node, node], k=3).json()
        assert [item.get("epsilon_charged") for item in got["items"]] == [None, 0.0, 0.0]
        assert got["items"][0]["error"]["code"] == "unknown_node"
        assert got["epsilon_charged"] == 0.0  # charged with the first item, which had no answer
        assert len(charges_of(ledger, other, SYNTHETIC_RELEASE_CHARGE)) == 1
        assert ledger.reports.verify().ok


def test_a_chung_lu_sandbox_charges_the_degree_release_it_post_processes(
    backend: Backend, tmp_path: Path
) -> None:
    """chung_lu draws nothing from the graph but the version's degree release: an account pays
    that release once, whether it first receives it through popular or through the sandbox."""
    out = tmp_path / "chung_lu.txt"
    publish(backend, out, "chung_lu")
    node = synthetic_node(out)
    with running_app(backend) as client:
        accounts = Accounts(client)
        early, early_key = accounts.user("5", cap_epsilon=1.0)
        late, late_key = accounts.user("6", cap_epsilon=1.0)
        popular = query(client, early_key, "5", k=5, mechanism="popular")
        assert popular.status_code == 200 and popular.json()["epsilon_charged"] == EPS_D
    with sandbox(backend, out) as client:
        ledger = ledger_of(client)
        free = query(client, early_key, node, k=5)  # paid through popular already
        assert free.status_code == 200 and free.json()["epsilon_charged"] == 0.0
        assert free.json()["mechanism"]["epsilon"] == EPS_D
        first = query(client, late_key, node, k=5)
        assert first.status_code == 200 and first.json()["epsilon_charged"] == EPS_D
    with running_app(backend) as client:  # and popular is then free for the late one
        after = query(client, late_key, "6", k=5, mechanism="popular")
        assert after.status_code == 200 and after.json()["epsilon_charged"] == 0.0
        ledger = ledger_of(client)
        for account in (early, late):
            assert len(charges_of(ledger, account, DEGREE_RELEASE_CHARGE)) == 1
            assert not charges_of(ledger, account, SYNTHETIC_RELEASE_CHARGE)
        assert ledger.reports.verify().ok


# -- service accounts -----------------------------------------------------------------------------


def test_a_service_accounts_sandbox_answers_are_counted_and_charged(
    backend: Backend, tmp_path: Path
) -> None:
    """Edge mode: charged to the service account itself; personalized mode (granted): charged
    to the seed user, as the degree release; both: in the service account's read figure."""
    out = tmp_path / "communities.txt"
    publish(backend, out, "communities", RELEASE_EPSILON)
    node = synthetic_node(out)
    with sandbox(backend, out) as client:
        ledger = ledger_of(client)
        accounts = Accounts(client)
        edge_only, edge_key = accounts.service(cap_epsilon=2.0)
        both, both_key = accounts.service(cap_epsilon=2.0, modes=["edge", "personalized"])
        seed, _ = accounts.user(node, cap_epsilon=1.0)
        reads = client.get("/v1/me/reads", headers=bearer(edge_key)).json()
        assert (reads["releases"], reads["read_epsilon"]) == (0, 0.0)

        single = query(client, edge_key, node, k=5, mode="edge")
        assert single.status_code == 200 and single.json()["epsilon_charged"] > 0
        assert single.json()["budget"]["account_id"] == edge_only
        many = batch(client, edge_key, [node, node], k=5, mode="edge").json()
        assert many["epsilon_charged"] == 0.0
        reads = client.get("/v1/me/reads", headers=bearer(edge_key)).json()
        assert reads["releases"] == 1
        assert 0.99 * RELEASE_EPSILON < reads["read_epsilon"] <= RELEASE_EPSILON
        assert len(charges_of(ledger, edge_only, SYNTHETIC_RELEASE_CHARGE)) == 1

        # personalized needs the scope, as on the live service
        assert refused(query(client, edge_key, node, k=5), "mode_not_allowed")
        for_seed = batch(client, both_key, [node, node], k=5).json()
        assert for_seed["items"][0]["epsilon_charged"] > 0  # the seed user pays
        assert for_seed["items"][1]["epsilon_charged"] == 0.0
        assert len(charges_of(ledger, seed, SYNTHETIC_RELEASE_CHARGE)) == 1
        assert not charges_of(ledger, both, SYNTHETIC_RELEASE_CHARGE)
        assert 0.99 * RELEASE_EPSILON < ledger.budgets.budget(seed).spent_epsilon <= RELEASE_EPSILON
        reads = client.get("/v1/me/reads", headers=bearer(both_key)).json()
        assert reads["releases"] == 1  # what the service account received, counted
        # a seed without an account (and no right to create one): 404, nothing charged
        assert query(client, both_key, "5", k=5).json()["error"]["code"] == "unknown_account"

        # the read cap holds for the sandbox too: refused before anything is sent
        _, capped = accounts.service(cap_epsilon=2.0)
        assert client.put(
            f"/v1/admin/accounts/{_}/scopes", json={"read_cap_epsilon": 0.1},
            headers=bearer(accounts.admin_key),
        ).status_code == 200  # fmt: skip
        assert refused(query(client, capped, node, k=5, mode="edge"), "read_cap_exhausted")
        assert not charges_of(ledger, _, SYNTHETIC_RELEASE_CHARGE)
        assert ledger.reports.verify().ok


# -- PostgreSQL + Redis, two workers --------------------------------------------------------------


def _race(base_url: str, node: str, keys: dict[str, str]) -> dict[str, list[httpx.Response]]:
    """Single and batch sandbox requests by three accounts, all at once (8 threads); the
    responses by who asked."""
    with httpx.Client(base_url=base_url, timeout=60) as http:

        def single(who: str, **params: Any) -> tuple[str, Callable[[], httpx.Response]]:
            return who, lambda: http.get(
                f"/v1/ppr/{node}", params={"k": 20, **params}, headers=bearer(keys[who])
            )

        def many(who: str, **body: Any) -> tuple[str, Callable[[], httpx.Response]]:
            return who, lambda: http.post(
                "/v1/ppr/batch", json={"nodes": [node, node], "k": 20, **body},
                headers=bearer(keys[who]),
            )  # fmt: skip

        calls = [single("at_cap"), many("at_cap"), single("at_cap", k=1000)] * 4
        calls += [single("payer"), many("payer")] * 8
        calls += [single("service", mode="edge"), many("service", mode="edge")] * 4
        with ThreadPoolExecutor(max_workers=8) as pool:
            responses = list(pool.map(lambda call: call[1](), calls))
    out: dict[str, list[httpx.Response]] = {}
    for (who, _), response in zip(calls, responses, strict=True):
        out.setdefault(who, []).append(response)
    return out


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_the_sandbox_charge_holds_on_two_workers(tmp_path: Path) -> None:
    """On PostgreSQL + Redis with two workers: a user at its cap gets no sandbox answer at all;
    a user below it pays each release once however many of its requests race; a service
    account's read figure counts it once."""
    from service.graph.generate import write_generated_edge_list
    from service.ledger import upgrade
    from tests.conftest import postgres_database
    from tests.test_api import REDIS_URL, forget_cached_keys, redis_answers

    if not redis_answers():
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    graph = tmp_path / "graph.txt"
    write_generated_edge_list(graph, 400, 2400, seed=7)
    with postgres_database() as url:
        upgrade(url)
        real = Backend("postgres", url, REDIS_URL, graph)
        files = {"chung_lu": tmp_path / "chung_lu.txt", "communities": tmp_path / "c.txt"}
        publish(real, files["chung_lu"], "chung_lu")
        publish(real, files["communities"], "communities", RELEASE_EPSILON)
        with open_ledger(url) as ledger:
            keys: dict[str, str] = {}
            ids: dict[str, int] = {}
            for name, node, cap in (("at_cap", "5", 0.1), ("payer", "6", 1.0)):
                account = ledger.accounts.create_account(
                    "user", node_id=node, cap_epsilon=cap, delta=DELTA
                )
                keys[name], _ = ledger.api_keys.create_api_key(account.account_id)
                ids[name] = account.account_id
            service = ledger.accounts.create_account("service", cap_epsilon=2.0, delta=DELTA)
            keys["service"], _ = ledger.api_keys.create_api_key(service.account_id)
            ids["service"] = service.account_id
        env = {"PPR_DEFAULT_MECHANISM": "blended"}
        # the user at its cap spends it on the real graph: the app in process is enough (the
        # races below are on the sandboxes' two workers)
        with running_app(real, default_mechanism="blended") as http:
            spent = http.get("/v1/ppr/5", params={"mechanism": "friends_of_friends"},
                             headers=bearer(keys["at_cap"]))  # fmt: skip
            assert spent.status_code == 200, spent.text
            popular = http.get("/v1/ppr/5", params={"mechanism": "popular"},
                               headers=bearer(keys["at_cap"]))  # fmt: skip
            assert refused(popular)
        with open_ledger(url) as ledger:
            before = len(ledger.reports.list_charges(None, limit=10_000))
        paid: dict[str, float] = {}
        for method, out in files.items():
            node = synthetic_node(out)
            sandboxed = Backend("postgres", url, REDIS_URL, out)
            with uvicorn_server(sandboxed, workers=2, extra_env=env, forked=True) as server:
                outcomes = _race(server.base_url, node, keys)
            for response in outcomes["at_cap"]:  # nothing free: every answer refused
                if response.request.method == "GET":
                    assert refused(response), response.text
                else:
                    codes = {item["error"]["code"] for item in response.json()["items"]}
                    assert codes == {"budget_exhausted"}
            for who in ("payer", "service"):
                charged = []
                for response in outcomes[who]:
                    assert response.status_code == 200, response.text
                    body = response.json()
                    assert body["synthetic"] is True
                    items = body.get("items", [body])
                    assert all("results" in item for item in items)
                    charged += [item["epsilon_charged"] for item in items]
                assert sum(1 for e in charged if e > 0) == 1, charged  # once, whoever raced
                paid[f"{method}:{who}"] = max(charged)
        forget_cached_keys(url, REDIS_URL)
        with open_ledger(url) as ledger:
            charges = ledger.reports.list_charges(None, limit=10_000)
            assert len(charges) == before + 4  # payer and service, each release once
            assert len(ledger.reports.list_charges(ids["at_cap"], limit=100)) == 1  # its fof answer
            assert len(charges_of(ledger, ids["payer"], DEGREE_RELEASE_CHARGE)) == 1
            assert len(charges_of(ledger, ids["payer"], SYNTHETIC_RELEASE_CHARGE)) == 1
            assert paid["chung_lu:payer"] == EPS_D
            assert paid["communities:payer"] == pytest.approx(RELEASE_EPSILON)
            reads = ledger.read_figures.read_view(ids["service"])
            assert reads.releases == 2  # the degree release and the communities release
            assert ledger.budgets.budget(ids["at_cap"]).spent_epsilon <= 0.1 * (1 + 1e-9)
            report = ledger.reports.verify()
            assert report.ok, report


# -- the documents say the same, row by row -------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
#: the parties of the "who learns what" tables, by a phrase of their first cell, in order
PARTIES = {
    "anyone, with or without a key": "anyone",
    "the seed user": "seed user",
    "anyone receiving `popular`": "degree release",
    "budget period": "budget period",
    "`edge` mode": "service account, edge",
    "`personalized` mode": "service account, personalized",
    "coalition": "coalition",
    "sandbox": "sandbox",
    "admin": "admin",
    "operator": "operator",
}


def _rows(path: str, marker: str) -> dict[str, str]:
    text = (REPO / path).read_text()
    rows: dict[str, str] = {}
    for line in text[text.index(marker) :].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        who = cells[0].replace("*", "").lower()
        party = next((p for phrase, p in PARTIES.items() if phrase in who), None)
        if party is not None:
            rows[party] = " ".join(cells[1:]).lower()
    return rows


def test_the_who_learns_what_tables_agree_row_by_row() -> None:
    readme = _rows("README.md", "**Who learns what:**")
    privacy = _rows("docs/privacy.md", "## 2. Who learns what")
    assert list(readme) == list(privacy) == list(PARTIES.values())
    for rows in (readme, privacy):
        assert "synthetic release" in rows["seed user"]  # its cap counts everything it receives
        for party in ("service account, edge", "service account, personalized"):
            assert "sandbox" in rows[party] and "read figure" in rows[party]
        assert "once" in rows["sandbox"] and "budget_exhausted" in rows["sandbox"]
        assert "chung_lu" in rows["sandbox"] and "chung_lu" in rows["degree release"]
        assert "charging off" not in rows["sandbox"] and "free" not in rows["sandbox"]
        assert "renewal weakens the lifetime promise" in rows["budget period"]
    synthetic = (REPO / "docs/synthetic.md").read_text()
    sandbox = synthetic[synthetic.index("## The sandbox") :]
    sandbox = sandbox[: sandbox.index("\n## ", 1)]
    assert "charging off" not in synthetic and "epsilon_charged: 0`;" not in sandbox
    assert "Each account pays for the release once" in sandbox
    users = next(
        line for line in synthetic.splitlines() if line.startswith("| users and service accounts")
    )
    assert "pays for the release once" in users and "read figure" in users


# -- the ledger ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ledger_url", ["sqlite", "postgres"], indirect=True)
def test_the_database_keeps_one_charge_per_account_and_release(ledger: Ledger) -> None:
    """Admitted twice: one charge; a second live row for the same account and release is
    refused by the unique index; ``ledger verify`` checks that each names its live release."""
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    from service.ledger import SyntheticCharge
    from service.privacy.curves import laplace_curve

    user = ledger.accounts.create_account(
        "user", node_id="1", cap_epsilon=1.0, delta=DELTA
    ).account_id
    name = "synthetic:communities:test"
    ledger.graph_releases.graph_release(
        "v1", name, epsilon=0.5, curve=laplace_curve(0.5), draw=lambda: b"x"
    )
    release = SyntheticCharge("v1", name)
    for charged in (True, False):
        receipt = ledger.quota_and_degree.admit_synthetic_release(
            charged_account_id=user, principal_account_id=user, seed="1", mode="edge",
            release=release, request_id="r",
        )  # fmt: skip
        assert receipt.charged is charged and receipt.epsilon == 0.5
    (paid,) = charges_of(ledger, user, SYNTHETIC_RELEASE_CHARGE)
    assert ledger.reports.verify().ok
    with ledger.engine.begin() as conn:
        row = conn.execute(text("SELECT * FROM charges WHERE id = :i"), {"i": paid.charge_id})
        values = dict(row.mappings().one())
        values.pop("id")
        # nested: only this insert is rolled back
        with pytest.raises(IntegrityError), conn.begin_nested():
            conn.execute(
                text(f"INSERT INTO charges ({', '.join(values)}) "
                     f"VALUES ({', '.join(':' + k for k in values)})"),
                values,
            )  # fmt: skip
        conn.execute(
            text("UPDATE charges SET graph_release_id = NULL WHERE id = :i"), {"i": paid.charge_id}
        )
    report = ledger.reports.verify()
    details = [m.get("detail") for m in report.mismatches]
    assert (
        not report.ok and "synthetic-release charge that names no released graph release" in details
    )
