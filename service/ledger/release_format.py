"""The stored form of a released ranking: compact, exact, and cheap to write and read.

A release keeps up to ``PPR_REPLAY_STORE_TOP`` (1000) results so that replays can answer any
k, and is written twice per fresh query (ledger row and replay cache). Three forms exist;
readers accept all of them:

- ``utf8+lengths+f64le`` (written now): the node ids' UTF-8 bytes concatenated, each id's
  length in bytes (one byte each when every id is shorter than 256 bytes, else four), and the
  scores' float64 bytes, each base64 in a JSON object. Written from the graph's packed id
  table without a Python string per id; read lazily, so a replay of k = 20 from a
  1000-entry release decodes 20 ids.
- ``nodes+f64le``: the node ids as a JSON list of strings, and the scores as above.
- a JSON list of ``[node, score]`` pairs (the first form).

The scores are the same float64 values bit for bit in every form.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, overload

import numpy as np

from service.graph.node_ids import utf8_join
from service.mechanisms.postprocess import RankedNode

#: The form written now, and the one before it (JSON objects; the first form is a list).
FORMAT = "utf8+lengths+f64le"
FORMAT_NODE_LIST = "nodes+f64le"


class UnreadableResults(ValueError):
    """Stored results in no known form."""


def results_json(results: Sequence[RankedNode]) -> str:
    """``encode_results(results)`` as JSON text (sorted keys, no spaces), encoded once per
    :class:`StoredResults`: the ledger row and the replay cache store the same text."""
    if isinstance(results, StoredResults):
        if results._json is None:
            results._json = _ascii_object_json(encode_results(results))
        return results._json
    return _ascii_object_json(encode_results(results))


def _ascii_object_json(doc: dict[str, Any]) -> str:
    """``encode_json(doc)`` for an object of ASCII text needing no escapes (base64, the
    format's name) and integers, written directly: the general encoder scans each of the
    ~17 kB of base64 for characters to escape, which took longer than the rest of storing."""
    parts = []
    for name in sorted(doc):
        value = doc[name]
        if isinstance(value, int):
            parts.append(f'"{name}":{value}')
        else:
            parts.append(f'"{name}":"{value}"')
    return "{" + ",".join(parts) + "}"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def encode_results(results: Sequence[RankedNode]) -> dict[str, Any]:
    if isinstance(results, StoredResults):
        data, lengths, scores = results.columns()
    else:
        data, lengths = utf8_join([r.node for r in results])
        scores = np.asarray([r.score for r in results], dtype=np.float64)
    width = "<u1" if not len(lengths) or int(lengths.max()) < 256 else "<u4"
    return {
        "format": FORMAT,
        "nodes": _b64(data),
        "lengths": _b64(np.asarray(lengths).astype(width).tobytes()),
        "length_bytes": np.dtype(width).itemsize,
        "scores": _b64(np.asarray(scores, dtype="<f8").tobytes()),
    }


class StoredResults(Sequence[RankedNode]):
    """Released results as columns: the ids' UTF-8 bytes with their offsets, and the scores.
    A :class:`RankedNode` (and the id's string) is built only for the entries read."""

    __slots__ = ("_data", "_json", "_names", "_offsets", "_scores")

    def __init__(self, data: bytes, lengths: np.ndarray, scores: np.ndarray) -> None:
        if len(lengths) != len(scores):
            raise UnreadableResults("stored results: nodes and scores differ in length")
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if int(offsets[-1]) != len(data):
            raise UnreadableResults("stored results: the node lengths do not add up")
        self._data = data
        self._offsets = offsets
        self._scores = np.asarray(scores, dtype=np.float64)
        self._names: list[str] | None = None  # every id, once all were asked for
        self._json: str | None = None  # results_json, once computed (the values never change)

    @classmethod
    def of_lists(cls, nodes: list[str], scores: Sequence[float] | np.ndarray) -> StoredResults:
        data, lengths = utf8_join(nodes)
        stored = cls(data, lengths, np.asarray(scores, dtype=np.float64))
        stored._names = list(nodes)
        return stored

    def columns(self) -> tuple[bytes, np.ndarray, np.ndarray]:
        """(UTF-8 bytes of the ids, each id's length in bytes, the scores)."""
        return self._data, np.diff(self._offsets), self._scores

    def _name(self, i: int) -> str:
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._data[lo:hi].decode("utf-8")

    def __len__(self) -> int:
        return int(self._scores.shape[0])

    @overload
    def __getitem__(self, index: int) -> RankedNode: ...

    @overload
    def __getitem__(self, index: slice) -> list[RankedNode]: ...

    def __getitem__(self, index: int | slice) -> RankedNode | list[RankedNode]:
        if isinstance(index, slice):
            positions = range(len(self))[index]
            scores = self._scores[index].tolist()
            if self._names is not None:
                names = self._names[index]
            elif positions.step == 1:  # a run of ids (a top k): their offsets read at once
                ends = self._offsets[positions.start : positions.stop + 1].tolist()
                data = self._data
                names = [data[lo:hi].decode("utf-8") for lo, hi in pairwise(ends)]
            else:
                names = [self._name(i) for i in positions]
            return [RankedNode(n, s) for n, s in zip(names, scores, strict=True)]
        i = range(len(self))[index]  # IndexError past the end, as a list
        name = self._names[i] if self._names is not None else self._name(i)
        return RankedNode(name, float(self._scores[i]))

    def __iter__(self) -> Iterator[RankedNode]:
        if self._names is None:
            self._names = [self._name(i) for i in range(len(self))]
        for node, score in zip(self._names, self._scores.tolist(), strict=True):
            yield RankedNode(node, score)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _unb64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise UnreadableResults(f"stored results: {what} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise UnreadableResults(f"stored results: {what} is not base64") from exc


def decode_results(stored: Any) -> Sequence[RankedNode]:
    if isinstance(stored, list):  # the pair-list form
        try:
            return [RankedNode(str(node), float(score)) for node, score in stored]
        except (TypeError, ValueError) as exc:
            raise UnreadableResults("stored results: a pair is not [node, score]") from exc
    if not isinstance(stored, dict) or stored.get("format") not in (FORMAT, FORMAT_NODE_LIST):
        raise UnreadableResults("stored results are in an unknown form")
    raw_scores = _unb64(stored.get("scores"), "scores")
    if len(raw_scores) % 8:
        raise UnreadableResults("stored results: the scores are not float64")
    scores = np.frombuffer(raw_scores, dtype="<f8")
    if stored["format"] == FORMAT_NODE_LIST:
        nodes = stored.get("nodes")
        if not isinstance(nodes, list) or len(nodes) != len(scores):
            raise UnreadableResults("stored results: nodes and scores differ in length")
        if not all(isinstance(node, str) for node in nodes):
            raise UnreadableResults("stored results: a node id is not a string")
        return StoredResults.of_lists(nodes, scores)
    width = stored.get("length_bytes")
    if type(width) is not int or width not in (1, 4):
        raise UnreadableResults("stored results: the node lengths have no known width")
    raw_lengths = _unb64(stored.get("lengths"), "lengths")
    if len(raw_lengths) % width:
        raise UnreadableResults("stored results: the node lengths are cut short")
    lengths = np.frombuffer(raw_lengths, dtype=f"<u{width}")
    data = _unb64(stored.get("nodes"), "nodes")
    results = StoredResults(data, lengths, scores)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableResults("stored results: the node ids are not UTF-8") from exc
    # Valid UTF-8 as a whole, and no id starts inside a character (on a continuation byte
    # 0b10xxxxxx): then every id on its own is valid UTF-8.
    starts = results._offsets[:-1][lengths > 0]
    if len(starts) and np.any(np.frombuffer(data, dtype=np.uint8)[starts] & 0xC0 == 0x80):
        raise UnreadableResults("stored results: a node id starts inside a character")
    return results
