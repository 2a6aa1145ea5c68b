"""Reading an edge-list (or node-list) file's text: its bytes, decompressed (gzip, bzip2 or
xz, detected by magic bytes whatever the file name), UTF-8 checked slice by slice, a BOM
removed and ``\\r``-only line ends normalised; and the slicing of that text at line ends that
bounds the parser's temporary arrays. Every problem is a :class:`GraphLoadError` naming the
file (and the line where there is one)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Iterator
from pathlib import Path

from service.errors import GraphLoadError

_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZ2_BLOCK_MAGIC = (b"1AY&SY", b"\x17rE8P\x90")


def read_text_bytes(path: Path, name: str, raw: bytes | None = None, *, chunk_bytes: int) -> bytes:
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
            name, "NUL byte: this is a binary file, not a text edge list", line=line_at(data, nul)
        )
    if b"\n" not in data and b"\r" in data:
        data = data.replace(b"\r", b"\n")
    _check_utf8(data, name, chunk_bytes)
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


def _check_utf8(data: bytes, name: str, chunk_bytes: int) -> None:
    if data.isascii():
        return
    view = memoryview(data)
    for start, stop in slices(data, chunk_bytes):
        try:
            str(view[start:stop], "utf-8")
        except UnicodeDecodeError as exc:
            at = start + exc.start
            raise GraphLoadError(
                name,
                f"byte 0x{data[at]:02x} is not valid UTF-8 (the file must be UTF-8 text)",
                line=line_at(data, at),
            ) from None


def line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def slices(data: bytes, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, stop) byte ranges of about ``chunk_bytes``, each ending just after a newline."""
    start, size = 0, len(data)
    while start < size:
        stop = data.find(b"\n", min(start + chunk_bytes, size) - 1)
        stop = size if stop < 0 else stop + 1
        yield start, stop
        start = stop
