"""Tokenising an edge list's text into its node ids, vectorised, and mapping the ids to
internal indices in canonical node order.

Each slice of the text (cut at line ends, :func:`service.graph.edge_file.slices`) is
tokenised with numpy: a separator lookup table, token boundaries by ``diff``, the line of a
token by ``searchsorted`` on newline positions; only the first two fields of a data line are
ids. When every id is a plain decimal integer the ids are parsed digit position by digit
position (no string objects at all) and mapped to indices with a dense table (or a sort when
they are sparse); otherwise the id tokens are copied into fixed-width byte arrays (bucketed by
length; ids of up to 8 bytes become uint64 keys) and deduplicated by sorting. No Python loop
runs per line or per id token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from service.errors import GraphLoadError
from service.graph.build import INT32_MAX, index_dtype, sorted_unique
from service.graph.edge_file import slices

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


@dataclass
class _Chunk:
    """The id fields of one slice: ``starts``/``lengths`` interleave (src, dst) per edge line."""

    buf: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    lines: np.ndarray  # 1-based file line of each id field
    columns: int  # most fields on one data line of the slice


@dataclass
class Parsed:
    node_ids: list[str]
    endpoints: np.ndarray  # interleaved (src, dst) internal indices in canonical node order
    columns: int


def _chunks(data: bytes, name: str, skip: int | None, chunk_bytes: int) -> Iterator[_Chunk]:
    buf_all = np.frombuffer(data, dtype=np.uint8)
    line_base = 0
    for start, stop in slices(data, chunk_bytes):
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
            f"only one field ({shorten(token)!r}); expected two node ids separated by "
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


def shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- integer ids


def parse_integer_ids(
    data: bytes, name: str, skip: int | None, *, chunk_bytes: int
) -> Parsed | None:
    """Parse when every id is a plain decimal integer; None as soon as one is not."""
    values: list[np.ndarray] = []
    columns = 0
    for chunk in _chunks(data, name, skip, chunk_bytes):
        parsed = _chunk_integers(chunk)
        if parsed is None:
            return None
        values.append(parsed)
        columns = max(columns, chunk.columns)
    if not values:
        return Parsed([], np.empty(0, dtype=np.int64), columns)
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
    return Parsed(node_ids, endpoints, columns)


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


def parse_string_ids(data: bytes, name: str, skip: int | None, *, chunk_bytes: int) -> Parsed:
    pieces: list[_Piece] = []
    columns = 0
    total = 0
    for chunk in _chunks(data, name, skip, chunk_bytes):
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
        return Parsed([], np.empty(0, dtype=np.int64), columns)
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
    return Parsed(node_ids, endpoints, columns)


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
