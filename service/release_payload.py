"""The stored form of a graph-wide release's payload in the ledger (a synthetic edge list, an
all-node embedding release): its JSON header (method, parameters, privacy unit, epsilon, the
file's SHA-256, ...), a newline, then its body, gzipped with no timestamp (the same release
gives the same bytes)."""

from __future__ import annotations

import gzip
import json
from typing import Any


def encode_payload(header: dict[str, Any], body: bytes) -> bytes:
    return gzip.compress(json.dumps(header, sort_keys=True).encode() + b"\n" + body, mtime=0)


def decode_payload(payload: bytes) -> tuple[dict[str, Any], bytes]:
    raw = gzip.decompress(payload)
    head, _, body = raw.partition(b"\n")
    return json.loads(head), body
