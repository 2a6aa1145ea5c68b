"""Structural test without a node list: toggling a node's only edge changes the node count n,
and n shows only where the documents say it does.

Without ``--nodes`` / ``PPR_NODES_PATH`` the node set is derived from the edges, so adding the
only edge of a node adds the node: n grows by one. The README ("Without a node list") and
docs/privacy.md ("The node set") list every place n shows; ``serve`` warns once at start-up and
names them. Two live servers serve G0 and G0 plus the only edge of a new node, each on a fresh
ledger with the same accounts, and the structural test's requests (tests/test_structural_leaks.py)
reach every endpoint a user and a service account can call. The responses are compared after the
same masking as there (noisy ids and scores, request ids, timings, ids random per ledger): every
field that differs must be one the documents list (``NODE_COUNT_FIELDS``, mapped to the
documents' items below), and each listed item must be seen to differ, so the list is neither
short nor padded. With a node list there is no difference at all (tests/test_structural_leaks.py).
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.cli import main
from service.graph.generate import generate_graph
from service.graph.node_set import NODE_COUNT_SHOWS
from service.ledger import upgrade
from tests import test_structural_leaks
from tests.api_support import Backend, uvicorn_server
from tests.test_structural_leaks import PENDANT, _accounts, _edge_pairs, _requests, _transcript

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

#: Where each documented item shows in the responses: (pattern of the request, pattern of the
#: JSON path) of every field that may differ, by the item of ``NODE_COUNT_SHOWS`` it belongs to.
_DP_IE = r"/v1/embeddings/(?!free|similar)"
_ITEM = r"^body\.(items\.\d+\.)?"
_BUDGET = r"^body\.((items\.\d+\.)?budget\.|error\.details\.budget\.)?(spent|remaining)_epsilon$"
NODE_COUNT_FIELDS: dict[str, list[tuple[str, str]]] = {
    # the node itself (a request naming it: 404 or an answer, single, batch item or embedding),
    # and what answering it adds to the asker's figures (charges and releases counted)
    "node_exists": [
        (rf"(/|')({PENDANT})\b", r"."),
        (r".", r"^body\.(budget\.)?charges$"),
        (r"/v1/me/reads", r"^body\.releases$"),
    ],
    "ranking_length": [
        (r"/v1/ppr/.*'k': 1000", r"^body\.(items\.\d+\.)?results$"),
        (r"/v1/embeddings/free/", r"^body\.mechanism\.entries$"),
    ],
    "dp_ie_scale": [
        (
            r"/v1/embeddings/(?!free|similar)",
            r"^body\.(items\.\d+\.)?mechanism\.(sensitivity|noise_scale)$",
        ),
    ],
    "charged_epsilon": [
        (
            r"/v1/embeddings/(?!free|similar)",
            r"^body\.(items\.\d+\.)?(epsilon_charged|mechanism\.epsilon)$",
        ),
        (r".", _BUDGET),
    ],
    "read_figure": [(r"/v1/me/reads", r"^body\.read_epsilon$")],
    "all_node_release": [
        (r"/v1/embeddings/similar/", r"^body\.release\.(nodes|epsilon|epsilon_per_node)$"),
    ],
}
#: Requests beyond the structural test's: rankings cut at k >= n.
EXTRA_REQUESTS: list[tuple[str, str, str, dict[str, Any] | None, bool]] = [
    ("7", "GET", "/v1/ppr/7", {"k": 1000, "mechanism": "friends_of_friends"}, True),
    ("service", "GET", "/v1/ppr/5", {"k": 1000, "mode": "edge"}, True),
]


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The JSON paths where ``a`` and ``b`` differ (a list differing in length is its path)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                out.append(where)
            else:
                out += _differences(a[key], b[key], where)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{path}.{i}")]  # fmt: skip
    return [] if a == b else [path]


def _item_of(request: str, field: str) -> str | None:
    for item, patterns in NODE_COUNT_FIELDS.items():
        for route, json_path in patterns:
            if re.search(route, request) and re.search(json_path, field):
                return item
    return None


def _graph_files(tmp_path: Path) -> tuple[dict[str, Path], str]:
    """G0 on nodes 0..299 (every one with an edge) and G0 plus the only edge of node 300."""
    base = generate_graph(300, 1500, seed=11)
    assert int(np.min(base.degrees)) > 0  # every node of G0 exists through its edges
    lines = sorted(f"{base.node_ids[a]} {base.node_ids[b]}" for a, b in _edge_pairs(base))
    files = {}
    for name, extra in (("g0", []), ("pendant", [f"{PENDANT} 17"])):
        path = tmp_path / f"{name}.txt"
        path.write_text("\n".join(lines + extra) + "\n")
        files[name] = path
    return files, PENDANT


@pytest.mark.parametrize(
    ("store", "workers"),
    [
        pytest.param("sqlite", 1, id="sqlite-1-worker"),
        pytest.param("postgres", 2, id="postgres-redis-2-workers", marks=pytest.mark.postgres),
    ],
)
def test_without_a_node_list_n_shows_only_where_documented(
    tmp_path: Path, store: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import postgres_database
    from tests.test_api import REDIS_URL, forget_cached_keys, redis_answers

    files, _ = _graph_files(tmp_path)
    monkeypatch.delenv("PPR_NODES_PATH", raising=False)
    requests = _requests() + EXTRA_REQUESTS
    monkeypatch.setattr(test_structural_leaks, "_requests", lambda: requests)
    redis_url = None
    if store == "postgres":
        if not redis_answers():
            pytest.skip(f"Redis does not answer at {REDIS_URL}")
        redis_url = REDIS_URL
    transcripts: dict[str, list[dict[str, Any]]] = {}
    warnings: dict[str, list[str]] = {}
    with ExitStack() as stack:
        for name, path in files.items():
            if store == "sqlite":
                url = f"sqlite:///{tmp_path / (name + '.db')}"
            else:
                url = stack.enter_context(postgres_database())
            upgrade(url)
            keys = _accounts(url)
            release_dir = tmp_path / f"{name}-embeddings"
            release_dir.mkdir()
            assert main(["embeddings", "release", "--graph", str(path), "--database-url", url,
                         "--epsilon", "1", "--k", "16", "--rounds", "3", "--no-progress",
                         "--out", str(release_dir)]) == 0  # fmt: skip
            env = {"PPR_GRAPH_SNAPSHOT_DIR": str(tmp_path / name),
                   "PPR_EMBEDDING_RELEASE_DIR": str(release_dir)}  # fmt: skip
            backend = Backend(store, url, redis_url, path)
            with uvicorn_server(backend, workers=workers, extra_env=env, forked=True) as server:
                transcripts[name], _ = _transcript(server.base_url, keys)
                warnings[name] = [
                    str(line.get("message")) for line in server.log_lines()
                    if "no node list" in str(line.get("message", ""))
                ]  # fmt: skip
            if redis_url is not None:
                forget_cached_keys(url, redis_url)
    seen: set[str] = set()
    undocumented: list[str] = []
    for a, b in zip(transcripts["g0"], transcripts["pendant"], strict=True):
        assert a["request"] == b["request"]
        for field in _differences(a, b):
            item = _item_of(a["request"], field)
            if item is None:
                undocumented.append(
                    f"{a['request']}: {field}: {_at(a, field)!r} / {_at(b, field)!r}"
                )
            else:
                seen.add(item)
    assert not undocumented, "n shows where the documents do not say:\n" + "\n".join(undocumented)
    assert seen == set(NODE_COUNT_FIELDS), (
        f"documented but not seen: {set(NODE_COUNT_FIELDS) - seen}"
    )
    # serve warns once, and names every place n shows
    for lines in warnings.values():
        assert len(lines) == 1, lines
        for words in NODE_COUNT_SHOWS.values():
            assert words.replace("`", "") in lines[0]
    # /metrics is compared by its series' names (values are per worker); its counters of
    # charged epsilon sum the charges above, so they are listed too
    assert set(NODE_COUNT_SHOWS) == set(NODE_COUNT_FIELDS) | {"metrics"}


def _at(entry: Any, field: str) -> Any:
    value = entry
    for part in field.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def test_the_documents_list_every_place_n_shows() -> None:
    readme = (REPO / "README.md").read_text()
    privacy = (REPO / "docs/privacy.md").read_text()
    for item, words in NODE_COUNT_SHOWS.items():
        for text, name in ((readme, "README.md"), (privacy, "docs/privacy.md")):
            assert words in text, f"{name} does not list where n shows: {item} ({words!r})"
