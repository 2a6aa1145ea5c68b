"""The stored form of a released ranking: compact, exact, and cheap to write and read.

A release keeps up to ``PPR_REPLAY_STORE_TOP`` (1000) results so that replays can answer any
k, and is written twice per fresh query (ledger row and replay cache). Four forms exist;
readers accept all of them:

- ``zlib:lengths+utf8+f64planes`` (written now): one base64 field ``packed``, DEFLATE (zlib,
  level 1; run-length matching when every id is decimal digits, :func:`deflate`) of the ids'
  lengths in bytes (``length_bytes`` each: one when every id is shorter
  than 256 bytes, else four), the ids' UTF-8 bytes concatenated, and the scores' float64
  bytes by byte plane (every score's lowest byte, then every score's next byte, ...), with
  the number of results in ``count`` and the inflated bytes in ``size`` (inflating stops
  there: a corrupted document cannot blow up). Released scores are multiples of a
  power-of-two grid with few significant bits, and ranked, so their planes repeat: a release
  of 1,000 results on ego-Facebook takes about 4.3 kB of text in this form against 17 kB in
  the form before (PostgreSQL compressed that to 8.9 kB; it cannot compress this one
  further), and ids are still built lazily, so a replay of k = 20 decodes 20 ids.
- ``utf8+lengths+f64le``: the same three columns uncompressed, each base64 in its own field
  (``nodes``, ``lengths``, ``length_bytes``, ``scores``).
- ``nodes+f64le``: the node ids as a JSON list of strings, and the scores as above.
- a JSON list of ``[node, score]`` pairs (the first form).

The scores are the same float64 values bit for bit in every form.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, overload

import numpy as np

from service.graph.node_ids import utf8_join
from service.mechanisms.postprocess import RankedNode

#: The form written now, and the two before it (JSON objects; the first form is a list).
FORMAT = "zlib:lengths+utf8+f64planes"
FORMAT_COLUMNS = "utf8+lengths+f64le"
FORMAT_NODE_LIST = "nodes+f64le"
#: DEFLATE's level for the packed form: level 1 packs a release within 4% of level 6's size in
#: under half its time.
_ZLIB_LEVEL = 1
#: zlib's hash memory level (1-9, default 8) for the releases whose ids are all digits.
_DIGITS_MEM_LEVEL = 6


def deflate(body: bytes, digits_only: bool) -> bytes:
    """The packed form's DEFLATE stream of ``body`` (zlib's format, which every reader inflates
    alike). When every id is decimal digits (a graph loaded from integer ids), zlib looks only
    for runs (``Z_RLE``, with hash memory level 6): on 50 ego-Facebook releases of 1,000
    results, 57 against 82 us a release with the caches cold, and 3,034 against 3,255 bytes.
    Ids with other characters keep zlib's default matching, which finds their repeated
    substrings: ids like ``user_0123456`` came out 25% larger with ``Z_RLE``."""
    if not digits_only:
        return zlib.compress(body, _ZLIB_LEVEL)
    packer = zlib.compressobj(
        _ZLIB_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS, _DIGITS_MEM_LEVEL, zlib.Z_RLE
    )
    return packer.compress(body) + packer.flush()


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
    count = len(scores)
    planes = np.asarray(scores, dtype="<f8").view(np.uint8).reshape(count, 8).T.tobytes()
    body = np.asarray(lengths).astype(width).tobytes() + data + planes
    return {
        "format": FORMAT,
        "count": count,
        "length_bytes": np.dtype(width).itemsize,
        "size": len(body),
        "packed": _b64(deflate(body, data.isdigit())),
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
    known = (FORMAT, FORMAT_COLUMNS, FORMAT_NODE_LIST)
    if not isinstance(stored, dict) or stored.get("format") not in known:
        raise UnreadableResults("stored results are in an unknown form")
    if stored["format"] == FORMAT:
        return _decode_packed(stored)
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
    width = _length_width(stored)
    raw_lengths = _unb64(stored.get("lengths"), "lengths")
    if len(raw_lengths) % width:
        raise UnreadableResults("stored results: the node lengths are cut short")
    lengths = np.frombuffer(raw_lengths, dtype=f"<u{width}")
    return _checked_results(_unb64(stored.get("nodes"), "nodes"), lengths, scores)


def _length_width(stored: dict[str, Any]) -> int:
    width = stored.get("length_bytes")
    if type(width) is not int or width not in (1, 4):
        raise UnreadableResults("stored results: the node lengths have no known width")
    return width


def _decode_packed(stored: dict[str, Any]) -> StoredResults:
    """The packed form: inflated to no more than its stated ``size``, then split into its three
    columns (``count`` lengths, the ids' bytes, ``count`` scores by byte plane)."""
    count, size = stored.get("count"), stored.get("size")
    if type(count) is not int or count < 0 or type(size) is not int or size < 0:
        raise UnreadableResults("stored results: the count or size is not a whole number")
    width = _length_width(stored)
    packed = _unb64(stored.get("packed"), "packed")
    inflate = zlib.decompressobj()
    try:
        body = inflate.decompress(packed, size + 1)
    except zlib.error as exc:
        raise UnreadableResults("stored results: packed is not zlib data") from exc
    if len(body) != size or not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
        raise UnreadableResults("stored results: packed is not size bytes of zlib data alone")
    head, tail = count * width, size - 8 * count
    if tail < head:
        raise UnreadableResults("stored results: packed holds fewer than count results")
    lengths = np.frombuffer(body, dtype=f"<u{width}", count=count)
    planes = np.frombuffer(body, dtype=np.uint8, count=8 * count, offset=tail)
    scores = planes.reshape(8, count).T.copy().view("<f8").reshape(count)
    return _checked_results(body[head:tail], lengths, scores)


def _checked_results(data: bytes, lengths: np.ndarray, scores: np.ndarray) -> StoredResults:
    """The columns as results, once the ids are known to be UTF-8 each."""
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
