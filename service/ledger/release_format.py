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
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from service.ledger.tables import encode_json
from service.mechanisms.postprocess import RankedNode

#: Marks the compact form (a JSON object; the older form is a JSON list).
FORMAT = "nodes+f64le"


class UnreadableResults(ValueError):
    """Stored results in neither form."""


def results_json(results: Sequence[RankedNode]) -> str:
    """``encode_results(results)`` as JSON text (sorted keys, no spaces), encoded once per
    :class:`StoredResults`: the ledger row and the replay cache store the same text."""
    if isinstance(results, StoredResults):
        if results._json is None:
            results._json = encode_json(encode_results(results))
        return results._json
    return encode_json(encode_results(results))


def encode_results(results: Sequence[RankedNode]) -> dict[str, Any]:
    if isinstance(results, StoredResults):
        nodes, values = results._nodes, results._scores
    else:
        nodes, values = [r.node for r in results], [r.score for r in results]
    scores = np.asarray(values, dtype="<f8")
    return {
        "format": FORMAT,
        "nodes": nodes,
        "scores": base64.b64encode(scores.tobytes()).decode("ascii"),
    }


class StoredResults(Sequence[RankedNode]):
    """Decoded results that build a :class:`RankedNode` only for the entries read: a replay
    of k = 20 from a 1000-entry release touches 20 (a slice is a list)."""

    __slots__ = ("_json", "_nodes", "_scores")

    def __init__(self, nodes: list[str], scores: list[float]) -> None:
        self._nodes = nodes
        self._scores = scores
        self._json: str | None = None  # results_json, once computed (the values never change)

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> RankedNode: ...

    @overload
    def __getitem__(self, index: slice) -> list[RankedNode]: ...

    def __getitem__(self, index: int | slice) -> RankedNode | list[RankedNode]:
        if isinstance(index, slice):
            return [
                RankedNode(node, score)
                for node, score in zip(self._nodes[index], self._scores[index], strict=True)
            ]
        return RankedNode(self._nodes[index], self._scores[index])

    def __iter__(self) -> Iterator[RankedNode]:
        for node, score in zip(self._nodes, self._scores, strict=True):
            yield RankedNode(node, score)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def decode_results(stored: Any) -> Sequence[RankedNode]:
    if isinstance(stored, list):  # the pair-list form
        return [RankedNode(str(node), float(score)) for node, score in stored]
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        raise UnreadableResults("stored results are in an unknown form")
    nodes = stored["nodes"]
    raw = base64.b64decode(stored["scores"], validate=True)
    if not isinstance(nodes, list) or len(raw) != 8 * len(nodes):
        raise UnreadableResults("stored results: nodes and scores differ in length")
    if not all(isinstance(node, str) for node in nodes):
        raise UnreadableResults("stored results: a node id is not a string")
    return StoredResults(nodes, np.frombuffer(raw, dtype="<f8").tolist())
