"""A binary CSR snapshot of a loaded graph, memory-mapped read-only by every worker.

Parsing an edge list gives each process its own copy of the graph. Instead, the first process
to load a file writes a snapshot (the CSR arrays, the degrees, the float64 degrees and inverse
degrees the walk operator reads, and the packed node ids) and
every process, the writer included, serves the graph from a read-only memory mapping of that
file: the kernel keeps one copy of its pages in the page cache, shared by all the workers of
the machine.

The snapshot is named by the *fingerprint* of the source file (a BLAKE2b hash of its bytes
and of this format's number), so a changed file gets a new snapshot and a reload maps the new
one while the old mapping is dropped with the last reference to the old graph. Its header
repeats the fingerprint and carries the graph's version, its stats, the layout of the arrays
and a BLAKE2b checksum of everything after the header. A file that is truncated, corrupt, of
another format or of another source is never served: it is reported, rebuilt from the source
and replaced.

Layout: 8 bytes magic, 8 bytes little-endian header length, the JSON header (UTF-8), then the
arrays, each at an offset that is a multiple of 64 bytes. Files are written to a temporary
name in the same directory and renamed into place (atomic), under an exclusive ``flock`` so
that workers starting together parse the file once. The directory is created private (0700)
and the files are 0600: a snapshot holds the graph's edges.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import mmap
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from service.atomic_files import atomic_file
from service.errors import GraphLoadError
from service.graph.model import Graph, GraphStats
from service.graph.node_ids import PackedIds

log = logging.getLogger(__name__)

FORMAT = 3
MAGIC = b"PPRCSR\x00\x03"
ALIGN = 64
SUFFIX = ".csr"
STALE_SECONDS = 7 * 24 * 3600.0
"""Snapshots in the directory not opened for this long are removed when a new one is written."""

_CSR_ARRAYS = ("indptr", "indices", "degrees")
_DERIVED_ARRAYS = ("float_degrees", "inverse_degrees")  # what the walk operator reads
#: ... and, for a graph small enough (COMPACT_INDEX_NODES), its 16-bit column indices
_COMPACT = "compact_indices"


class SnapshotInvalid(ValueError):
    """The snapshot file is unreadable, corrupt, or not of the expected source."""


def default_directory() -> Path:
    """Where snapshots go unless configured: a per-user directory in the system temp dir."""
    return Path(tempfile.gettempdir()) / f"ppr-graph-snapshots-{os.getuid()}"


def fingerprint(raw: bytes) -> str:
    """Fingerprint of a source file's bytes (and of the snapshot format)."""
    return str(_hasher(raw).hexdigest())


def _with_node_list(key: str, node_list: Path | None) -> str:
    """The snapshot key of an edge file's fingerprint parsed with ``node_list`` (if any)."""
    if node_list is None:
        return key
    return fingerprint(f"{key}\nnodes {file_fingerprint(node_list)}".encode())


def file_fingerprint(path: Path) -> str:
    """:func:`fingerprint` of a file's bytes, read in 1 MiB blocks."""
    digest = _hasher(b"")
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return str(digest.hexdigest())


def _hasher(data: bytes) -> Any:
    return hashlib.blake2b(data, digest_size=20, person=b"ppr-csr-%d" % FORMAT)


def snapshot_path(directory: Path, source_fingerprint: str) -> Path:
    return directory / f"graph-{source_fingerprint}{SUFFIX}"


def write_snapshot(graph: Graph, path: Path, source_fingerprint: str) -> None:
    """Write ``graph`` to ``path`` atomically (:mod:`service.atomic_files`: a 0600 temporary
    file, fsync, rename, fsync of the directory)."""
    packed = (
        graph.ids if isinstance(graph.ids, PackedIds) else PackedIds.pack(graph.node_ids.tolist())
    )
    arrays: dict[str, np.ndarray] = {name: getattr(graph, name) for name in _CSR_ARRAYS}
    arrays.update({name: getattr(graph, name) for name in _DERIVED_ARRAYS})
    if graph.compact_indices is not graph.indices:  # a 16-bit copy (a small graph)
        arrays[_COMPACT] = graph.compact_indices
    arrays.update(packed.arrays)
    layout: dict[str, dict[str, Any]] = {}
    offset = 0
    for name, array in arrays.items():
        layout[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
        offset = aligned_offset(offset + array.nbytes)
    checksum = hashlib.blake2b(digest_size=32)
    payload_bytes = offset
    for name, array in arrays.items():
        checksum.update(_padded(array, layout, name, payload_bytes))
    header = {
        "format": FORMAT,
        "fingerprint": source_fingerprint,
        "version": graph.fingerprint,
        "stats": dataclasses.asdict(graph.stats),
        "arrays": layout,
        "payload_bytes": payload_bytes,
        "checksum": checksum.hexdigest(),
    }
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    start = aligned_offset(len(MAGIC) + 8 + len(text))
    head = MAGIC + len(text).to_bytes(8, "little") + text
    head += b"\x00" * (start - len(head))
    with atomic_file(path, prefix=".graph-", suffix=".tmp") as staged:
        staged.file.write(head)
        for name, array in arrays.items():
            staged.file.write(_padded(array, layout, name, payload_bytes))


def open_snapshot(path: Path, source_fingerprint: str | None = None) -> Graph:
    """The graph in the snapshot at ``path``, its arrays read-only views of one shared mapping.

    Raises :class:`FileNotFoundError` if there is no file, :class:`SnapshotInvalid` if it is
    not a complete snapshot of this format (of ``source_fingerprint`` when given).
    """
    mapping, size = map_read_only(path, len(MAGIC) + 8, SnapshotInvalid)
    try:
        return _graph_of(mapping, path, size, source_fingerprint)
    except BaseException:
        mapping.close()
        raise


def load_with_snapshot(
    source: Path,
    directory: Path,
    parse: Callable[[Path, bytes | None], Graph],
    *,
    node_list: Path | None = None,
) -> Graph:
    """The graph of the file ``source``, served from its snapshot in ``directory``.

    Fingerprints the file (streamed: no copy of it in memory) and maps the snapshot of that
    fingerprint if there is a valid one. Otherwise it reads the file, parses the bytes
    (``parse(source, raw)``), writes the snapshot under the fingerprint of the bytes parsed
    and maps it. A snapshot that fails its checks is logged and replaced. If the directory
    cannot be used, the parsed graph is served from process memory (and that is logged).
    ``node_list``: the node-list file the graph is parsed with; its bytes are part of the key.
    """
    try:
        key = _with_node_list(file_fingerprint(source), node_list)
    except OSError:
        return parse(source, None)  # the loader reads it again and names the error
    try:
        private_directory(directory)
    except OSError as exc:
        log.warning("graph snapshots are off: cannot use %s: %s", directory, exc)
        return parse(source, None)
    graph = _try_open(snapshot_path(directory, key), key)
    if graph is not None:
        return _with_source(graph, str(source))
    with _locked(directory / f".graph-{key}.lock"):
        graph = _try_open(snapshot_path(directory, key), key)  # written meanwhile?
        if graph is not None:
            return _with_source(graph, str(source))
        try:
            raw = source.read_bytes()
        except OSError:
            return parse(source, None)
        try:  # of the bytes parsed, should the file have changed since
            key = _with_node_list(fingerprint(raw), node_list)
        except OSError:
            return parse(source, raw)
        path = snapshot_path(directory, key)
        parsed = parse(source, raw)
        del raw
        write_snapshot(parsed, path, key)
        log.info("graph snapshot written", extra={"snapshot": str(path),
                                                  "graph_version": parsed.version})  # fmt: skip
        remove_stale(directory, keep=path)
    graph = open_snapshot(path, key)
    if graph.version != parsed.version:  # pragma: no cover - would be a bug in this module
        raise GraphLoadError(str(source), "the written snapshot does not hold the parsed graph")
    return _with_source(graph, str(source))


def mapped_snapshots(pid: int | str = "self") -> list[str]:
    """Paths of the snapshot files a process maps (from /proc/PID/maps; this one by default).
    A mapped file that was since removed (the kernel lists it as ``... (deleted)``) is left
    out."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:  # pragma: no cover - not Linux
        return []
    return sorted({ln.split(maxsplit=5)[5] for ln in lines if ln.endswith(SUFFIX)})


# --------------------------------------------------------------------------- internals
# (aligned_offset, private_directory and remove_stale serve the prefix tables too)


def map_read_only(
    path: Path, header_bytes: int, invalid: Callable[[str], Exception]
) -> tuple[mmap.mmap, int]:
    """A read-only mapping of the whole file at ``path`` and its size; ``invalid(message)``
    is raised for a file shorter than ``header_bytes``."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < header_bytes:
            raise invalid(f"{path}: truncated ({size} bytes)")
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), size


def aligned_offset(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _padded(array: np.ndarray, layout: dict[str, dict[str, Any]], name: str, end: int) -> bytes:
    names = list(layout)
    i = names.index(name)
    stop = int(layout[names[i + 1]]["offset"]) if i + 1 < len(names) else end
    data: bytes = np.ascontiguousarray(array).tobytes()
    return data + b"\x00" * (stop - int(layout[name]["offset"]) - len(data))


def read_header(
    mapping: mmap.mmap,
    path: Path,
    size: int,
    kind: tuple[bytes, int, str],
    invalid: Callable[[str], Exception],
) -> tuple[dict[str, Any], int]:
    """The JSON header of a mapped file laid out as magic, 8-byte little-endian header length,
    header, payload at an aligned offset, and the payload's offset. ``kind`` is (magic,
    format, what the file is); ``invalid(message)`` is raised for another kind of file, a
    truncated or unreadable header, or another format."""
    magic, fmt, what = kind
    if mapping[: len(magic)] != magic:
        raise invalid(f"{path}: not {what} of format {fmt}")
    length = int.from_bytes(mapping[len(magic) : len(magic) + 8], "little")
    start = aligned_offset(len(magic) + 8 + length)
    if start > size:
        raise invalid(f"{path}: truncated header")
    try:
        header = json.loads(bytes(mapping[len(magic) + 8 : len(magic) + 8 + length]))
        found = header["format"]
    except (KeyError, TypeError, ValueError) as exc:
        raise invalid(f"{path}: malformed header: {exc}") from None
    if found != fmt:
        raise invalid(f"{path}: format {found}, expected {fmt}")
    return header, start


def payload_checksum(mapping: mmap.mmap, start: int) -> str:
    """BLAKE2b (32 bytes, hex) of everything after the header."""
    view = memoryview(mapping)[start:]
    try:
        return hashlib.blake2b(view, digest_size=32).hexdigest()
    finally:
        view.release()


def _graph_of(mapping: mmap.mmap, path: Path, size: int, expected: str | None) -> Graph:
    header, start = read_header(
        mapping, path, size, (MAGIC, FORMAT, "a graph snapshot"), SnapshotInvalid
    )
    try:
        if expected is not None and header["fingerprint"] != expected:
            raise SnapshotInvalid(f"{path}: a snapshot of another source file (stale)")
        payload_bytes = int(header["payload_bytes"])
        if start + payload_bytes != size:
            raise SnapshotInvalid(f"{path}: {size} bytes, expected {start + payload_bytes}")
        if payload_checksum(mapping, start) != header["checksum"]:
            raise SnapshotInvalid(f"{path}: checksum mismatch (corrupt file)")
        arrays = {
            name: _array(mapping, start + int(spec["offset"]), spec)
            for name, spec in header["arrays"].items()
        }
        ids = PackedIds(arrays["id_bytes"], arrays["id_offsets"], arrays.get("id_values"))
        return Graph(
            indptr=arrays["indptr"],
            indices=arrays["indices"],
            degrees=arrays["degrees"],
            ids=ids,
            version=str(header["version"]),
            stats=GraphStats(**header["stats"]),
            derived={name: arrays[name] for name in (*_DERIVED_ARRAYS, _COMPACT) if name in arrays},
        )
    except SnapshotInvalid:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotInvalid(f"{path}: malformed header: {exc}") from None


def _array(mapping: mmap.mmap, offset: int, spec: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(spec["dtype"])
    shape = tuple(int(x) for x in spec["shape"])
    # A view of the read-only mapping (numpy marks it read-only): no copy, no private pages.
    return np.ndarray(shape, dtype=dtype, buffer=mapping, offset=offset)


def _try_open(path: Path, key: str) -> Graph | None:
    try:
        graph = open_snapshot(path, key)
    except FileNotFoundError:
        return None
    except (SnapshotInvalid, OSError) as exc:
        log.warning("graph snapshot rejected, rebuilding it from the source: %s", exc)
        return None
    with contextlib.suppress(OSError):  # another user's file in a shared directory
        os.utime(path)  # marks it in use (see remove_stale)
    return graph


def _with_source(graph: Graph, source: str) -> Graph:
    return dataclasses.replace(graph, stats=dataclasses.replace(graph.stats, source=source))


def private_directory(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"owned by uid {info.st_uid}, not this user")
    if info.st_mode & 0o022:
        raise PermissionError("writable by other users")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def remove_stale(directory: Path, keep: Path, pattern: str = f"graph-*{SUFFIX}") -> None:
    """Remove the files matching ``pattern`` (snapshots by default) and their lock files,
    not opened for :data:`STALE_SECONDS`. A process that still maps one keeps its pages; a
    later opener rewrites it."""
    cutoff = time.time() - STALE_SECONDS
    for path in directory.glob(pattern):
        try:
            if path != keep and path.stat().st_mtime < cutoff:
                path.unlink()
                (directory / f".{path.stem}.lock").unlink(missing_ok=True)
        except OSError:  # pragma: no cover - raced with another process
            continue
