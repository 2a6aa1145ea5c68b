"""Structural test: one edge toggled changes nothing a user or a service account can see except
through a noisy release.

Three live servers serve three graphs on one node list: G0, G0 plus the only edge of a pendant
node, and G0 plus an edge at its largest-degree node. Each gets a fresh ledger with the same
accounts, and the same sequence of requests from a user and a service account reaches every
endpoint they can call (every ranking and mode, DP-IE embeddings and the free embedding of a
stored release, replays, the batch endpoint, budgets, the
service's read figure, errors of every kind, health, readiness, metrics, the API description and
its pages, an admin page refused; tests/test_structural_cover.py fails when an operation a user
or a service account can call is missing from the sequence). The
responses' bodies, headers and status codes must be equal after masking only what is noisy or
per-process: the ids and scores of noisy rankings, their byte length, request ids, dates and
timings, the public graph id, which is random per ledger (a separate check shows it is not
the content fingerprint), and the embedding hash salt, random per ledger too. Run on SQLite
with one worker and on PostgreSQL + Redis with two.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.cli import main
from service.embeddings.all_node_release import RELEASE_PREFIX as EMBEDDINGS_PREFIX
from service.graph.generate import generate_graph
from service.graph.loader import load_edge_list, read_node_list
from service.ledger import upgrade
from tests.api_support import Backend, bearer, open_ledger, uvicorn_server

pytestmark = pytest.mark.slow

NODES = 300
EDGES = 1500
PENDANT = str(NODES)  # listed, with no edge in G0
SERVICE_SEEDS = ["3", "5", "8"]


def _graph_files(tmp_path: Path) -> tuple[Path, dict[str, Path], dict[str, tuple[str, str]]]:
    """The node list and the three edge files; the toggled edge of each variant."""
    base = generate_graph(NODES, EDGES, seed=11)
    edges = {(int(base.node_ids[a]), int(base.node_ids[b])) for a, b in _edge_pairs(base)}
    hub = int(np.argmax(base.degrees))
    neighbours = {
        int(base.node_ids[j]) for j in base.indices[base.indptr[hub] : base.indptr[hub + 1]]
    }
    hub_id = int(base.node_ids[hub])
    outsider = next(v for v in range(NODES) if v != hub_id and v not in neighbours)
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("".join(f"{i}\n" for i in range(NODES + 1)))
    toggles = {"pendant": (PENDANT, "17"), "hub": (str(hub_id), str(outsider))}
    files = {}
    for name, extra in (("g0", None), *toggles.items()):
        lines = [f"{u} {v}" for u, v in sorted(edges)]
        if extra is not None:
            lines.append(f"{extra[0]} {extra[1]}")
        path = tmp_path / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n")
        files[name] = path
    return nodes, files, toggles


def _edge_pairs(graph: Any) -> Iterator[tuple[int, int]]:
    for row in range(graph.n):
        for col in graph.indices[graph.indptr[row] : graph.indptr[row + 1]]:
            if row < col:
                yield row, int(col)


def _accounts(database_url: str) -> dict[str, str]:
    """The same accounts, created in the same order, in every ledger."""
    keys: dict[str, str] = {}
    with open_ledger(database_url) as ledger:
        for node in ("7", "3", "5", "8"):
            user = ledger.accounts.create_account("user", node_id=node, cap_epsilon=1.0, delta=1e-6)
            keys[node], _ = ledger.api_keys.create_api_key(user.account_id)
        poor = ledger.accounts.create_account("user", node_id="9", cap_epsilon=0.05, delta=1e-6)
        keys["poor"], _ = ledger.api_keys.create_api_key(poor.account_id)
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=1e-6, modes=("edge", "personalized"),
            label="backend",
        )  # fmt: skip
        keys["service"], _ = ledger.api_keys.create_api_key(service.account_id)
    return keys


#: (who, method, path, params or body, noisy): the requests, in order.
def _requests() -> list[tuple[str, str, str, dict[str, Any] | None, bool]]:
    calls: list[tuple[str, str, str, dict[str, Any] | None, bool]] = [
        ("", "GET", "/healthz", None, False),
        ("", "GET", "/readyz", None, False),
        ("", "GET", "/openapi.json", None, False),
        ("", "GET", "/docs", None, False),
        ("", "GET", "/redoc", None, False),
        ("", "GET", "/docs/assets/favicon.png", None, False),
        ("", "GET", "/docs/assets/no-such-asset.js", None, False),
        ("", "GET", "/v1/ppr/7", None, False),  # no key
        ("", "GET", "/v1/me/budget", None, False),
        ("", "GET", "/v1/me/reads", None, False),
        ("", "POST", "/v1/ppr/batch", {"nodes": SERVICE_SEEDS, "mode": "edge"}, False),
        ("7", "GET", "/readyz", None, False),  # a user key is not an admin key: status only
        ("7", "GET", "/v1/me/budget", None, False),
        ("7", "GET", "/v1/me/reads", None, False),  # users have no read figure
        ("7", "POST", "/v1/ppr/batch", {"nodes": ["7"], "mode": "edge", "k": 4}, True),
        ("7", "POST", "/v1/ppr/batch", {"nodes": ["3"], "mode": "edge", "k": 4}, False),
        ("service", "GET", "/v1/me/reads", None, False),  # before any release
        ("service", "GET", "/readyz", None, False),
    ]
    for mechanism in ("noisy_diffusion", "popular", "common_neighbours", "friends_of_friends",
                      "blended"):  # fmt: skip
        calls.append(("7", "GET", "/v1/ppr/7", {"mechanism": mechanism, "k": 5}, True))
        calls.append(("7", "GET", "/v1/ppr/7", {"mechanism": mechanism, "k": 5}, True))  # replay
    calls += [
        ("7", "GET", "/v1/ppr/7", {"mode": "edge", "k": 5, "epsilon": 0.2}, True),
        ("7", "GET", "/v1/ppr/7", {"k": 5, "exclude_neighbors": "true", "fresh": "true"}, True),
        ("7", "GET", "/v1/ppr/7", {"k": 5, "refresh": "max_age:7d"}, True),  # a young replay
        ("7", "GET", "/v1/ppr/7", {"k": 5, "refresh": "max_age:soon"}, False),
        ("7", "GET", f"/v1/ppr/{PENDANT}", {"mode": "edge", "k": 5}, False),  # not its node
        ("7", "GET", "/v1/ppr/no-such-node", {"mode": "edge"}, False),
        ("7", "GET", "/v1/ppr/7", {"epsilon": 50}, False),
        ("7", "GET", "/v1/ppr/7", {"mode": "edge", "mechanism": "common_neighbours"}, False),
        ("poor", "GET", "/v1/ppr/9", {"epsilon": 0.1, "mode": "edge"}, False),  # over the cap
        ("poor", "GET", "/v1/me/budget", None, False),
        ("service", "GET", f"/v1/ppr/{PENDANT}", {"mode": "edge", "k": 5}, True),
        ("service", "GET", "/v1/ppr/17", {"mode": "edge", "k": 5, "mechanism": "popular"}, True),
        ("service", "GET", "/v1/ppr/3", {"k": 5}, True),  # personalized, charged to user 3
        ("service", "GET", "/v1/ppr/no-such-node", {"mode": "edge"}, False),
        (
            "service",
            "POST",
            "/v1/ppr/batch",
            {"nodes": [*SERVICE_SEEDS, PENDANT, "no-such-node"], "mode": "edge", "k": 4},
            True,
        ),
        (
            "service",
            "POST",
            "/v1/ppr/batch",
            {"nodes": SERVICE_SEEDS, "k": 4, "mechanism": "friends_of_friends"},
            True,
        ),
        ("service", "POST", "/v1/ppr/batch", {"nodes": []}, False),
        # embeddings: DP-IE (charged, replayed, both modes) and the free embedding of a
        # stored release (user 8's version probe above: edge-mode noisy_diffusion)
        ("8", "GET", "/v1/embeddings/8", {"k": 8}, True),
        ("8", "GET", "/v1/embeddings/8", {"k": 8}, True),  # replay
        ("8", "GET", "/v1/embeddings/8", {"k": 8, "mode": "edge", "sigma": 0.01}, True),
        ("8", "GET", "/v1/embeddings/free/8", {"mode": "edge", "k": 8}, True),
        ("8", "GET", "/v1/embeddings/3", None, False),  # not its node
        ("8", "GET", "/v1/embeddings/8", {"sigma": 5}, False),
        ("8", "GET", "/v1/embeddings/free/8", {"epsilon": 0.3}, False),  # no such release
        ("service", "GET", f"/v1/embeddings/{PENDANT}", {"mode": "edge", "k": 8}, True),
        ("service", "GET", "/v1/embeddings/3", {"k": 8}, True),  # charged to user 3
        ("service", "GET", "/v1/embeddings/free/3", {"k": 8}, True),  # its /v1/ppr/3 release
        ("service", "GET", "/v1/embeddings/no-such-node", {"mode": "edge"}, False),
        # the embedding batch: each item through the single embedding's path
        ("8", "POST", "/v1/embeddings/batch", {"nodes": ["8"], "k": 8}, True),
        ("8", "POST", "/v1/embeddings/batch", {"nodes": ["8"], "k": 8}, True),  # replay
        ("8", "POST", "/v1/embeddings/batch", {"nodes": ["3"], "k": 8}, False),  # not its node
        (
            "service",
            "POST",
            "/v1/embeddings/batch",
            {"nodes": [PENDANT, "3", "no-such-node"], "mode": "edge", "k": 8},
            True,
        ),
        ("service", "POST", "/v1/embeddings/batch", {"nodes": []}, False),
        ("service", "GET", "/v1/me/budget", None, False),
        ("service", "GET", "/v1/embeddings/similar/3", {"k": 5}, True),  # the all-node release
        ("service", "GET", f"/v1/embeddings/similar/{PENDANT}", {"k": 5}, True),
        ("service", "GET", "/v1/embeddings/similar/no-such-node", None, False),
        ("service", "GET", "/v1/embeddings/similar/3", {"k": "0"}, False),
        ("7", "GET", "/v1/embeddings/similar/7", None, False),  # users are refused
        ("", "GET", "/v1/embeddings/similar/7", None, False),
        ("service", "GET", "/v1/me/reads", None, False),  # releases counted, not their content
        ("service", "GET", "/v1/admin/graph", None, False),
        ("7", "GET", "/v1/admin/health", None, False),
        ("3", "GET", "/v1/me/budget", None, False),
        ("3", "GET", "/v1/me/reads", None, False),
        ("service", "GET", "/healthz", None, False),
        ("service", "GET", "/metrics", None, False),
        ("", "GET", "/metrics", None, False),
    ]
    return calls


_MASKED_HEADERS = {"date", "x-request-id", "server-timing", "content-length"}
_TIMING_KEYS = {"request_id", "created_at", "released_at", "age_seconds", "at", "timestamp",
                "duration_ms", "release_request_id"}  # fmt: skip
#: drawn from the OS per ledger, never from the edges: the embedding hash functions' salt
_RANDOM_PER_LEDGER = {"hash_salt"}


def _normalised(
    response: httpx.Response, *, noisy: bool, version: str, path: str
) -> dict[str, Any]:
    headers = {
        k: v.replace(version, "<graph-version>")
        for k, v in response.headers.items()
        if k not in _MASKED_HEADERS
    }
    if path == "/metrics":
        # values are timings and counts of the worker that answered; which worker served a
        # replay from memory is not the graph's doing: compare the metric names, and check
        # that no label carries the graph's id
        assert version not in response.text
        names = sorted({re.sub(r"[{\s].*$", "", line) for line in response.text.splitlines()
                        if line and not line.startswith("#")})  # fmt: skip
        return {"status": response.status_code, "headers": headers, "series": names}
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    text = _mask(body, noisy=noisy)
    return {
        "status": response.status_code,
        "headers": headers,
        "body": _replace_version(text, version),
    }


#: blended's hold-out statistics, and the grid of its score units, are computed from the noisy
#: counts and the noisy degrees alone (post-processing): part of its noisy release
_BLENDED_NOISY = {"weight", "reliability_counts", "reliability_degrees", "counts_signal",
                  "score_grid"}  # fmt: skip


def _mask(value: Any, *, noisy: bool) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        blended = value.get("name") == "blended"
        for key, item in value.items():
            if noisy and blended and key in _BLENDED_NOISY:
                out[key] = "<noisy>"
            elif key == "name" and str(item).startswith(EMBEDDINGS_PREFIX):
                out[key] = "<release-name>"  # a random id per release, drawn by the release
            elif noisy and key == "index" and "release" in value:
                # exact or approximate search: chosen by the index's recall measured on the
                # released (noisy) vectors, post-processing of the release
                out[key] = "<noisy>"
            elif key in _TIMING_KEYS:
                out[key] = "<masked>"
            elif key == "results" and noisy and isinstance(item, list):
                out[key] = len(item)  # ids and scores are the noisy release
            elif key == "embedding" and noisy and isinstance(item, list):
                out[key] = len(item)  # the coordinates are the noisy release
            elif key in _RANDOM_PER_LEDGER:
                out[key] = "<random>"
            else:
                out[key] = _mask(item, noisy=noisy)
        return out
    if isinstance(value, list):
        return [_mask(item, noisy=noisy) for item in value]
    return value


def _replace_version(value: Any, version: str) -> Any:
    if isinstance(value, dict):
        return {k: _replace_version(v, version) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_version(v, version) for v in value]
    if isinstance(value, str) and version in value:
        return value.replace(version, "<graph-version>")
    return value


def _transcript(server_url: str, keys: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    out: list[dict[str, Any]] = []
    with httpx.Client(base_url=server_url, timeout=60) as http:
        version = http.get("/v1/ppr/8", params={"mode": "edge", "k": 1},
                           headers=bearer(keys["8"])).json()["graph_version"]  # fmt: skip
        for who, method, path, payload, noisy in _requests():
            headers = bearer(keys[who]) if who else {}
            if method == "GET":
                response = http.get(path, params=payload, headers=headers)
            else:
                response = http.post(path, json=payload, headers=headers)
            entry = _normalised(response, noisy=noisy, version=version, path=path)
            entry["request"] = f"{who} {method} {path} {payload}"
            out.append(entry)
    return out, version


def _compare(base: list[dict[str, Any]], other: list[dict[str, Any]], what: str) -> None:
    assert len(base) == len(other)
    for a, b in zip(base, other, strict=True):
        assert a == b, f"{what}: {a['request']} differs:\n{a}\n{b}"


@pytest.mark.parametrize(
    ("store", "workers"),
    [
        pytest.param("sqlite", 1, id="sqlite-1-worker"),
        pytest.param("postgres", 2, id="postgres-redis-2-workers", marks=pytest.mark.postgres),
    ],
)
def test_toggling_one_edge_changes_nothing_outside_the_noise(
    tmp_path: Path, store: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import postgres_database
    from tests.test_api import REDIS_URL, forget_cached_keys, redis_answers

    nodes, files, toggles = _graph_files(tmp_path)
    seeds = {"7", "3", "5", "8", "9"}
    assert not seeds & {end for edge in toggles.values() for end in edge}  # not the seeds' own
    redis_url = None
    if store == "postgres":
        if not redis_answers():
            pytest.skip(f"Redis does not answer at {REDIS_URL}")
        redis_url = REDIS_URL
    transcripts: dict[str, list[dict[str, Any]]] = {}
    versions: dict[str, str] = {}
    with ExitStack() as stack:
        for name, path in files.items():
            if store == "sqlite":
                url = f"sqlite:///{tmp_path / (name + '.db')}"
            else:
                url = stack.enter_context(postgres_database())
            upgrade(url)
            keys = _accounts(url)
            backend = Backend(store, url, redis_url, path)
            env = {"PPR_NODES_PATH": str(nodes), "PPR_GRAPH_SNAPSHOT_DIR": str(tmp_path / name)}
            # an all-node embedding release of this graph, for the similar-nodes endpoint
            env["PPR_EMBEDDING_RELEASE_DIR"] = str(tmp_path / f"{name}-embeddings")
            Path(env["PPR_EMBEDDING_RELEASE_DIR"]).mkdir()
            monkeypatch.setenv("PPR_NODES_PATH", str(nodes))
            assert main(["embeddings", "release", "--graph", str(path), "--database-url", url,
                         "--epsilon", "1", "--k", "16", "--rounds", "3", "--no-progress",
                         "--out", env["PPR_EMBEDDING_RELEASE_DIR"]]) == 0  # fmt: skip
            with uvicorn_server(backend, workers=workers, extra_env=env, forked=True) as server:
                transcripts[name], versions[name] = _transcript(server.base_url, keys)
            if redis_url is not None:
                forget_cached_keys(url, redis_url)
    for name in toggles:
        _compare(transcripts["g0"], transcripts[name], f"g0 vs {name}")
    embeddings = [
        (entry["status"], noisy)
        for entry, (_, method, path, _, noisy) in zip(transcripts["g0"], _requests(), strict=True)
        if path.startswith("/v1/embeddings/") and method == "GET"  # a batch answers 200 per item
    ]
    assert embeddings and all((status == 200) == noisy for status, noisy in embeddings)
    listed = read_node_list(nodes)
    for name, path in files.items():  # the id callers saw is not the content hash
        fingerprint = load_edge_list(path, nodes=listed).fingerprint
        assert versions[name] != fingerprint
    assert len(set(versions.values())) == len(versions)
