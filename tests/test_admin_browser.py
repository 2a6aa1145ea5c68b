"""The admin dashboard in a real browser: Debian's headless Chromium driven by Playwright
against a real ``python -m service serve`` (uvicorn) on SQLite, with every request that is not
to this server aborted (so the page and /docs must work offline).

Screenshots go to ``test-artifacts/browser/`` at the repository root (printed at the end of the
run; .gitignore excludes the directory).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    bearer,
    open_ledger,
    uvicorn_server,
)

playwright_sync = pytest.importorskip("playwright.sync_api")

expect = playwright_sync.expect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "browser"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian's chromium is missing (apt-get install chromium)"
)


def _shot(page: Any, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


class Seeded:
    def __init__(self, database_url: str) -> None:
        with open_ledger(database_url) as ledger:
            admin = ledger.accounts.create_account(
                "admin", cap_epsilon=1.0, delta=1e-6, label="ops"
            )
            self.admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
            self.users: dict[str, tuple[int, str]] = {}
            for node in ("17", "18", "19", "20", "21", "22"):
                user = ledger.accounts.create_account(
                    "user", node_id=node, cap_epsilon=2.0, delta=1e-6, label=f"member {node}"
                )
                key, _ = ledger.api_keys.create_api_key(user.account_id)
                self.users[node] = (user.account_id, key)
            # node 20 has a daily cap besides its lifetime cap: its page shows both figures
            ledger.budgets.set_period(self.users["20"][0], period="day", period_cap_epsilon=1.0)
            for node, cap in (("23", 0.5), ("24", 0.6)):  # near their caps, at two rates
                user = ledger.accounts.create_account(
                    "user", node_id=node, cap_epsilon=cap, delta=1e-6, label=f"member {node}"
                )
                key, _ = ledger.api_keys.create_api_key(user.account_id)
                self.users[node] = (user.account_id, key)
            service = ledger.accounts.create_account(
                "service", cap_epsilon=5.0, delta=1e-6, label="recommender",
                modes=("edge", "personalized"),
            )  # fmt: skip
            self.service_key, _ = ledger.api_keys.create_api_key(service.account_id)
            self.service_id = service.account_id
        self.synthesis_job = ""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Seeded]]:
    graph_path = tmp_path / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    seeded = Seeded(url)
    backend = Backend("sqlite", url, None, graph_path)
    with uvicorn_server(backend, extra_env={"PPR_GRAPH_CAP_EPSILON": "10"}, forked=True) as server:
        base = server.base_url
        with httpx.Client(base_url=base, timeout=30) as http:
            for node, epsilons in (("19", [0.2, 0.2, 0.3, 0.1, 0.25] + [0.05] * 12), ("20", [0.5]),
                                   ("21", [0.9, 0.9]), ("23", [0.45]),
                                   ("24", [0.1] * 5)):  # fmt: skip
                for eps in epsilons:
                    response = http.get(
                        f"/v1/ppr/{node}", params={"epsilon": eps, "fresh": "true"},
                        headers=bearer(seeded.users[node][1]),
                    )  # fmt: skip
                    assert response.status_code == 200, response.text
            response = http.get(
                "/v1/ppr/22", params={"epsilon": 0.1}, headers=bearer(seeded.service_key)
            )
            assert response.status_code == 200, response.text
            refused = http.get(
                "/v1/ppr/21", params={"epsilon": 0.5, "fresh": "true"},
                headers=bearer(seeded.users["21"][1]),
            )  # fmt: skip
            assert refused.status_code == 403  # budget_exhausted: shows in refusals
            started = http.post(
                "/v1/admin/synthetic", json={"method": "communities", "epsilon": 1.0},
                headers=bearer(seeded.admin_key),
            )  # fmt: skip
            assert started.status_code == 202, started.text
            seeded.synthesis_job = started.json()["job_id"]
            for _ in range(3000):
                job = http.get(
                    f"/v1/admin/synthetic/{seeded.synthesis_job}", headers=bearer(seeded.admin_key)
                ).json()
                if job["state"] != "running":
                    break
                time.sleep(0.02)
            assert job["state"] == "done", job
        yield base, seeded


@pytest.mark.slow
def test_admin_dashboard_in_chromium(served: tuple[str, Seeded]) -> None:
    base, seeded = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    local = urlparse(base).netloc
    blocked: list[str] = []
    problems: list[str] = []

    def only_this_server(route: Any) -> None:
        if urlparse(route.request.url).netloc == local:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            context.route("**/*", only_this_server)
            page = context.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            paths: list[str] = []
            page.on("request", lambda r: paths.append(urlparse(r.url).path))

            # sign-in: a user key is refused with a clear message
            page.goto(f"{base}/admin")
            page.fill("#api-key", seeded.users["17"][1])
            page.click("#sign-in-form button[type=submit]")
            error = page.locator("#sign-in-error")
            error.wait_for(state="visible")
            assert "needs an admin API key" in error.inner_text()
            assert page.evaluate("sessionStorage.length") == 0
            problems.clear()  # the refused sign-in's 403 is logged by the browser
            _shot(page, "01-sign-in-refused")

            page.fill("#api-key", seeded.admin_key)
            page.click("#sign-in-form button[type=submit]")
            page.wait_for_selector("#overview #chart-queries svg rect", state="attached")
            page.wait_for_selector("#chart-exposure-mini svg path.series", state="attached")
            assert page.evaluate("sessionStorage.getItem('ppr.adminKey')") == seeded.admin_key
            assert page.evaluate("localStorage.length") == 0
            assert "budget_exhausted" in page.locator("#refusals").inner_text()
            assert "admin #" in page.locator("#who").inner_text()
            assert page.locator("#cache-rates tbody tr").count() == 4
            # accounts near their cap, sorted by when they run out at their last 7 days' rate
            soon = page.locator("#run-out tbody tr[data-account]")
            assert soon.count() >= 2
            dates = [
                soon.nth(i).locator("[data-testid=runs-out-on]").inner_text()
                for i in range(soon.count())
            ]
            assert all(re.match(r"\d{4}-\d{2}-\d{2} \(in ", d) for d in dates), dates
            assert [d[:10] for d in dates] == sorted(d[:10] for d in dates)
            shown = {
                int(soon.nth(i).get_attribute("data-account") or 0) for i in range(soon.count())
            }
            assert {seeded.users["23"][0], seeded.users["24"][0]} <= shown
            assert "composed by the RDP accountant" in page.locator("#run-out-note").inner_text()
            _shot(page, "02-overview")

            # find an account by filtering, then open it
            page.click("#nav a[data-view=accounts]")
            page.wait_for_selector("#account-results table")
            page.fill("#filter-q", "19")
            page.click("#apply-filters")
            account_id = seeded.users["19"][0]
            row = page.locator(f"#account-results tr[data-account='{account_id}']")
            row.wait_for()
            expect(page.locator("[data-testid=page-info]").first).to_have_text("1–1 of 1")
            assert page.locator("#account-results tbody tr").count() == 1
            _shot(page, "03-accounts-filtered")
            row.locator("a").first.click()

            # the account page: both curves, then a cap change with a confirmation step
            for series in ("composed (RDP accountant)", "naive sum of per-query ε"):
                page.wait_for_selector(
                    f"#chart-curve path[data-series='{series}']", state="attached"
                )
            runs_out = page.locator("#account-run-out")
            expect(runs_out).to_contain_text("Runs out on: ")
            expect(runs_out).to_contain_text("17 charges")
            note = page.locator("#curve-note").inner_text()
            assert "17 live charges" in note and "composition saves" in note
            with httpx.Client(base_url=base) as http:
                budget = http.get(
                    f"/v1/admin/accounts/{account_id}", headers=bearer(seeded.admin_key)
                ).json()["budget"]
            page.fill("#cap-input", "3.5")
            page.click("#budget-review")
            page.wait_for_selector("#budget-confirmation")
            assert "remaining would be" in page.locator("#budget-confirmation").inner_text()
            _shot(page, "04-account-confirm-cap")
            page.click("#budget-confirm")
            page.wait_for_selector("#budget-saved")
            expected = f"{3.5 - budget['spent_epsilon']:.4f}"
            assert page.locator("[data-testid=remaining-value]").inner_text() == expected
            assert expected in page.locator("#budget-saved").inner_text()
            assert "cap ε 3.5" in page.locator("#chart-curve").inner_text()  # redrawn
            page.click("#issue-key")
            new_key = page.locator("#new-key-value")
            new_key.wait_for()
            assert new_key.input_value().startswith("ppr_") or len(new_key.input_value()) > 20
            page.locator("#charges tbody tr").first.wait_for()
            assert page.locator("#charges tbody tr").count() == 17
            _shot(page, "05-account-page")

            # a cap below the spend is allowed and flagged
            page.fill("#cap-input", "0.2")
            page.click("#budget-review")
            page.wait_for_selector("#budget-confirmation .warn-text")
            page.click("#budget-confirm")
            page.wait_for_selector("#budget-saved")
            assert "cap below spent" in page.locator("#budget-saved").inner_text()
            assert page.locator("[data-testid=remaining-value]").inner_text() == "0.0000"

            # an account with a daily period: the lifetime figure and the day's side by side
            page.goto(f"{base}/admin#/accounts/{seeded.users['20'][0]}")
            period = page.locator("#period-spent")
            period.wait_for()
            stats = page.locator("#budget-stats").inner_text()
            assert "Lifetime spent ε (composed)" in stats and "This day: spent ε" in stats
            shown = period.inner_text()
            assert "0.5000" in shown and "of its cap 1.0000; renews" in shown
            _shot(page, "05b-account-period")

            # a service account: its modes, quota and what it charged to others
            page.goto(f"{base}/admin#/accounts/{seeded.service_id}")
            usage = page.locator("#service-usage")
            usage.wait_for()
            assert "edge, personalized" in usage.inner_text()
            text = usage.inner_text()  # one charge, to the seed user of node 22
            assert "1 charge · " in text and "1 account" in text
            page.locator("#charges-made tbody tr").first.wait_for()
            _shot(page, "06-service-account")

            # the exposure view
            page.click("#nav a[data-view=exposure]")
            page.wait_for_selector("#chart-exposure svg path.series", state="attached")
            assert page.locator("#exposure-modes tbody tr").count() >= 1
            assert "cap ε 10" in page.locator("#chart-exposure").inner_text()
            run = page.locator(f"#exposure-synthesis tr[data-job='{seeded.synthesis_job}']")
            expect(run).to_contain_text("communities")
            expect(run).to_contain_text("edge-level DP")
            _shot(page, "07-exposure")

            # the synthesis runs, and a run's file downloaded
            page.click("#nav a[data-view=synthesis]")
            run = page.locator(f"#synthesis-runs tr[data-job='{seeded.synthesis_job}']")
            expect(run).to_contain_text("done")
            expect(run).to_contain_text("released")
            with page.expect_download() as got:
                run.locator("button.download").click()
            downloaded = Path(got.value.path())
            assert downloaded.read_text().count("\n") > 100  # an edge list
            _shot(page, "07b-synthesis")

            # the audit log, filtered
            page.click("#nav a[data-view=audit]")
            page.wait_for_selector("#audit-results table")
            page.select_option("#audit-action", "budget.set")
            page.click("#audit-filters button[type=submit]")
            # the two cap changes above, and node 20's daily period set up
            expect(page.locator("[data-testid=page-info]").first).to_have_text("1–3 of 3")
            _shot(page, "08-audit-log")

            assert problems == [], problems  # no CSP violation, no script error
            # the page uses its own assets and the admin API, nothing else
            assert all(p.startswith(("/admin", "/v1/admin/")) for p in paths), set(paths)
            page.click("#sign-out")
            page.locator("#sign-in").wait_for(state="visible")
            assert page.evaluate("sessionStorage.length") == 0

            # /docs renders with the network blocked
            docs = context.new_page()
            docs.goto(f"{base}/docs")
            docs.wait_for_selector(".swagger-ui .info .title")
            docs.get_by_text("/v1/admin/account-table", exact=True).first.wait_for()
            title = docs.locator(".swagger-ui .info .title").inner_text()
            assert "DP personalized PageRank" in title
            docs.screenshot(path=str(ARTIFACTS / "09-docs-offline.png"))
            redoc = context.new_page()
            redoc.goto(f"{base}/redoc")
            redoc.get_by_text("/v1/admin/account-table").first.wait_for(
                state="attached", timeout=30000
            )
            redoc.screenshot(path=str(ARTIFACTS / "10-redoc-offline.png"))
            assert blocked == [], f"requests left this machine: {blocked}"
        finally:
            browser.close()
    print(f"\nscreenshots: {ARTIFACTS}")
