"""What one load phase sends, independent of the driver that sends it."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urlencode

Kind = Literal["path", "ppr", "batch"]

#: Phase names, in the order a run measures them by default.
PHASES = ("healthz", "fresh", "replay", "mixed", "batch")


@dataclass(frozen=True)
class Workload:
    """One phase's requests.

    - ``path``: a fixed GET (``/healthz``);
    - ``ppr``: ``GET /v1/ppr/{seed}``; with probability ``replay_fraction`` a seed from
      ``replay_seeds`` without ``fresh`` (a stored release answers), else a seed from ``seeds``
      with ``fresh=true`` (new noise, charged);
    - ``batch``: ``POST /v1/ppr/batch`` with ``batch_size`` seeds drawn from ``seeds``.
    """

    name: str
    kind: Kind
    path: str = "/healthz"
    seeds: tuple[str, ...] = ()
    replay_seeds: tuple[str, ...] = ()
    replay_fraction: float = 0.0
    mode: str = "edge"
    #: The ranking asked for (``mechanism=``); None: the server's default for the mode.
    mechanism: str | None = None
    epsilon: float = 0.1
    k: int = 20
    batch_size: int = 1
    batch_fresh: bool = True
    headers: dict[str, str] = field(default_factory=dict)

    def query_string(self, *, fresh: bool) -> str:
        params: dict[str, Any] = {"mode": self.mode, "epsilon": self.epsilon, "k": self.k}
        if self.mechanism is not None:
            params["mechanism"] = self.mechanism
        if fresh:
            params["fresh"] = "true"
        return "?" + urlencode(params)

    def ppr_path(self, seed: str, *, fresh: bool) -> str:
        return f"/v1/ppr/{quote(seed, safe='')}{self.query_string(fresh=fresh)}"

    def batch_body(self, nodes: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "nodes": nodes,
            "epsilon": self.epsilon,
            "k": self.k,
            "mode": self.mode,
            "fresh": self.batch_fresh,
        }
        if self.mechanism is not None:
            body["mechanism"] = self.mechanism
        return body

    def next_request(self, rng: random.Random) -> tuple[str, str, bytes | None]:
        """(method, path, body) of one request (used by the httpx driver)."""
        if self.kind == "path":
            return "GET", self.path, None
        if self.kind == "batch":
            nodes = [rng.choice(self.seeds) for _ in range(self.batch_size)]
            return "POST", "/v1/ppr/batch", json.dumps(self.batch_body(nodes)).encode()
        if self.replay_seeds and rng.random() < self.replay_fraction:
            return "GET", self.ppr_path(rng.choice(self.replay_seeds), fresh=False), None
        return "GET", self.ppr_path(rng.choice(self.seeds), fresh=True), None

    @property
    def items_per_request(self) -> int:
        return self.batch_size if self.kind == "batch" else 1
