"""The sandbox (SQLite; PostgreSQL + Redis): a synthetic release served as exact answers, every
answer marked ``synthetic: true``, the release charged once to each account that receives one
(tests/test_sandbox_charges.py: the charge itself); ``serve`` refuses a file the ledger does
not know as a synthetic release; answers of a normal service never carry the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.cli import main
from service.graph.loader import load_edge_list
from service.synthetic.release import Request, synthesize_release
from tests.api_support import Backend, bearer, ledger_of, open_ledger, running_app
from tests.test_api import Accounts, backend  # fixtures by name


def _publish(backend: Backend, out: Path) -> None:
    with open_ledger(backend.database_url) as ledger:
        graph = load_edge_list(backend.graph_path)
        synthesize_release(ledger, graph, Request("communities", 0.5), out, cap=None,
                           rng_factory=np.random.default_rng)  # fmt: skip


def test_a_synthetic_release_is_served_as_a_sandbox(backend: Backend, tmp_path: Path) -> None:
    out = tmp_path / "synthetic.txt"
    _publish(backend, out)
    node = out.read_text().split()[0]
    with running_app(backend) as client:  # the real graph: no synthetic field anywhere
        accounts = Accounts(client)
        _, service_key = accounts.service()
        real = client.get(f"/v1/ppr/{node}", params={"mode": "edge"}, headers=bearer(service_key))
        assert real.status_code == 200, real.text
        assert "synthetic" not in real.json() and real.json()["epsilon_charged"] > 0
        batch = client.post("/v1/ppr/batch", json={"nodes": [node], "mode": "edge"},
                            headers=bearer(service_key))  # fmt: skip
        assert batch.status_code == 200 and "synthetic" not in batch.json()
        before = ledger_of(client).reports.exposure(delta=1e-5)
        charges = len(ledger_of(client).reports.list_charges(None, limit=1000))
    with running_app(backend, graph_path=out, graph_is_synthetic=True) as client:
        ledger = ledger_of(client)
        answer = client.get(f"/v1/ppr/{node}", params={"mode": "edge", "k": 5},
                            headers=bearer(service_key))  # fmt: skip
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["synthetic"] is True and body["epsilon_charged"] == body["mechanism"]["epsilon"]
        assert body["mechanism"]["name"] == "synthetic_exact" and len(body["results"]) == 5
        batch = client.post("/v1/ppr/batch", json={"nodes": [node, "nope"], "mode": "edge"},
                            headers=bearer(service_key))  # fmt: skip
        got = batch.json()
        assert got["synthetic"] is True and got["epsilon_charged"] == 0.0  # paid already
        assert got["items"][0]["results"] and got["items"][1]["error"]["code"] == "unknown_node"
        admin = bearer(accounts.admin_key)
        assert client.get(f"/v1/ppr/{node}", headers=admin).status_code == 403
        reload = client.post("/v1/admin/graph/reload", json={}, headers=admin)
        assert reload.status_code == 409, reload.text
        again = client.post("/v1/admin/synthetic", json={"epsilon": 1.0}, headers=admin)
        assert again.status_code == 409, again.text
        assert (
            len(ledger.reports.list_charges(None, limit=1000)) == charges + 1
        )  # the release, once
        after = ledger.reports.exposure(delta=1e-5)  # counted there once already, at synthesis
        assert (after.epsilon, after.charges) == (before.epsilon, before.charges)
        assert ledger.reports.verify().ok


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_serve_refuses_a_file_that_is_not_a_known_synthetic_release(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "synthetic.txt"
    _publish(backend, out)
    edited = tmp_path / "edited.txt"
    edited.write_text(out.read_text() + "n0 n1\n")  # one edge more: another file
    monkeypatch.setenv("PPR_DATABASE_URL", backend.database_url)
    monkeypatch.setenv("PPR_GRAPH_IS_SYNTHETIC", "true")
    for path in (backend.graph_path, edited):
        assert main(["serve", "--graph", str(path), "--port", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error [not_a_synthetic_release]"), err
    # without the setting, serve recognises a known release (and only that) as a sandbox
    from service.cli.serve import check_synthetic_release

    plain = backend.settings(graph_is_synthetic=False)
    assert check_synthetic_release(plain.model_copy(update={"graph_path": out}))
    for path in (backend.graph_path, edited):
        assert not check_synthetic_release(plain.model_copy(update={"graph_path": path}))
    # and a worker started some other way does not start either
    with (
        pytest.raises(Exception, match="not a synthetic release"),
        running_app(backend, graph_path=edited, graph_is_synthetic=True),
    ):
        pass
