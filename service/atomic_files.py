"""Durable files, written atomically: a reader finds the old file or the whole new one, never
part of one, and a file renamed into place survives a crash of the machine.

Every writer of a file the service keeps (graph snapshots, prefix tables, synthetic edge lists,
embedding releases and their indexes, batch Parquet outputs) writes it the same way:

1. a temporary file in the same directory as the final name (so the rename stays on one file
   system), created with the file's mode (0600 unless stated: these files hold the graph, a
   release or users' answers);
2. the data written and the file fsynced;
3. the file renamed over the final name (``os.replace``: atomic);
4. the directory fsynced, so that the rename itself is durable.

On any failure before the rename the temporary file is removed and the final name is left as
it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from service.errors import InvalidParameter

#: The mode of a durable file unless its writer states another: its owner's only.
PRIVATE = 0o600


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename into it) durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(
    temporary: Path, path: Path, *, mode: int = PRIVATE, file: BinaryIO | None = None
) -> None:
    """Steps 2-4 for a temporary file already written beside ``path``: fsync it (through
    ``file`` when it is still open, which stays open; else by opening it again), give it
    ``mode``, rename it over ``path`` and fsync the directory."""
    if file is not None and not file.closed:
        file.flush()
        os.fsync(file.fileno())
    else:
        fd = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
    fsync_directory(path.parent)


@dataclass(frozen=True)
class StagedFile:
    """A temporary file beside its final name: write to ``file`` (opened ``wb``, its
    descriptor read-write, so it can be truncated and mapped), or close it and write by
    ``path``."""

    path: Path
    file: BinaryIO


@contextmanager
def atomic_file(
    path: Path, *, mode: int = PRIVATE, prefix: str | None = None, suffix: str = ".tmp"
) -> Iterator[StagedFile]:
    """A temporary file named ``<prefix>...<suffix>`` beside ``path``; when the block ends
    without an exception it is fsynced, given ``mode`` and renamed to ``path``, and the
    directory fsynced. On an exception it is removed and ``path`` is untouched."""
    directory = path.parent
    name_prefix = prefix if prefix is not None else f".{path.name}."
    fd, name = tempfile.mkstemp(prefix=name_prefix, suffix=suffix, dir=directory)  # 0600
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as file:
            staged = StagedFile(temporary, file)
            yield staged
            replace_durably(temporary, path, mode=mode, file=file)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_atomically(
    path: Path, data: bytes, *, mode: int = PRIVATE, prefix: str | None = None
) -> None:
    """Write ``data`` to ``path`` atomically and durably (see the module's steps)."""
    with atomic_file(path, mode=mode, prefix=prefix, suffix="") as staged:
        staged.file.write(data)


def check_output_path(out: Path, *, prefix: str | None = None) -> None:
    """Refuse an output path that cannot be written (a directory, a missing directory, one
    without write permission), before anything is charged: by creating and removing a
    temporary file (named ``<prefix>...``) where the file will be written."""
    directory = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise InvalidParameter("out", f"{out} is a directory")
    if not directory.is_dir():
        raise InvalidParameter("out", f"the directory {directory} does not exist")
    try:
        fd, probe = tempfile.mkstemp(
            prefix=prefix if prefix is not None else f".{out.name}.", dir=directory
        )
    except OSError as exc:
        raise InvalidParameter("out", f"cannot write in {directory}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)
