"""Strict parsing and a schema that tells the truth.

* Values are read exactly as written: node ids (never trimmed into another id), plain decimal
  numbers, the JSON types the schema names, one Authorization header; bodies labelled JSON.
* Every limit the OpenAPI document declares is the one the server enforces (each is probed at
  the limit and one step past it), the one in docs/api.md's table, and the one its prose says.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from tests.api_support import Backend, bearer, ledger_of, running_app
from tests.test_api import Accounts, backend, charge_count  # fixtures by name

ROOT = Path(__file__).resolve().parents[1]
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.fixture
def client(backend: Backend) -> Iterator[TestClient]:
    with running_app(backend) as client:
        yield client


def refused(response: Any, status: int, code: str, parameter: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, response.text
    if parameter is not None:
        assert error["details"]["parameter"] == parameter, response.text


# -- strict parsing ------------------------------------------------------------------------


@sqlite_only
def test_node_ids_are_taken_exactly_as_given(client: TestClient) -> None:
    accounts = Accounts(client)
    _, user_key = accounts.user("7")
    _, service_key = accounts.service(modes=["edge"], cap_epsilon=10.0)
    for path in ["7%0A", "7%20", "%207", "7%09", "7%0D", "7%0B", "7%0C", "7%2C", "7%0A%0A"]:
        response = client.get(f"/v1/ppr/{path}", headers=bearer(user_key))
        assert response.status_code in (404, 422), (path, response.text)  # never node 7
        if response.status_code == 422:
            assert response.json()["error"]["details"]["parameter"] == "node_id"
    for node in ["7\n", " 7", "7,8"]:
        body = {"nodes": [node], "mode": "edge"}
        answer = client.post("/v1/ppr/batch", json=body, headers=bearer(service_key))
        refused(answer, 422, "invalid_parameter", "nodes.0")
    assert charge_count(client) == 0
    # the id itself still answers, and an id of exactly 1024 bytes is a (here unknown) node
    assert client.get("/v1/ppr/7", headers=bearer(user_key)).status_code == 200
    at_limit = "é" * 512
    edge = {"mode": "edge"}
    answer = client.get(f"/v1/ppr/{at_limit}", params=edge, headers=bearer(service_key))
    refused(answer, 404, "unknown_node")
    past = "é" * 512 + "a"  # 513 characters, 1025 bytes
    answer = client.get(f"/v1/ppr/{past}", params=edge, headers=bearer(service_key))
    refused(answer, 422, "invalid_parameter", "node_id")
    body = {"nodes": [past], "mode": "edge"}
    refused(client.post("/v1/ppr/batch", json=body, headers=bearer(service_key)), 422,
            "invalid_parameter", "nodes.0")  # fmt: skip


@sqlite_only
def test_numbers_are_plain_decimals(client: TestClient) -> None:
    accounts = Accounts(client)
    admin = bearer(accounts.admin_key)
    _, user_key = accounts.user("7")
    for params in [{"epsilon": " 0.1"}, {"epsilon": "0.1 "}, {"epsilon": "nan"},
                   {"epsilon": "inf"}, {"k": " 5"}, {"k": "5.5"}, {"k": "+5"}]:  # fmt: skip
        name = next(iter(params))
        answer = client.get("/v1/ppr/7", params=params, headers=bearer(user_key))
        refused(answer, 422, "invalid_parameter", name)
    assert charge_count(client) == 0
    key_ids = [k.key_id for k in ledger_of(client).api_keys.list_api_keys(2)]
    for given in ["1.5", "%20 1", "%0C3", "3%20", "+1", "01", "1_0", "0x1", "%EF%BC%91", "1e0"]:
        refused(client.get(f"/v1/admin/accounts/{given}", headers=admin), 422,
                "invalid_parameter", "account_id")  # fmt: skip
        revoke = client.post(f"/v1/admin/keys/{given}/revoke", headers=admin)
        refused(revoke, 422, "invalid_parameter", "key_id")
    assert all(k.revoked_at is None for k in ledger_of(client).api_keys.list_api_keys(2)), key_ids
    refused(client.get("/v1/admin/accounts", params={"limit": "10 "}, headers=admin), 422,
            "invalid_parameter", "limit")  # fmt: skip
    assert client.get("/v1/admin/accounts/2", headers=admin).status_code == 200
    assert client.get("/v1/admin/exposure?delta=1e-6", headers=admin).status_code == 200


@sqlite_only
def test_an_integer_written_with_a_zero_fraction_is_that_integer(client: TestClient) -> None:
    """JSON Schema counts 215.0 as an integer, so a client following the OpenAPI document's
    ``integer`` may send it (schemathesis did): body, query and path take it as 215."""
    accounts = Accounts(client)
    admin = bearer(accounts.admin_key)
    user_id, user_key = accounts.user("7", cap_epsilon=10.0)
    _, service_key = accounts.service(modes=["edge"], cap_epsilon=10.0)
    first = client.get("/v1/ppr/7", params={"k": "5"}, headers=bearer(user_key))
    again = client.get("/v1/ppr/7", params={"k": "5.0"}, headers=bearer(user_key))
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["replayed"] and len(again.json()["results"]) == 5
    body = {"nodes": ["7"], "mode": "edge", "k": 5.0}
    batch = client.post("/v1/ppr/batch", json=body, headers=bearer(service_key))
    assert batch.status_code == 200 and len(batch.json()["items"][0]["results"]) == 5
    embedded = client.post(
        "/v1/embeddings/batch", json={**body, "k": 8.0}, headers=bearer(service_key)
    )
    assert embedded.status_code == 200, embedded.text
    assert len(embedded.json()["items"][0]["embedding"]) == 8
    assert client.get(f"/v1/admin/accounts/{user_id}.0", headers=admin).status_code == 200
    listed = client.get("/v1/admin/accounts", params={"limit": "2.00"}, headers=admin)
    assert listed.status_code == 200, listed.text


@sqlite_only
def test_every_unparsable_body_is_malformed_json(client: TestClient) -> None:
    accounts = Accounts(client)
    _, key = accounts.service(modes=["edge"])
    headers = {**bearer(key), "Content-Type": "application/json"}
    deep = b"[" * 100_000 + b"]" * 100_000
    bodies = [deep, b'{"nodes": ' + deep + b"}", b'{"nodes": ["\xff\xfe"]}', b'{"nodes": [',
              b'{"nodes": ["7"]} trailing', b"\xff\xfe\x00"]  # fmt: skip
    for raw in bodies:
        for path in ("/v1/ppr/batch", "/v1/embeddings/batch"):
            answer = client.post(path, content=raw, headers=headers)
            refused(answer, 400, "malformed_json")
            assert answer.json()["error"]["message"].startswith("the body is not valid JSON")
    assert charge_count(client) == 0


@sqlite_only
def test_error_bodies_quote_at_most_64_characters_of_what_was_sent(client: TestClient) -> None:
    """A 900,000-byte node id in a batch used to come back whole in its 422 (900,144 bytes),
    a 16,000-character path id too: every echoed value is cut to 64 characters and its
    length, and no error body grows with what was sent."""
    accounts = Accounts(client)
    _, user_key = accounts.user("7")
    _, service_key = accounts.service(modes=["edge"])
    huge = "x" * 900_000
    answers = {
        "ppr batch": client.post("/v1/ppr/batch", json={"nodes": ["7", huge], "mode": "edge"},
                                 headers=bearer(service_key)),
        "embedding batch": client.post("/v1/embeddings/batch",
                                       json={"nodes": ["7", huge], "mode": "edge"},
                                       headers=bearer(service_key)),
        "path": client.get("/v1/ppr/" + "y" * 16_000, headers=bearer(user_key)),
        "embedding path": client.get("/v1/embeddings/" + "y" * 16_000, headers=bearer(user_key)),
        "query": client.get("/v1/ppr/7", params={"k": "9" * 15_000}, headers=bearer(user_key)),
        "extra field": client.post("/v1/ppr/batch", json={"nodes": ["7"], "z" * 500_000: 1},
                                   headers=bearer(service_key)),
        "no route": client.get("/v1/" + "q" * 15_000, headers=bearer(user_key)),
        "content type": client.post("/v1/ppr/batch", content=b"{}", headers={
            **bearer(service_key), "Content-Type": "text/" + "p" * 20_000}),
    }  # fmt: skip
    for name, answer in answers.items():
        assert 400 <= answer.status_code < 500, (name, answer.status_code)
        assert len(answer.content) < 600, (name, len(answer.content), answer.text[:200])
        error = answer.json()["error"]
        assert error["code"] and error["message"], name
    message = answers["ppr batch"].json()["error"]["message"]
    assert "'" + "x" * 64 + "'... (900000 characters)" in message
    assert answers["ppr batch"].json()["error"]["details"] == {"parameter": "nodes.1"}
    assert "(16000 characters)" in answers["path"].json()["error"]["message"]
    assert charge_count(client) == 0


@sqlite_only
def test_json_bodies_take_exactly_the_types_the_schema_names(client: TestClient) -> None:
    accounts = Accounts(client)
    _, key = accounts.service(modes=["edge"])
    base: dict[str, Any] = {"nodes": ["7"], "mode": "edge"}
    wrong = [("k", True), ("k", 3.5), ("k", "3"), ("fresh", 1), ("fresh", "true"),
             ("exclude_neighbors", 0), ("epsilon", "0.1"), ("epsilon", True)]  # fmt: skip
    for field, value in wrong:
        answer = client.post("/v1/ppr/batch", json={**base, field: value}, headers=bearer(key))
        refused(answer, 422, "invalid_parameter", field)
    refused(client.post("/v1/ppr/batch", json={**base, "nodes": [7]}, headers=bearer(key)),
            422, "invalid_parameter", "nodes.0")  # fmt: skip
    assert charge_count(client) == 0
    good = {**base, "k": 3, "fresh": True, "epsilon": 0.1}
    answer = client.post("/v1/ppr/batch", json=good, headers=bearer(key))
    assert answer.status_code == 200 and len(answer.json()["items"][0]["results"]) == 3
    admin = bearer(accounts.admin_key)
    for body in [{"type": "user", "node_id": 7}, {"type": "service", "cap_epsilon": "2"},
                 {"type": "service", "may_create_seed_accounts": 1}]:  # fmt: skip
        refused(client.post("/v1/admin/accounts", json=body, headers=admin), 422,
                "invalid_parameter")  # fmt: skip


@sqlite_only
def test_exactly_one_authorization_header(client: TestClient) -> None:
    accounts = Accounts(client)
    _, key = accounts.user("7")
    _, other = accounts.user("8")
    for pair in [(key, key), (key, other), (key, "x" * 30)]:
        headers = [("Authorization", f"Bearer {k}") for k in pair]
        answer = client.get("/v1/ppr/7", headers=headers)
        refused(answer, 400, "duplicate_header")
        assert answer.json()["error"]["details"]["header"] == "Authorization"
    idem = [("Authorization", f"Bearer {key}"), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    refused(client.get("/v1/ppr/7", headers=idem), 400, "duplicate_header")
    assert charge_count(client) == 0
    assert client.get("/v1/ppr/7", headers=bearer(key)).status_code == 200


@sqlite_only
def test_bodies_need_a_json_content_type(client: TestClient) -> None:
    """Every operation with a body refuses one without `Content-Type: application/json` with
    415, naming the header (before anything is charged or changed)."""
    accounts = Accounts(client)
    admin = bearer(accounts.admin_key)
    service_id, service_key = accounts.service(modes=["edge"])
    schema = client.get("/openapi.json").json()
    with_body = [
        (method, path)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if "requestBody" in operation
    ]
    assert len(with_body) >= 6, with_body
    for method, path in with_body:
        url = path.replace("{account_id}", str(service_id))
        headers = bearer(service_key if "/ppr/" in url else accounts.admin_key)
        for content_type in [None, "text/plain", "application/x-www-form-urlencoded"]:
            sent = {**headers, **({"Content-Type": content_type} if content_type else {})}
            answer = client.request(method.upper(), url, content=b"{}", headers=sent)
            refused(answer, 415, "unsupported_media_type")
            assert "Content-Type: application/json" in answer.json()["error"]["message"]
        assert "415" in schema["paths"][path][method]["responses"], (method, path)
    assert charge_count(client) == 0
    body = b'{"nodes": ["7"], "mode": "edge"}'
    for content_type in ["application/json", "application/json; charset=utf-8"]:
        sent = {**bearer(service_key), "Content-Type": content_type}
        assert client.post("/v1/ppr/batch", content=body, headers=sent).status_code == 200
    assert client.post("/v1/admin/graph/reload", headers=admin).status_code == 200  # no body


@sqlite_only
def test_methods_and_tags_are_listed_once(client: TestClient) -> None:
    accounts = Accounts(client)
    _, key = accounts.service(modes=["edge"])
    for method in ["OPTIONS", "GET", "PUT"]:
        answer = client.request(method, "/v1/ppr/batch", headers=bearer(key))
        refused(answer, 405, "method_not_allowed")
        assert answer.headers["Allow"] == "POST"
    schema = client.get("/openapi.json").json()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert len(operation.get("tags", [])) == 1, (method, path, operation.get("tags"))


# -- the schema is the truth ----------------------------------------------------------------


def _bounded(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The branch of ``schema`` that carries bounds (an ``anyOf`` with null has one)."""
    for branch in schema.get("anyOf", [schema]):
        keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
                "maxLength", "minItems", "maxItems")  # fmt: skip
        if any(k in branch for k in keys):
            return branch
    return None


def _interval(branch: dict[str, Any]) -> tuple[str, float, float, bool, bool]:
    """(kind, low, high, low included, high included) of a bounded schema."""
    if branch.get("type") == "string":
        return "length", branch.get("minLength", 0), branch["maxLength"], True, True
    if branch.get("type") == "array":
        return "items", branch.get("minItems", 0), branch.get("maxItems", math.inf), True, True
    low = branch.get("minimum", branch.get("exclusiveMinimum", -math.inf))
    high = branch.get("maximum", branch.get("exclusiveMaximum", math.inf))
    return "value", low, high, "exclusiveMinimum" not in branch, "exclusiveMaximum" not in branch


def _declared(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every bounded value of the schema: where it is sent and its interval."""
    components = schema["components"]["schemas"]
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                branch = _bounded(parameter["schema"])
                if branch is not None:
                    found.append({"method": method.upper(), "path": path, "in": parameter["in"],
                                  "name": parameter["name"], "branch": branch})  # fmt: skip
            body = operation.get("requestBody")
            if body is None:
                continue
            ref = body["content"]["application/json"]["schema"]
            ref = next(b["$ref"] for b in ref.get("anyOf", [ref]) if "$ref" in b)
            for name, prop in components[ref.rsplit("/", 1)[1]]["properties"].items():
                for key, branch in [(name, _bounded(prop)),
                                    (f"{name}[]", _bounded(prop.get("items", {})))]:  # fmt: skip
                    if branch is not None:
                        found.append({"method": method.upper(), "path": path, "in": "body",
                                      "name": key, "branch": branch})  # fmt: skip
    return found


_SETTINGS_NAMES = {
    "PPR_MAX_K": "max_k",
    "PPR_EPSILON_MIN": "epsilon_min",
    "PPR_EPSILON_MAX": "epsilon_max",
    "PPR_BATCH_MAX_ITEMS": "batch_max_items",
    "PPR_EMBEDDING_MIN_SIGMA": "embedding_min_sigma",
    "PPR_EMBEDDING_MAX_SIGMA": "embedding_max_sigma",
}


def _number(text: str, settings: Settings) -> float:
    text = text.strip()
    if text in _SETTINGS_NAMES:
        return float(getattr(settings, _SETTINGS_NAMES[text]))
    if text == "2^31-1":
        return float(2**31 - 1)
    return float(text)


def _docs_table(settings: Settings) -> dict[tuple[str, str], tuple[str, float, float, bool, bool]]:
    """docs/api.md's limits table: (name, in) -> interval."""
    text = (ROOT / "docs" / "api.md").read_text()
    table = text.split("## Limits", 1)[1]
    rows = {}
    pattern = re.compile(
        r"^\| `([^`]+)` \| (\w+) \| (?:(length|items) )?([\[(])([^,]+), ([^\])]+)([\])])"
    )
    for line in table.splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        name, where, kind, opening, low, high, closing = match.groups()
        key = (name.lower(), where)
        assert key not in rows, f"docs/api.md lists {key} twice"
        rows[key] = (kind or "value", _number(low, settings), _number(high, settings),
                     opening == "[", closing == "]")  # fmt: skip
    return rows


@sqlite_only
def test_every_declared_limit_is_the_documented_one(backend: Backend) -> None:
    settings = backend.settings()
    with running_app(backend) as client:
        schema = client.get("/openapi.json").json()
    documented = _docs_table(settings)
    declared: dict[tuple[str, str], set[tuple[str, float, float, bool, bool]]] = {}
    for entry in _declared(schema):
        declared.setdefault((entry["name"].lower(), entry["in"]), set()).add(
            _interval(entry["branch"])
        )
    for key, intervals in declared.items():
        assert len(intervals) == 1, (
            f"{key} has different limits on different endpoints: {intervals}"
        )
        assert key in documented, f"{key} {intervals} is not in docs/api.md's table"
        assert documented[key] == intervals.pop(), key
    assert set(documented) == set(declared), set(documented) ^ set(declared)
    # docs/api.md's own statements of the same limits in its prose (whitespace and line
    # breaks aside).
    readme = " ".join((ROOT / "docs" / "api.md").read_text().split())
    said = {
        ("limit", "query"): "`limit` in {low}..{high}",
        ("offset", "query"): "`offset` in {low}..2^31-1",
        ("account_id", "path"): "ids in {low}..2^31-1",
        ("key_id", "path"): "ids in {low}..2^31-1",
        ("k", "query"): "`k` ({low}..{high}, default",
        ("node_id", "path"): "(up to {high} bytes, no whitespace or commas)",
        ("cap_epsilon", "body"): "`cap_epsilon` in [{low}, {high}]",
        ("delta", "body"): "`delta` in [{low}, {high})",
    }
    for key, sentence in said.items():
        _, low, high, _, _ = documented[key]
        if key in {("offset", "query"), ("account_id", "path"), ("key_id", "path")}:
            assert high == 2**31 - 1, key
        expected = sentence.format(low=_readme_number(low), high=_readme_number(high))
        assert expected in readme, f"docs/api.md does not say {expected!r}"


def _readme_number(x: float) -> str:
    """As the README writes numbers: 1000, 0.1, 1e-6."""
    text = f"{x:.0e}" if 0 < abs(x) < 0.01 and float(f"{x:.0e}") == x else f"{x:g}"
    return re.sub(r"e-0*(\d)", r"e-\1", text)


def _probes(branch: dict[str, Any], item: str = "7") -> list[tuple[Any, bool]]:
    """Values at each limit (accepted) and one step past it (refused)."""
    kind, low, high, low_in, high_in = _interval(branch)
    integer = branch.get("type") == "integer"
    probes: list[tuple[Any, bool]] = []
    if kind != "value":
        make = (lambda n: "a" * n) if kind == "length" else (lambda n: [item] * n)
        if low > 0:
            probes += [(make(int(low)), True), (make(int(low) - 1), False)]
        if high != math.inf:
            probes += [(make(int(high)), True), (make(int(high) + 1), False)]
        return probes

    def step(x: float, up: bool) -> float:
        if integer:
            return x + 1 if up else x - 1
        size = abs(x) * 1e-6 if x else 1e-9
        return x + size if up else x - size

    if low != -math.inf:
        probes += (
            [(low, True), (step(low, False), False)]
            if low_in
            else [(low, False), (step(low, True), True)]
        )
    if high != math.inf:
        probes += (
            [(high, True), (step(high, True), False)]
            if high_in
            else [(high, False), (step(high, False), True)]
        )
    return [(int(v) if integer else v, ok) for v, ok in probes]


_BOUND_WORDS = re.compile(r"less than|greater than|at most|at least|characters|items|bytes|plain")


def _named(answer: Any, name: str) -> bool:
    if answer.status_code != 422:
        return False
    parameter = str(answer.json()["error"].get("details", {}).get("parameter", ""))
    return parameter.lower() == name.lower().removesuffix("[]") or parameter.startswith(
        name.removesuffix("[]") + "."
    )


@pytest.mark.slow
@sqlite_only
def test_every_declared_limit_is_enforced_at_the_limit_and_one_past(backend: Backend) -> None:
    with running_app(backend, graph_dir=backend.graph_path.parent) as client:
        # account 1 and key 1 are the probes' to change (and revoke), not the admin's
        spare = ledger_of(client).accounts.create_account("service", cap_epsilon=1.0, delta=1e-6)
        ledger_of(client).api_keys.create_api_key(spare.account_id)
        accounts = Accounts(client)
        admin = bearer(accounts.admin_key)
        service_id, service_key = accounts.service(modes=["edge"], cap_epsilon=1000.0)
        key_id = ledger_of(client).api_keys.list_api_keys(service_id)[0].key_id
        schema = client.get("/openapi.json").json()
        base_query = {
            "/v1/ppr/{node_id}": {"mode": "edge", "mechanism": "popular"},
            "/v1/embeddings/{node_id}": {"mode": "edge", "k": 2},
            "/v1/embeddings/free/{node_id}": {"mode": "edge"},
        }
        base_body: dict[str, dict[str, Any]] = {
            "/v1/ppr/batch": {"nodes": ["7"], "mode": "edge", "mechanism": "popular"},
            "/v1/embeddings/batch": {"nodes": ["7"], "mode": "edge", "k": 2},
            "/v1/admin/accounts": {"type": "service"},
            "/v1/admin/graph/reload": {},
            "/v1/admin/plan": {"cap_epsilon": 1.0, "days": 30, "answers_per_day": 1},
        }
        checked = 0
        for entry in _declared(schema):
            method, path, where, name = entry["method"], entry["path"], entry["in"], entry["name"]
            ids = {"account_id": str(service_id), "key_id": str(key_id), "node_id": "7"}
            keyed = path.startswith(("/v1/ppr", "/v1/embeddings"))
            headers = bearer(service_key if keyed else accounts.admin_key)
            for value, accepted in _probes(entry["branch"], "edge" if name == "modes" else "7"):
                query = dict(base_query.get(path, {}))
                body = dict(base_body.get(path, {}))
                if name == "node_id" and where == "body":
                    body["type"] = "user"
                sent_headers = dict(headers)
                if where == "path":
                    ids = {**ids, name: str(value)}
                elif where == "query":
                    query[name] = repr(value) if isinstance(value, float) else str(value)
                elif where == "header":
                    sent_headers[name] = value
                elif name.endswith("[]"):
                    body[name[:-2]] = [value]
                else:
                    body[name] = value
                url = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], path)  # noqa: B023
                kwargs: dict[str, Any] = {"params": query, "headers": sent_headers}
                if method in ("POST", "PUT"):
                    kwargs["json"] = body
                answer = client.request(method, url, **kwargs)
                what = f"{method} {path} {where} {name}={str(value)[:30]!r}: {answer.text[:300]}"
                assert answer.status_code < 500, what
                if accepted:
                    message = answer.text if _named(answer, name) else ""
                    assert not _BOUND_WORDS.search(message), what
                elif where == "path" and value == "":
                    refused(answer, 404, "not_found")  # no route without the segment
                else:
                    assert _named(answer, name), what
                checked += 1
        assert admin and checked >= 80, checked
