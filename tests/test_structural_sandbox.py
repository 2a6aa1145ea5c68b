"""Structural test of the sandbox (a synthetic release served as exact answers, paid for once by
each account that receives one): its callers see nothing of the private graph except through
the release.

The synthetic release is the noisy part: what a sandbox serves is computed from it. So the
test holds the release fixed and toggles one edge of the private graph behind it: for each of
the structural test's three graphs (G0, G0 plus a pendant node's only edge, G0 plus an edge at
its largest-degree node; tests/test_structural_leaks.py), ``synthesize`` runs on that graph
into its own ledger, the draw of G0's run being replayed in the other two (so the three
ledgers record byte-identical release files, each charged against its own graph), and the
release is served as a sandbox. The same requests as the structural test's, by the same
accounts, must give equal status codes, headers and bodies, this time with nothing masked as
noisy (the sandbox's answers are exact functions of the release): only request ids, dates,
timings and ids drawn at random per ledger (the public graph id, the release's run id) are
masked. SQLite with one worker; PostgreSQL + Redis with two.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

import service.synthetic.release as synthetic_release
from service.cli import main
from service.ledger import upgrade
from tests.api_support import Backend, bearer, uvicorn_server
from tests.test_structural_leaks import (
    _accounts,
    _compare,
    _graph_files,
    _normalised,
    _replace_version,
    _requests,
)

pytestmark = pytest.mark.slow


def _synthesize(
    graph: Path, url: str, out: Path, draws: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``synthesize`` on ``graph``: G0's draw is recorded, the others' replaced by it."""
    real = synthetic_release.community_synthesize

    def recorded(*args: Any, **kwargs: Any) -> Any:
        if draws:
            return draws[0]  # the release held fixed: only the private graph differs
        draws.append(real(*args, **kwargs))
        return draws[0]

    monkeypatch.setattr(synthetic_release, "community_synthesize", recorded)
    # within the test accounts' caps of 1 (the poor one, 0.05, is refused alike everywhere)
    assert main(["synthesize", "--graph", str(graph), "--database-url", url, "--epsilon", "0.5",
                 "--out", str(out), "--no-progress"]) == 0  # fmt: skip


def _release_id(url: str) -> str:
    from tests.api_support import open_ledger

    with open_ledger(url) as ledger:
        jobs, _ = ledger.synthesis.synthesis_jobs()
    assert len(jobs) == 1
    return jobs[0].release_name.rsplit(":", 1)[-1]


def _transcript(server_url: str, keys: dict[str, str], masks: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with httpx.Client(base_url=server_url, timeout=60) as http:
        probe = http.get("/v1/ppr/8", params={"k": 1}, headers=bearer(keys["8"]))
        assert probe.status_code == 200, probe.text
        assert probe.json().get("synthetic") is True
        version = probe.json()["graph_version"]
        for who, method, path, payload, _noisy in _requests():
            headers = bearer(keys[who]) if who else {}
            if method == "GET":
                response = http.get(path, params=payload, headers=headers)
            else:
                response = http.post(path, json=payload, headers=headers)
            entry = _normalised(response, noisy=False, version=version, path=path)
            for random_id in masks:
                entry = _replace_version(entry, random_id)
            entry["request"] = f"{who} {method} {path} {payload}"
            out.append(entry)
    return out


@pytest.mark.parametrize(
    ("store", "workers"),
    [
        pytest.param("sqlite", 1, id="sqlite-1-worker"),
        pytest.param("postgres", 2, id="postgres-redis-2-workers", marks=pytest.mark.postgres),
    ],
)
def test_the_sandbox_shows_nothing_of_the_private_graph_beyond_the_release(
    tmp_path: Path, store: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import postgres_database
    from tests.test_api import REDIS_URL, forget_cached_keys, redis_answers

    nodes, files, toggles = _graph_files(tmp_path)
    redis_url = None
    if store == "postgres":
        if not redis_answers():
            pytest.skip(f"Redis does not answer at {REDIS_URL}")
        redis_url = REDIS_URL
    monkeypatch.setenv("PPR_NODES_PATH", str(nodes))
    draws: list[Any] = []
    released: dict[str, bytes] = {}
    transcripts: dict[str, list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        for name, path in files.items():
            if store == "sqlite":
                url = f"sqlite:///{tmp_path / (name + '.db')}"
            else:
                url = stack.enter_context(postgres_database())
            upgrade(url)
            keys = _accounts(url)
            out = tmp_path / f"{name}-synthetic.txt"
            _synthesize(path, url, out, draws, monkeypatch)
            released[name] = out.read_bytes()
            backend = Backend(store, url, redis_url, out)
            env = {"PPR_NODES_PATH": str(nodes), "PPR_GRAPH_SNAPSHOT_DIR": str(tmp_path / name)}
            with uvicorn_server(backend, workers=workers, extra_env=env, forked=True) as server:
                transcripts[name] = _transcript(server.base_url, keys, [_release_id(url)])
            if redis_url is not None:
                forget_cached_keys(url, redis_url)
    assert len(set(released.values())) == 1  # one release, three private graphs behind it
    for name in toggles:
        _compare(transcripts["g0"], transcripts[name], f"sandbox g0 vs {name}")
    answered = [entry for entry in transcripts["g0"] if entry["status"] == 200]
    assert any(isinstance(e["body"], dict) and e["body"].get("synthetic") for e in answered)
