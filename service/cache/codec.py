"""How the caches encode their values: no pickle anywhere.

Arrays are raw little-endian bytes behind a small JSON header (dtype and shape, checked on
every read); a release is JSON around the results' JSON text the ledger row stores. A value
that does not decode to what its cache holds raises :class:`CorruptValue` (the cache counts
it ``discarded`` and treats it as a miss).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import numpy as np

from service.ledger.records import ReleaseKey, StoredRelease
from service.ledger.release_format import decode_results, results_json
from service.mechanisms.registry import RankingMechanism

# -- arrays --------------------------------------------------------------------------------

_ARRAY_MAGIC = b"PPRARR1\n"
_ALLOWED_DTYPES = frozenset({"<f8", "<i8"})


class CorruptValue(ValueError):
    """A stored value that does not decode to what its cache holds."""


def encode_array(array: np.ndarray) -> bytes:
    """``magic + JSON header + newline + raw little-endian bytes`` (C order)."""
    data = np.ascontiguousarray(array)
    dtype = data.dtype.newbyteorder("<") if data.dtype.byteorder == ">" else data.dtype
    data = data.astype(dtype, copy=False)
    descr = dtype.str
    if descr not in _ALLOWED_DTYPES:
        raise ValueError(f"unsupported dtype {descr}")
    header = json.dumps({"dtype": descr, "shape": list(data.shape)}, separators=(",", ":"))
    return _ARRAY_MAGIC + header.encode() + b"\n" + data.tobytes()


def decode_array(raw: bytes, *, dtype: str, ndim: int) -> np.ndarray:
    """The array in ``raw``, read-only (a view of the bytes, no copy); :class:`CorruptValue`
    unless it has exactly the given dtype and number of dimensions and the right length."""
    if not isinstance(raw, bytes) or not raw.startswith(_ARRAY_MAGIC):
        raise CorruptValue("not an encoded array")
    end = raw.find(b"\n", len(_ARRAY_MAGIC))
    if end < 0 or end - len(_ARRAY_MAGIC) > 256:
        raise CorruptValue("array header missing")
    try:
        header = json.loads(raw[len(_ARRAY_MAGIC) : end])
        stored_dtype = header["dtype"]
        shape = tuple(header["shape"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptValue("array header unreadable") from exc
    if stored_dtype != dtype or len(shape) != ndim:
        raise CorruptValue(f"expected {dtype} with {ndim} dims")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise CorruptValue("bad shape")
    np_dtype = np.dtype(dtype)
    offset = end + 1
    count = math.prod(shape)
    if len(raw) - offset != count * np_dtype.itemsize:
        raise CorruptValue("array length does not match its header")
    array = np.frombuffer(raw, dtype=np_dtype, count=count, offset=offset).reshape(shape)
    array.flags.writeable = False  # already so (bytes are immutable); make it explicit
    return array


# -- releases ------------------------------------------------------------------------------


def release_key_parts(key: ReleaseKey) -> list[Any]:
    parts: list[Any] = [
        key.account_id, key.node, key.graph_version, key.mode, repr(float(key.epsilon))
    ]  # fmt: skip
    if (
        key.mechanism != RankingMechanism.NOISY_DIFFUSION
    ):  # the diffusion's keys are as before mechanisms
        parts.append(key.mechanism)
    return parts


def encode_release(release: StoredRelease) -> bytes:
    doc = {
        "v": 1,
        "key": release_key_parts(release.key),
        "charge_id": release.charge_id,
        "mechanism": release.mechanism,
        "request_id": release.request_id,
        **({} if release.released_at is None else {"at": release.released_at.timestamp()}),
    }
    head = json.dumps(doc, separators=(",", ":"))
    # the results' JSON text is the one the ledger row stores (encoded once per release)
    return f'{head[:-1]},"results":{results_json(release.results)}}}'.encode()


def decode_release(raw: bytes) -> StoredRelease:
    try:
        doc = json.loads(raw)
        if doc["v"] != 1:
            raise CorruptValue("unknown release version")
        parts = doc["key"]
        if len(parts) not in (5, 6):
            raise CorruptValue("a release key has 5 or 6 parts")
        account_id, node, graph_version, mode, epsilon = parts[:5]
        mechanism_name = (
            str(parts[5]) if len(parts) == 6 else RankingMechanism.NOISY_DIFFUSION.value
        )
        key = ReleaseKey(
            int(account_id), str(node), str(graph_version), str(mode), float(epsilon),
            mechanism_name,
        )  # fmt: skip
        results = decode_results(doc["results"])
        mechanism = doc["mechanism"]
        if not isinstance(mechanism, dict):
            raise CorruptValue("mechanism is not an object")
        return StoredRelease(
            key=key,
            charge_id=int(doc["charge_id"]),
            results=results,
            mechanism=mechanism,
            request_id=str(doc["request_id"]),
            released_at=None if "at" not in doc else datetime.fromtimestamp(float(doc["at"]), UTC),
        )
    except CorruptValue:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptValue("unreadable release") from exc
