"""``GET /v1/embeddings/similar/{node}`` on SQLite and on PostgreSQL + Redis: service accounts
with `edge` mode get the nearest neighbours from the served version's all-node release, free
and counted once in their read figure; users and other scopes are refused; bad input is a 4xx
with a stable code and charges nothing; a new release is picked up by the next answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.embeddings.all_node_release import EmbeddingRequest, release_embeddings
from service.ledger.ledger import Ledger
from tests.api_support import Backend, bearer, ledger_of, running_app, user_with_key
from tests.test_api import backend  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("backend")


def _release(client: TestClient, out: Path, epsilon: float = 1.0) -> str:
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    release = release_embeddings(
        runtime.ledger, runtime.graphs.current, EmbeddingRequest(epsilon, 16, 1e-2, 3), out,
        cap=None, rng_factory=np.random.default_rng,
    )  # fmt: skip
    return release.release_name


def _service_key(ledger: Ledger, modes: tuple[str, ...] = ("edge", "personalized")) -> str:
    account = ledger.accounts.create_account("service", cap_epsilon=5.0, delta=1e-6, modes=modes)
    key, _ = ledger.api_keys.create_api_key(account.account_id)
    return key


@pytest.fixture
def app_with_dir(backend: Backend, tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:  # noqa: F811
    out = tmp_path / "embeddings"
    out.mkdir()
    with running_app(backend, embedding_release_dir=out, max_k=300) as client:
        yield client, out


def test_service_account_gets_neighbours_free(app_with_dir: tuple[TestClient, Path]) -> None:
    client, out = app_with_dir
    ledger = ledger_of(client)
    key = _service_key(ledger)
    path = "/v1/embeddings/similar/3"
    missing = client.get(path, headers=bearer(key))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "no_embedding_release"
    name = _release(client, out)
    before = ledger.reports.exposure(delta=1e-6)
    answer = client.get(path, params={"k": 7}, headers=bearer(key))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["results"]) == 7 and "3" not in {r["node"] for r in body["results"]}
    similarities = [r["similarity"] for r in body["results"]]
    assert similarities == sorted(similarities, reverse=True)
    assert body["release"]["name"] == name and body["release"]["mode"] == "edge"
    assert body["epsilon_charged"] == 0.0 and "free" in body["cost"]
    assert body["graph_version"] == body["release"]["graph_version"]
    again = client.get(path, params={"k": 7}, headers=bearer(key))
    assert again.status_code == 200
    after = ledger.reports.exposure(delta=1e-6)
    assert (after.epsilon, after.graph_releases) == (before.epsilon, before.graph_releases)
    reads = client.get("/v1/me/reads", headers=bearer(key)).json()
    assert reads["releases"] == 1  # the release, once, however many answers
    admin = ledger.accounts.create_account("admin", cap_epsilon=1.0, delta=1e-6)
    admin_key, _ = ledger.api_keys.create_api_key(admin.account_id)
    shown = client.get("/v1/admin/exposure", headers=bearer(admin_key)).json()
    assert shown["graph_releases"] == 1  # the dashboard's "Graph-wide releases"
    assert shown["epsilon"] == pytest.approx(after.epsilon)
    # a new release replaces the old one in the next answer
    newer = _release(client, out, epsilon=2.0)
    assert newer != name
    assert client.get(path, headers=bearer(key)).json()["release"]["name"] == newer
    assert ledger.reports.verify().ok


def test_refusals_have_stable_codes_and_charge_nothing(
    app_with_dir: tuple[TestClient, Path],
    backend: Backend,  # noqa: F811
) -> None:
    client, out = app_with_dir
    ledger = ledger_of(client)
    _release(client, out)
    before = ledger.reports.exposure(delta=1e-6)
    key = _service_key(ledger)
    personal_only = _service_key(ledger, modes=("personalized",))
    _, user_key = user_with_key(backend.database_url, "3")
    cases = [
        (user_key, "/v1/embeddings/similar/3", {}, 403, "forbidden"),
        (personal_only, "/v1/embeddings/similar/3", {}, 403, "mode_not_allowed"),
        (key, "/v1/embeddings/similar/no-such-node", {}, 404, "unknown_node"),
        (key, "/v1/embeddings/similar/3", {"k": "0"}, 422, "invalid_parameter"),
        (key, "/v1/embeddings/similar/3", {"k": "10001"}, 422, "invalid_parameter"),
        (key, "/v1/embeddings/similar/3", {"k": "301"}, 422, "invalid_parameter"),  # > PPR_MAX_K
        (key, "/v1/embeddings/similar/3", {"k": "1.5"}, 422, "invalid_parameter"),
        (key, "/v1/embeddings/similar/3", {"k": " 5"}, 422, "invalid_parameter"),
        (key, "/v1/embeddings/similar/a%20b", {}, 422, "invalid_parameter"),
        ("", "/v1/embeddings/similar/3", {}, 401, "unauthorized"),
    ]
    for who, path, params, status, code in cases:
        headers = bearer(who) if who else {}
        response = client.get(path, params=params, headers=headers)
        assert response.status_code == status, (path, params, response.text)
        assert response.json()["error"]["code"] == code, (path, params, response.text)
    after = ledger.reports.exposure(delta=1e-6)
    assert (after.epsilon, after.charges) == (before.epsilon, before.charges)
    reads = client.get("/v1/me/reads", headers=bearer(key)).json()
    assert reads["releases"] == 0  # refused answers reveal nothing of the release


def test_release_for_another_version_is_not_served(
    backend: Backend,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "embeddings"
    out.mkdir()
    with running_app(backend, embedding_release_dir=out) as client:
        ledger = ledger_of(client)
        runtime = client.app.state.runtime  # type: ignore[attr-defined]
        graph = runtime.graphs.current
        import dataclasses

        other = dataclasses.replace(graph, version="another-version")
        release_embeddings(ledger, other, EmbeddingRequest(1.0, 8, 1e-2, 3), out, cap=None,
                           rng_factory=np.random.default_rng)  # fmt: skip
        response = client.get("/v1/embeddings/similar/3", headers=bearer(_service_key(ledger)))
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "no_embedding_release"
        assert "another-version" in response.json()["error"]["message"]
