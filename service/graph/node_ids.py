"""External node ids of a graph and their lookup, in memory or packed in a mapped snapshot.

A graph's internal index ``i`` names the ``i``-th id in canonical order (numeric when every id
is a plain decimal integer, else by UTF-8 bytes; see :mod:`service.graph.build`). Two tables:

* :class:`ListedIds` holds the ids as Python strings with an id -> index dictionary (what the
  loader builds; about 100 bytes per node in every process that holds it).
* :class:`PackedIds` reads them from flat arrays (UTF-8 bytes and their offsets, plus the
  integer values when the ids are numeric) that may be read-only views of a memory-mapped
  snapshot shared by every worker on a machine. Because the ids are sorted, a lookup is a
  binary search over the arrays: nothing per node is built in the process.
"""

from __future__ import annotations

import bisect
import re
from typing import Protocol

import numpy as np

_CANONICAL_INT = re.compile(r"(?:0|[1-9][0-9]{0,17})")


def utf8_join(names: list[str]) -> tuple[bytes, np.ndarray]:
    """``names`` as concatenated UTF-8 bytes and each one's length in bytes (int64)."""
    encoded = [name.encode("utf-8") for name in names]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    return b"".join(encoded), lengths


def is_canonical_int(token: str) -> bool:
    """True for ids the loader's integer fast path accepts (and orders numerically)."""
    return _CANONICAL_INT.fullmatch(token) is not None


class NodeIds(Protocol):
    """The external ids of a graph's nodes, by internal index."""

    def __len__(self) -> int: ...

    def index(self, node: str) -> int | None:
        """Internal index of ``node``, or None if the graph has no such node."""
        ...

    def names(self, indices: np.ndarray) -> list[str]:
        """External ids of internal indices, in the same order."""
        ...

    def utf8_names(self, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The same ids as their UTF-8 bytes, concatenated, and each one's length in bytes
        (int64): no Python string per id."""
        ...

    def as_array(self) -> np.ndarray:
        """Every id as an object array of ``str`` (built on demand for packed tables)."""
        ...

    @property
    def nbytes(self) -> int: ...


class ListedIds:
    """Ids as an object array of ``str`` and a dictionary back to the index."""

    def __init__(self, ids: list[str]) -> None:
        array = np.empty(len(ids), dtype=object)
        array[:] = ids
        array.setflags(write=False)
        self._array = array
        self._index = dict(zip(ids, range(len(ids)), strict=True))

    def __len__(self) -> int:
        return int(self._array.shape[0])

    def index(self, node: str) -> int | None:
        return self._index.get(node)

    def names(self, indices: np.ndarray) -> list[str]:
        return [str(x) for x in self._array[np.asarray(indices, dtype=np.int64)]]

    def utf8_names(self, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
        return utf8_join(self.names(indices))

    def as_array(self) -> np.ndarray:
        return self._array

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)


class PackedIds:
    """Ids as concatenated UTF-8 bytes with ``offsets`` (n + 1 entries), sorted canonically.

    ``values`` holds the ids as int64 when every id is a canonical decimal integer (then the
    order is numeric and a lookup is :func:`numpy.searchsorted`), else it is None and the
    order is by UTF-8 bytes (a lookup bisects the byte strings).
    """

    def __init__(self, data: np.ndarray, offsets: np.ndarray, values: np.ndarray | None) -> None:
        if data.dtype != np.uint8 or offsets.dtype != np.int64:
            raise ValueError("packed ids need uint8 data and int64 offsets")
        if values is not None and (
            values.dtype != np.int64 or values.shape[0] + 1 != offsets.shape[0]
        ):
            raise ValueError("numeric ids need one int64 value per id")
        self._data = data
        self._offsets = offsets
        self._values = values

    @classmethod
    def pack(cls, ids: list[str]) -> PackedIds:
        """Pack ids given in canonical order (as a loaded or built graph holds them)."""
        encoded = [s.encode("utf-8") for s in ids]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        values = None
        if ids and all(is_canonical_int(s) for s in ids):
            values = np.fromiter((int(s) for s in ids), dtype=np.int64, count=len(ids))
        return cls(data, offsets, values)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that make up the table (what a snapshot stores)."""
        out = {"id_bytes": self._data, "id_offsets": self._offsets}
        if self._values is not None:
            out["id_values"] = self._values
        return out

    def __len__(self) -> int:
        return int(self._offsets.shape[0] - 1)

    def __getitem__(self, i: int) -> bytes:
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._data[lo:hi].tobytes()

    def index(self, node: str) -> int | None:
        n = len(self)
        if self._values is not None:
            if not is_canonical_int(node):
                return None
            i = int(np.searchsorted(self._values, int(node)))
            return i if i < n and int(self._values[i]) == int(node) else None
        key = node.encode("utf-8", errors="surrogatepass")
        i = bisect.bisect_left(self, key, 0, n)
        return i if i < n and self[i] == key else None

    def names(self, indices: np.ndarray) -> list[str]:
        at = np.asarray(indices, dtype=np.int64)
        if self._values is not None:  # canonical decimal ids: the number is the name
            return [str(v) for v in self._values[at].tolist()]
        data = memoryview(self._data)  # type: ignore[arg-type]
        starts, ends = self._offsets[at].tolist(), self._offsets[at + 1].tolist()
        return [str(data[lo:hi], "utf-8") for lo, hi in zip(starts, ends, strict=True)]

    def utf8_names(self, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
        at = np.asarray(indices, dtype=np.int64)
        starts = self._offsets[at]
        lengths = self._offsets[at + 1] - starts
        total = int(lengths.sum())
        # Output byte p of id j comes from data[starts[j] + p - (where id j starts in the output)].
        shift = starts - (np.cumsum(lengths) - lengths)
        gather = np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)
        return self._data[gather].tobytes(), lengths

    def as_array(self) -> np.ndarray:
        array = np.empty(len(self), dtype=object)
        array[:] = self.names(np.arange(len(self)))
        array.setflags(write=False)
        return array

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))
