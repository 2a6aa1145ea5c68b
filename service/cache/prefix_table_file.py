"""The machine-wide prefix table: every seed's noise-free prefix in one file all workers map.

A table holds x_m of every seed of one graph for one (mode, beta, eta, m)
(:mod:`service.mechanisms.prefix_table`), row-major: seed s's prefix is the contiguous row s.
It is written once per machine, like the graph snapshot (:mod:`service.graph.snapshot`), into
the same private directory, and every worker serves lookups from a read-only memory mapping
of it: one copy in the page cache per machine, a lookup is a view of a row (no copy).

SENSITIVE: a noise-free prefix is a deterministic function of the graph's edges, as sensitive
as the graph itself. The file is 0600 in the 0700 snapshot directory, never anywhere else.

Layout: 8 bytes magic, 8 bytes little-endian header length, the JSON header (UTF-8), then the
n x n little-endian float64 rows at the first multiple of 64 bytes. The header carries the
format, the graph's version and the fingerprint of its CSR arrays (what the prefixes are a
function of), the parameters, the payload's size and its BLAKE2b checksum. The file is named
by a hash of all that, so another graph or other parameters never open it. A file that is
truncated, corrupt, of another format or of another graph is never served (it is rebuilt).
It is written under a temporary name in the same directory, filled through a shared mapping
of that file (no copy of the table in process memory), checksummed, fsynced and renamed into
place. Tables not opened for :data:`~service.graph.snapshot.STALE_SECONDS` are removed when a
new one is written (with build locks unused as long).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.atomic_files import atomic_file
from service.graph.model import Graph
from service.graph.snapshot import (
    STALE_SECONDS,
    aligned_offset,
    map_read_only,
    payload_checksum,
    read_header,
    remove_stale,
)
from service.mechanisms.prefix_table import fill_prefix_table
from service.privacy.modes import Mode

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"PPRPFX\x00\x01"
NAME_PREFIX = "prefixes-"
SUFFIX = ".prefixes"
BUILD_LOCK_SUFFIX = ".prefix-build.lock"  # ".<graph fingerprint>" before it: one per graph
_CHECKSUM_HEX = 64  # blake2b, 32 bytes
_TEMPORARY_MAX_AGE = 24 * 3600.0  # a builder killed mid-write leaves its temporary file


class TableInvalid(ValueError):
    """The table file is unreadable, corrupt, or not of the expected graph and parameters."""


def graph_fingerprint(graph: Graph) -> str:
    """BLAKE2b of the CSR arrays (dtypes and bytes): what every prefix of the graph is a
    function of (node order included)."""
    digest = hashlib.blake2b(digest_size=20, person=b"ppr-pfx-graph")
    for array in (graph.indptr, graph.indices):
        digest.update(array.dtype.str.encode())
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


@dataclass(frozen=True)
class TableSpec:
    """What one table holds: x_m of every seed of one graph for one (mode, beta, eta, m)."""

    graph_version: str
    graph_fingerprint: str
    n: int
    mode: str
    beta: float
    eta: float
    m: int

    @property
    def nbytes(self) -> int:
        return self.n * self.n * 8

    @property
    def parameters(self) -> tuple[str, float, float, int]:
        return (self.mode, float(self.beta), float(self.eta), int(self.m))

    @property
    def key(self) -> str:
        text = json.dumps({"format": FORMAT, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()

    def path(self, directory: Path) -> Path:
        return directory / f"{NAME_PREFIX}{self.key}{SUFFIX}"


def write_table(
    graph: Graph,
    spec: TableSpec,
    path: Path,
    *,
    after_block: Callable[[int], None] | None = None,
) -> None:
    """Compute the table of ``spec`` and write it to ``path`` atomically."""
    if graph.n != spec.n:
        raise ValueError("the spec is of another graph")
    header: dict[str, Any] = {
        "format": FORMAT,
        **dataclasses.asdict(spec),
        "payload_bytes": spec.nbytes,
        "checksum": "0" * _CHECKSUM_HEX,
    }
    start = aligned_offset(len(_head(header)))
    with atomic_file(path, prefix=f".{NAME_PREFIX}", suffix=".tmp") as staged:
        fd = staged.file.fileno()  # read-write: filled through a shared mapping
        os.ftruncate(fd, start + spec.nbytes)
        with mmap.mmap(fd, start + spec.nbytes) as mapping:
            rows = np.ndarray((spec.n, spec.n), dtype="<f8", buffer=mapping, offset=start)
            fill_prefix_table(
                graph, Mode(spec.mode), spec.beta, spec.eta, spec.m, rows, after_block=after_block
            )
            del rows
            header["checksum"] = payload_checksum(mapping, start)
            head = _head(header)
            mapping[: len(head)] = head
            mapping.flush()


def open_table(path: Path, spec: TableSpec) -> np.ndarray:
    """The rows of the table at ``path`` (n x n float64), a read-only view of its mapping.

    Raises :class:`FileNotFoundError` if there is no file, :class:`TableInvalid` if it is not
    a complete, intact table of ``spec``.
    """
    mapping, size = map_read_only(path, len(MAGIC) + 8, TableInvalid)
    try:
        return _rows_of(mapping, path, size, spec)
    except BaseException:
        mapping.close()
        raise


def try_open_table(path: Path, spec: TableSpec) -> np.ndarray | None:
    """:func:`open_table`, or None when there is no valid table (a rejected file is logged)."""
    try:
        rows = open_table(path, spec)
    except FileNotFoundError:
        return None
    except (TableInvalid, OSError) as exc:
        log.warning("prefix table rejected (it is rebuilt): %s", exc)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # marks it in use (see remove_stale)
    return rows


def build_tables(
    graph: Graph,
    specs: list[TableSpec],
    directory: Path,
    *,
    after_block: Callable[[int], None] | None = None,
) -> list[Path]:
    """Write the tables of ``specs`` in order, skipping those already valid; their paths."""
    paths = []
    for spec in specs:
        path = spec.path(directory)
        paths.append(path)
        if try_open_table(path, spec) is not None:
            continue
        started = time.perf_counter()
        write_table(graph, spec, path, after_block=after_block)
        log.info(
            "prefix table written",
            extra={"table": str(path), "graph_version": spec.graph_version, "mode": spec.mode,
                   "m": spec.m, "bytes": spec.nbytes,
                   "build_seconds": round(time.perf_counter() - started, 2)},
        )  # fmt: skip
        remove_stale(directory, keep=path, pattern=f"{NAME_PREFIX}*{SUFFIX}")
    _remove_abandoned_temporaries(directory)
    return paths


def mapped_tables(pid: int | str = "self") -> list[str]:
    """Paths of the table files a process maps (from /proc/PID/maps)."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:  # pragma: no cover - not Linux
        return []
    return sorted({ln.split(maxsplit=5)[5] for ln in lines if ln.endswith(SUFFIX)})


# --------------------------------------------------------------------------- internals


def _head(header: dict[str, Any]) -> bytes:
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    return MAGIC + len(text).to_bytes(8, "little") + text


def _rows_of(mapping: mmap.mmap, path: Path, size: int, spec: TableSpec) -> np.ndarray:
    header, start = read_header(
        mapping, path, size, (MAGIC, FORMAT, "a prefix table"), TableInvalid
    )
    try:
        for name, value in dataclasses.asdict(spec).items():
            if header[name] != value:
                raise TableInvalid(f"{path}: a table of another graph or parameters ({name})")
        if int(header["payload_bytes"]) != spec.nbytes or start + spec.nbytes != size:
            raise TableInvalid(f"{path}: {size} bytes, expected {start + spec.nbytes}")
        if payload_checksum(mapping, start) != header["checksum"]:
            raise TableInvalid(f"{path}: checksum mismatch (corrupt file)")
    except TableInvalid:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise TableInvalid(f"{path}: malformed header: {exc}") from None
    # A view of the read-only mapping (numpy marks it read-only): no copy, no private pages.
    return np.ndarray((spec.n, spec.n), dtype="<f8", buffer=mapping, offset=start)


def _remove_abandoned_temporaries(directory: Path) -> None:
    """Temporary files of builders killed mid-write, and build locks unused for a week."""
    for pattern, age in ((f".{NAME_PREFIX}*.tmp", _TEMPORARY_MAX_AGE),
                         (f".*{BUILD_LOCK_SUFFIX}", STALE_SECONDS)):  # fmt: skip
        cutoff = time.time() - age
        for path in directory.glob(pattern):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
