"""Loading edge-list files into the immutable :class:`Graph`, vectorised.

Accepted format (documented for users in :func:`load_edge_list`):

* One edge per line: two node ids separated by any run of spaces, tabs and commas. Line
  endings ``\\n`` or ``\\r\\n`` (a file with only ``\\r`` line ends is accepted too).
* Node ids are arbitrary tokens without whitespace or commas, at most
  :data:`MAX_ID_BYTES` bytes of UTF-8. Ids are kept as strings exactly as written (``"007"``
  stays ``"007"``, distinct from ``"7"``). There is no CSV quoting.
* A third column (a weight, a timestamp) is ignored: a warning is logged and
  ``stats.weights_ignored`` is set. Further columns are ignored likewise (warning, and
  ``stats.extra_columns_ignored``); only the first two fields of a line are ever read.
* Comment lines: the first non-blank character is ``#`` or ``%``. No trailing comments.
* Blank lines are skipped. Line numbers in errors count every physical line from 1.
* Header: see :func:`load_edge_list`. A Matrix Market file (first line ``%%MatrixMarket``)
  has its size line skipped.
* Compression: gzip, bzip2 and xz, detected by magic bytes whatever the file name.
* The graph is undirected: ``u v`` and ``v u`` are the same edge. Self-loops and repeated
  edges are dropped and counted in ``stats``. A node that appears only in self-loops is kept
  (isolated).

How it stays fast: the decompressed bytes are cut into ~16 MB slices at line ends and each
slice is tokenised with numpy (separator lookup table, token boundaries by ``diff``, line of a
token by ``searchsorted`` on newline positions). When every id is a plain decimal integer the
ids are parsed digit position by digit position (no string objects at all) and mapped to
indices with a dense table (or a sort when they are sparse); otherwise the id tokens are
copied into fixed-width byte arrays (bucketed by length; ids of up to 8 bytes become uint64
keys) and deduplicated by sorting. No Python loop runs per line or per id token; the only
per-node work is making the id strings and the id -> index dict.
"""

from __future__ import annotations

import bisect
import bz2
import gzip
import logging
import lzma
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.errors import GraphLoadError
from service.graph.build import (
    INT32_MAX,
    assemble_graph,
    canonical_edge_keys,
    canonical_order,
    index_dtype,
    sorted_unique,
)
from service.graph.model import Graph

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 24
"""Target size of one tokenised slice; bounds the temporary arrays of the parser."""
MAX_ID_BYTES = 1024
"""Longest node id accepted (UTF-8 bytes)."""
MAX_INT_DIGITS = 18
"""Integer ids of more digits are handled as strings (they would not fit in int64)."""

_WIDTHS = np.array([8, 16, 32, 64, 128, 256, 512, MAX_ID_BYTES], dtype=np.int64)

_SEPARATOR = np.zeros(256, dtype=bool)
_SEPARATOR[list(b" \t\r\n\v\f,")] = True
_DIGIT_OR_SEPARATOR = _SEPARATOR.copy()
_DIGIT_OR_SEPARATOR[ord("0") : ord("9") + 1] = True
_NEWLINE = 10
_COMMENT_CHARS = (ord("#"), ord("%"))

_FIRST_DATA_LINE = re.compile(rb"^[ \t\r\v\f,]*[^ \t\r\v\f,\n#%][^\n]*", re.MULTILINE)
_FIELDS = re.compile(r"[ \t\r\v\f,]+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_COLUMN_NAME = re.compile(
    r"(?:source|src|from|target|tgt|dst|dest|destination|to|head|tail|node|vertex|"
    r"user|id|start|end|left|right)(?:[ _.-]?(?:id|node|name|[0-9])){0,2}"
)
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZ2_BLOCK_MAGIC = (b"1AY&SY", b"\x17rE8P\x90")


def load_edge_list(
    path: str | os.PathLike[str],
    *,
    header: bool | None = None,
    raw: bytes | None = None,
    nodes: Sequence[str] | None = None,
) -> Graph:
    """Load an undirected edge-list file (plain, gzip, bzip2 or xz) into a :class:`Graph`.

    See the module docstring for the format. ``header``: ``True`` drops the first non-comment
    line, ``False`` reads it as an edge, ``None`` (default) decides. The first line is a header
    when its first two fields are both non-numeric and either

    * every other id in the file is an integer (e.g. ``FromNodeId ToNodeId`` or ``a b`` over
      integer ids), or
    * both are column names (case-insensitive, optionally quoted: ``source``, ``target``,
      ``src``, ``dst``, ``from``, ``to``, ``node``, ``id``, ``user``, ... optionally with a
      suffix like ``_id`` or ``1``: ``source,target``, ``from to weight``, ``node1 node2``)
      and neither occurs as a node id anywhere else in the file.

    So a file of string ids whose first edge happens to read ``alice bob`` is not affected.

    Node ids are external ids (``str``); the internal order is numeric when every id is a plain
    decimal integer (no sign, no leading zero, at most 18 digits), else by UTF-8 bytes. Raises
    :class:`GraphLoadError` naming the file (and the line where there is one) for a missing or
    unreadable file, corrupt compressed data, an empty or comment-only file, a line with a
    single field, bytes that are not UTF-8, a NUL byte, an over-long id, or no edge left after
    dropping self-loops.

    ``raw``: the file's bytes when the caller has read them already (so that a fingerprint of
    those bytes describes exactly the graph loaded); ``path`` then only names the file.

    ``nodes``: the node set, given (e.g. by :func:`read_node_list`) rather than derived from
    the edges. Every listed node is in the graph, with or without edges; an edge naming a node
    not listed is refused with its line number. Without it the node set is the ids the edges
    name (and is then public: see docs/privacy.md).
    """
    name = str(path)
    data = _read_text_bytes(Path(path), name, raw)
    first = _first_data_line(data)
    if first is None:
        what = "the file is empty" if not data.strip() else "the file holds only comments"
        raise GraphLoadError(name, f"no edges: {what}")
    first_line, first_fields = first
    matrix_market = data.startswith(b"%%MatrixMarket")
    maybe_header = header is None and not matrix_market and _non_numeric(first_fields)
    skip = first_line if matrix_market or header is True or maybe_header else None

    parsed = _parse_integer_ids(data, name, skip)
    if parsed is None:  # some id is not an integer
        if maybe_header and not _looks_like_column_names(first_fields):
            skip = None
        parsed = _parse_string_ids(data, name, skip)
        if maybe_header and skip is not None and _any_is_node(first_fields[:2], parsed):
            skip = None  # the "column names" are node ids: the first line is an edge
            parsed = _parse_string_ids(data, name, skip)
    if nodes is not None:
        parsed = _onto_listed_nodes(parsed, nodes, data, name, skip)
    del data
    header_skipped = skip is not None and not matrix_market
    if header_skipped:
        log.info("%s: line %d read as a header and skipped: %s", name, skip, first_fields)
    return _finish(parsed, name, header_skipped=header_skipped)


# --------------------------------------------------------------------------- node lists


def read_node_list(path: str | os.PathLike[str]) -> list[str]:
    """The node ids of a node-list file: one id per line (plain or compressed like an edge
    list; blank lines and comment lines skipped, surrounding spaces stripped).

    Raises :class:`GraphLoadError` with the line number for an id holding a separator (space,
    tab, comma), an id over :data:`MAX_ID_BYTES` bytes or a repeated id, and for a file that
    lists no node.
    """
    name = str(path)
    text = _read_text_bytes(Path(path), name).decode("utf-8")
    ids: list[str] = []
    seen: set[str] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        node = line.strip(" \t\r\v\f")
        if not node or node[0] in "#%":
            continue
        if _FIELDS.search(node):
            raise GraphLoadError(name, f"one node id per line, got {_shorten(node)!r}", line=number)
        if len(node.encode("utf-8")) > MAX_ID_BYTES:
            raise GraphLoadError(name, f"node id longer than {MAX_ID_BYTES} bytes", line=number)
        if node in seen:
            raise GraphLoadError(name, f"node {_shorten(node)!r} is listed twice", line=number)
        seen.add(node)
        ids.append(node)
    if not ids:
        raise GraphLoadError(name, "the node list names no node")
    return ids


def _onto_listed_nodes(
    parsed: _Parsed, nodes: Sequence[str], data: bytes, name: str, skip: int | None
) -> _Parsed:
    """``parsed`` re-indexed onto the listed node set (in canonical order); an edge naming a
    node not listed is refused with the first line that names one."""
    listed = [str(node) for node in nodes]
    order = canonical_order(listed)
    listed = [listed[i] for i in order.tolist()]
    position = {node: i for i, node in enumerate(listed)}
    remap = np.empty(len(parsed.node_ids), dtype=np.int64)
    for i, node in enumerate(parsed.node_ids):
        at = position.get(node)
        if at is None:
            line = _first_line_naming(data, node, skip)
            raise GraphLoadError(
                name, f"edge names node {_shorten(node)!r}, which is not in the node list",
                line=line,
            )  # fmt: skip
        remap[i] = at
    endpoints = remap[parsed.endpoints]
    return _Parsed(node_ids=listed, endpoints=endpoints, columns=parsed.columns)


def _first_line_naming(data: bytes, node: str, skip: int | None) -> int | None:
    """The first edge line (1-based) whose first two fields include ``node`` (error path)."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        if number == skip:
            continue
        text = line.decode("utf-8", errors="replace").strip(" \t\r\v\f,")
        if not text or text[0] in "#%":
            continue
        if node in _FIELDS.split(text)[:2]:
            return number
    return None


# --------------------------------------------------------------------------- reading


def _read_text_bytes(path: Path, name: str, raw: bytes | None = None) -> bytes:
    """The file's bytes, decompressed, UTF-8 checked, BOM removed, line ends normalised."""
    try:
        if raw is None:
            raw = path.read_bytes()
    except FileNotFoundError:
        raise GraphLoadError(name, "no such file") from None
    except IsADirectoryError:
        raise GraphLoadError(name, "is a directory, not an edge-list file") from None
    except PermissionError:
        raise GraphLoadError(name, "permission denied") from None
    except OSError as exc:
        raise GraphLoadError(name, f"cannot read the file: {exc.strerror or exc}") from None
    data = _decompress(raw, name)
    del raw
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise GraphLoadError(name, "the file is UTF-16 encoded; save it as UTF-8", line=1)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise GraphLoadError(
            name, "NUL byte: this is a binary file, not a text edge list", line=_line_at(data, nul)
        )
    if b"\n" not in data and b"\r" in data:
        data = data.replace(b"\r", b"\n")
    _check_utf8(data, name)
    return data


def _decompress(raw: bytes, name: str) -> bytes:
    try:
        if raw.startswith(_GZIP_MAGIC):
            return gzip.decompress(raw)
        if raw.startswith(_XZ_MAGIC):
            return lzma.decompress(raw)
        if raw[:3] == b"BZh" and raw[3:4].isdigit() and raw[4:10] in _BZ2_BLOCK_MAGIC:
            return bz2.decompress(raw)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError) as exc:
        raise GraphLoadError(name, f"corrupt compressed data: {exc}") from None
    if raw.startswith(b"PK\x03\x04"):
        raise GraphLoadError(name, "zip archives are not supported; unzip or gzip the file")
    return raw


def _check_utf8(data: bytes, name: str) -> None:
    if data.isascii():
        return
    view = memoryview(data)
    for start, stop in _slices(data):
        try:
            str(view[start:stop], "utf-8")
        except UnicodeDecodeError as exc:
            at = start + exc.start
            raise GraphLoadError(
                name,
                f"byte 0x{data[at]:02x} is not valid UTF-8 (the file must be UTF-8 text)",
                line=_line_at(data, at),
            ) from None


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _slices(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, stop) byte ranges of about CHUNK_BYTES, each ending just after a newline."""
    start, size = 0, len(data)
    while start < size:
        stop = data.find(b"\n", min(start + CHUNK_BYTES, size) - 1)
        stop = size if stop < 0 else stop + 1
        yield start, stop
        start = stop


# --------------------------------------------------------------------------- header


def _first_data_line(data: bytes) -> tuple[int, list[str]] | None:
    match = _FIRST_DATA_LINE.search(data)
    if match is None:
        return None
    fields = _FIELDS.split(match.group().decode("utf-8", "replace").strip(" \t\r\v\f,"))
    return _line_at(data, match.start()), fields


def _looks_like_column_names(fields: list[str]) -> bool:
    names = [f.strip("\"'").lower() for f in fields[:2]]
    return len(names) == 2 and all(_COLUMN_NAME.fullmatch(f) for f in names)


def _any_is_node(fields: list[str], parsed: _Parsed) -> bool:
    ids = parsed.node_ids  # sorted by UTF-8 bytes, which is str order
    for f in fields:
        at = bisect.bisect_left(ids, f)
        if at < len(ids) and ids[at] == f:
            return True
    return False


def _non_numeric(fields: list[str]) -> bool:
    return len(fields) >= 2 and not any(_NUMBER.fullmatch(f) for f in fields[:2])


# --------------------------------------------------------------------------- tokenising


@dataclass
class _Chunk:
    """The id fields of one slice: ``starts``/``lengths`` interleave (src, dst) per edge line."""

    buf: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    lines: np.ndarray  # 1-based file line of each id field
    columns: int  # most fields on one data line of the slice


@dataclass
class _Parsed:
    node_ids: list[str]
    endpoints: np.ndarray  # interleaved (src, dst) internal indices in canonical node order
    columns: int


def _chunks(data: bytes, name: str, skip: int | None) -> Iterator[_Chunk]:
    buf_all = np.frombuffer(data, dtype=np.uint8)
    line_base = 0
    for start, stop in _slices(data):
        buf = buf_all[start:stop]
        newlines = np.flatnonzero(buf == _NEWLINE)
        chunk = _tokenise(buf, newlines, line_base, name, skip)
        line_base += int(newlines.size)
        if chunk is not None:
            yield chunk


def _tokenise(
    buf: np.ndarray, newlines: np.ndarray, line_base: int, name: str, skip: int | None
) -> _Chunk | None:
    in_token = ~_SEPARATOR[buf]
    step = np.diff(in_token.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    del in_token
    starts = np.flatnonzero(step == 1)
    ends = np.flatnonzero(step == -1)
    del step
    if starts.size == 0:
        return None
    line = np.searchsorted(newlines, starts)  # 0-based line within the slice
    first = np.ones(starts.size, dtype=bool)
    np.not_equal(line[1:], line[:-1], out=first[1:])
    heads = np.flatnonzero(first)  # first field of each non-blank line
    del first
    counts = np.diff(heads, append=starts.size)
    head_char = buf[starts[heads]]
    keep = (head_char != _COMMENT_CHARS[0]) & (head_char != _COMMENT_CHARS[1])
    if skip is not None:
        keep &= line[heads] + line_base + 1 != skip
    heads, counts = heads[keep], counts[keep]
    if heads.size == 0:
        return None
    single = np.flatnonzero(counts == 1)
    if single.size:
        t = int(heads[single[0]])
        token = bytes(buf[starts[t] : ends[t]]).decode("utf-8", "replace")
        raise GraphLoadError(
            name,
            f"only one field ({_shorten(token)!r}); expected two node ids separated by "
            "whitespace, a comma or a tab",
            line=int(line[t]) + line_base + 1,
        )
    ids = np.empty(2 * heads.size, dtype=np.int64)
    ids[0::2] = heads
    ids[1::2] = heads + 1
    s = starts[ids]
    return _Chunk(
        buf=buf,
        starts=s,
        lengths=ends[ids] - s,
        lines=line[ids] + (line_base + 1),
        columns=int(counts.max()),
    )


def _shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- integer ids


def _parse_integer_ids(data: bytes, name: str, skip: int | None) -> _Parsed | None:
    """Parse when every id is a plain decimal integer; None as soon as one is not."""
    values: list[np.ndarray] = []
    columns = 0
    for chunk in _chunks(data, name, skip):
        parsed = _chunk_integers(chunk)
        if parsed is None:
            return None
        values.append(parsed)
        columns = max(columns, chunk.columns)
    if not values:
        return _Parsed([], np.empty(0, dtype=np.int64), columns)
    allv = np.concatenate(values)
    del values
    top = int(allv.max())
    if top < 2 * allv.size + (1 << 20):
        present = np.zeros(top + 1, dtype=bool)
        present[allv] = True
        unique = np.flatnonzero(present)
        remap = np.cumsum(present, dtype=index_dtype(unique.size))
        del present
        remap -= 1
        endpoints = remap[allv]
        del remap
    else:
        unique, endpoints = _unique_inverse(allv)
    del allv
    node_ids = list(map(str, unique.tolist()))
    return _Parsed(node_ids, endpoints, columns)


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and the index of each value among them (faster than
    ``np.unique(return_inverse=True)``, which uses a stable sort)."""
    order = np.argsort(values)
    ordered = values[order]
    fresh = np.empty(values.size, dtype=bool)
    fresh[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=fresh[1:])
    unique = ordered[fresh]
    del ordered
    codes = np.cumsum(fresh, dtype=index_dtype(unique.size))
    codes -= 1
    inverse = np.empty(values.size, dtype=codes.dtype)
    inverse[order] = codes
    return unique, inverse


def _chunk_integers(chunk: _Chunk) -> np.ndarray | None:
    buf, starts, lengths = chunk.buf, chunk.starts, chunk.lengths
    longest = int(lengths.max())
    if longest > MAX_INT_DIGITS:
        return None
    head = buf[starts]
    if not np.all(_DIGIT_OR_SEPARATOR[head]):
        return None  # quick exit for most string ids
    if np.any((head == ord("0")) & (lengths > 1)):
        return None  # leading zeros: keep the ids as written, as strings
    odd = np.flatnonzero(~_DIGIT_OR_SEPARATOR[buf])
    if odd.size:
        # an odd byte inside an id field makes this a string-id file; elsewhere it is a
        # comment or an ignored column
        field_at = np.searchsorted(starts, odd, side="right") - 1
        ok = field_at >= 0
        inside = odd[ok] < starts[field_at[ok]] + lengths[field_at[ok]]
        if np.any(inside):
            return None
    values = np.zeros(starts.size, dtype=np.int64)
    last = buf.size - 1
    for k in range(longest):
        digit = buf[np.minimum(starts + k, last)].astype(np.int64) - ord("0")
        more = lengths > k
        values = np.where(more, values * 10 + digit, values)
    if int(values.max()) <= INT32_MAX:
        return values.astype(np.int32)
    return values


# --------------------------------------------------------------------------- string ids


@dataclass
class _Piece:
    """Ids of one length bucket of one slice: ``unique`` values and codes of each field."""

    bucket: int
    unique: np.ndarray
    inverse: np.ndarray
    where: np.ndarray  # positions in the file-wide endpoint array


def _parse_string_ids(data: bytes, name: str, skip: int | None) -> _Parsed:
    pieces: list[_Piece] = []
    columns = 0
    total = 0
    for chunk in _chunks(data, name, skip):
        columns = max(columns, chunk.columns)
        too_long = np.flatnonzero(chunk.lengths > MAX_ID_BYTES)
        if too_long.size:
            i = int(too_long[0])
            raise GraphLoadError(
                name,
                f"node id of {int(chunk.lengths[i])} bytes; the limit is {MAX_ID_BYTES}",
                line=int(chunk.lines[i]),
            )
        bucket = np.searchsorted(_WIDTHS, chunk.lengths)
        for b in np.unique(bucket).tolist():
            members = np.flatnonzero(bucket == b)
            keys = _sort_keys(_fixed_width(chunk, members, int(_WIDTHS[b])))
            unique, inverse = _unique_inverse(keys)
            pieces.append(_Piece(b, unique, inverse, members + total))
        total += int(chunk.starts.size)
    if not pieces:
        return _Parsed([], np.empty(0, dtype=np.int64), columns)
    # Ids of different lengths fall in different buckets, so buckets never share an id.
    per_bucket: dict[int, np.ndarray] = {}
    for b in sorted({p.bucket for p in pieces}):
        per_bucket[b] = sorted_unique(np.concatenate([p.unique for p in pieces if p.bucket == b]))
    offsets: dict[int, int] = {}
    at = 0
    for b, unique in per_bucket.items():
        offsets[b] = at
        at += int(unique.size)
    # as bytes strings, widened to the longest width
    everything = np.concatenate([_as_bytes(unique) for unique in per_bucket.values()])
    order = np.argsort(everything, kind="stable")  # byte order == canonical string order
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size, dtype=np.int64)
    node_ids = [b.decode("utf-8") for b in everything[order].tolist()]
    del everything, order
    endpoints = np.empty(total, dtype=index_dtype(len(node_ids)))
    for p in pieces:
        codes = rank[offsets[p.bucket] + np.searchsorted(per_bucket[p.bucket], p.unique)]
        endpoints[p.where] = codes[p.inverse]
    return _Parsed(node_ids, endpoints, columns)


def _sort_keys(padded: np.ndarray) -> np.ndarray:
    """Ids of 8 bytes as big-endian uint64 (same order, sorts much faster), others as is."""
    if padded.dtype.itemsize == 8:
        return padded.view(">u8").astype(np.uint64)
    return padded


def _as_bytes(keys: np.ndarray) -> np.ndarray:
    """Undo :func:`_sort_keys`."""
    if keys.dtype == np.uint64:
        return keys.astype(">u8").view("S8")
    return keys


def _fixed_width(chunk: _Chunk, members: np.ndarray, width: int) -> np.ndarray:
    """The id fields ``members`` of a slice as a NUL-padded ``S{width}`` array."""
    starts = chunk.starts[members]
    lengths = chunk.lengths[members]
    last = chunk.buf.size - 1
    matrix = np.zeros((members.size, width), dtype=np.uint8)
    for k in range(int(lengths.max())):
        column = chunk.buf[np.minimum(starts + k, last)]
        matrix[:, k] = np.where(lengths > k, column, 0)
    return matrix.view(f"S{width}").ravel()


# --------------------------------------------------------------------------- graph


def _finish(parsed: _Parsed, name: str, *, header_skipped: bool) -> Graph:
    n = len(parsed.node_ids)
    if parsed.endpoints.size == 0:
        raise GraphLoadError(name, "no edges: nothing but a header and comments")
    endpoints, parsed.endpoints = parsed.endpoints, np.empty(0, dtype=np.int64)
    keys, loops, duplicates = canonical_edge_keys(endpoints[0::2], endpoints[1::2], n)
    del endpoints
    if keys.size == 0:
        raise GraphLoadError(
            name, f"no edges left after dropping {loops} self-loop(s) and duplicates"
        )
    weights = parsed.columns >= 3
    extra = parsed.columns >= 4
    if extra:
        log.warning(
            "%s: lines have up to %d fields; only the first two (the node ids) are read, "
            "the rest (weights, timestamps, ...) are ignored",
            name,
            parsed.columns,
        )
    elif weights:
        log.warning("%s: third column (edge weights) ignored; the graph is unweighted", name)
    graph = assemble_graph(
        keys,
        parsed.node_ids,
        self_loops_dropped=loops,
        duplicate_edges_dropped=duplicates,
        source=name,
        weights_ignored=weights,
        extra_columns_ignored=extra,
        header_skipped=header_skipped,
    )
    if loops or duplicates:
        log.info(
            "%s: dropped %d self-loop(s) and %d duplicate edge record(s)", name, loops, duplicates
        )
    return graph
