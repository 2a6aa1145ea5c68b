"""The stored form of a released ranking: compact, exact, and cheap to write and read.

A release keeps up to ``PPR_REPLAY_STORE_TOP`` (1000) results so that replays can answer any
k; written as a JSON list of ``[node, score]`` pairs that is ~29 kB and ~1.5 ms of float
formatting per release, paid twice per fresh query (ledger row and replay cache). The compact
form keeps the node ids as a JSON list of strings and the scores as their float64 bytes
(little-endian, base64): the same values bit for bit, about half the size, and a fraction of
the encoding time. Readers accept both forms (rows written before this format are lists).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from service.mechanisms.postprocess import RankedNode

#: Marks the compact form (a JSON object; the older form is a JSON list).
FORMAT = "nodes+f64le"


class UnreadableResults(ValueError):
    """Stored results in neither form."""


def encode_results(results: list[RankedNode]) -> dict[str, Any]:
    scores = np.fromiter((r.score for r in results), dtype="<f8", count=len(results))
    return {
        "format": FORMAT,
        "nodes": [r.node for r in results],
        "scores": base64.b64encode(scores.tobytes()).decode("ascii"),
    }


def decode_results(stored: Any) -> list[RankedNode]:
    if isinstance(stored, list):  # the pair-list form
        return [RankedNode(str(node), float(score)) for node, score in stored]
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        raise UnreadableResults("stored results are in an unknown form")
    nodes = stored["nodes"]
    raw = base64.b64decode(stored["scores"], validate=True)
    if not isinstance(nodes, list) or len(raw) != 8 * len(nodes):
        raise UnreadableResults("stored results: nodes and scores differ in length")
    scores = np.frombuffer(raw, dtype="<f8").tolist()
    return [RankedNode(str(node), score) for node, score in zip(nodes, scores, strict=True)]
