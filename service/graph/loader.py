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
slice is tokenised with numpy, integer ids parsed without string objects and string ids
deduplicated by sorting fixed-width byte arrays; no Python loop runs per line or per id token,
the only per-node work is making the id strings and the id -> index dict. The parts:
:mod:`service.graph.edge_file` reads the file's text, :mod:`service.graph.edge_tokens` turns
it into ids and endpoints; this module decides on the header, applies a node list and
builds the :class:`Graph`.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from service.errors import GraphLoadError
from service.graph.build import assemble_graph, canonical_edge_keys, canonical_order
from service.graph.edge_file import line_at, read_text_bytes
from service.graph.edge_tokens import MAX_ID_BYTES as MAX_ID_BYTES
from service.graph.edge_tokens import Parsed, parse_integer_ids, parse_string_ids, shorten
from service.graph.model import Graph

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 24
"""Target size of one tokenised slice; bounds the temporary arrays of the parser."""

_FIRST_DATA_LINE = re.compile(rb"^[ \t\r\v\f,]*[^ \t\r\v\f,\n#%][^\n]*", re.MULTILINE)
_FIELDS = re.compile(r"[ \t\r\v\f,]+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_COLUMN_NAME = re.compile(
    r"(?:source|src|from|target|tgt|dst|dest|destination|to|head|tail|node|vertex|"
    r"user|id|start|end|left|right)(?:[ _.-]?(?:id|node|name|[0-9])){0,2}"
)


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
    data = read_text_bytes(Path(path), name, raw, chunk_bytes=CHUNK_BYTES)
    first = _first_data_line(data)
    if first is None:
        what = "the file is empty" if not data.strip() else "the file holds only comments"
        raise GraphLoadError(name, f"no edges: {what}")
    first_line, first_fields = first
    matrix_market = data.startswith(b"%%MatrixMarket")
    maybe_header = header is None and not matrix_market and _non_numeric(first_fields)
    skip = first_line if matrix_market or header is True or maybe_header else None

    parsed = parse_integer_ids(data, name, skip, chunk_bytes=CHUNK_BYTES)
    if parsed is None:  # some id is not an integer
        if maybe_header and not _looks_like_column_names(first_fields):
            skip = None
        parsed = parse_string_ids(data, name, skip, chunk_bytes=CHUNK_BYTES)
        if maybe_header and skip is not None and _any_is_node(first_fields[:2], parsed):
            skip = None  # the "column names" are node ids: the first line is an edge
            parsed = parse_string_ids(data, name, skip, chunk_bytes=CHUNK_BYTES)
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
    text = read_text_bytes(Path(path), name, chunk_bytes=CHUNK_BYTES).decode("utf-8")
    ids: list[str] = []
    seen: set[str] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        node = line.strip(" \t\r\v\f")
        if not node or node[0] in "#%":
            continue
        if _FIELDS.search(node):
            raise GraphLoadError(name, f"one node id per line, got {shorten(node)!r}", line=number)
        if len(node.encode("utf-8")) > MAX_ID_BYTES:
            raise GraphLoadError(name, f"node id longer than {MAX_ID_BYTES} bytes", line=number)
        if node in seen:
            raise GraphLoadError(name, f"node {shorten(node)!r} is listed twice", line=number)
        seen.add(node)
        ids.append(node)
    if not ids:
        raise GraphLoadError(name, "the node list names no node")
    return ids


def _onto_listed_nodes(
    parsed: Parsed, nodes: Sequence[str], data: bytes, name: str, skip: int | None
) -> Parsed:
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
                name, f"edge names node {shorten(node)!r}, which is not in the node list",
                line=line,
            )  # fmt: skip
        remap[i] = at
    endpoints = remap[parsed.endpoints]
    return Parsed(node_ids=listed, endpoints=endpoints, columns=parsed.columns)


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


# --------------------------------------------------------------------------- header


def _first_data_line(data: bytes) -> tuple[int, list[str]] | None:
    match = _FIRST_DATA_LINE.search(data)
    if match is None:
        return None
    fields = _FIELDS.split(match.group().decode("utf-8", "replace").strip(" \t\r\v\f,"))
    return line_at(data, match.start()), fields


def _looks_like_column_names(fields: list[str]) -> bool:
    names = [f.strip("\"'").lower() for f in fields[:2]]
    return len(names) == 2 and all(_COLUMN_NAME.fullmatch(f) for f in names)


def _any_is_node(fields: list[str], parsed: Parsed) -> bool:
    ids = parsed.node_ids  # sorted by UTF-8 bytes, which is str order
    for f in fields:
        at = bisect.bisect_left(ids, f)
        if at < len(ids) and ids[at] == f:
            return True
    return False


def _non_numeric(fields: list[str]) -> bool:
    return len(fields) >= 2 and not any(_NUMBER.fullmatch(f) for f in fields[:2])


# --------------------------------------------------------------------------- graph


def _finish(parsed: Parsed, name: str, *, header_skipped: bool) -> Graph:
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
