"""How the ledger stores JSON: TEXT on both databases, floats exact.

:func:`encode_json` writes compact JSON with sorted keys; :class:`JsonText` is a column of it
and :class:`CurveText` a column of RDP curves (parsed faster). A value encoded once can be
stored as is (:class:`EncodedJson`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from sqlalchemy import Dialect, Text
from sqlalchemy.types import TypeDecorator

#: orjson's options: keys sorted as ``json.dumps(sort_keys=True)`` sorts them; dataclasses,
#: datetimes and subclasses of str, int, dict and list are refused (so they reach the standard
#: encoder, which rejects or converts them as it always did).
_ORJSON_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def encode_json(value: Any) -> str:
    """The TEXT a :class:`JsonText` column stores for ``value``: compact JSON, keys sorted.

    orjson writes it (an RDP curve of 100 orders in 3 us, :func:`json.dumps` in 160 us; the
    admission of one query writes several). Both write each float as its shortest round-trip
    digits, so the stored values are the same; the text may differ (``1e-05`` or ``1e-5``, a
    non-ASCII character escaped or not). What orjson cannot write the same way goes to
    :func:`json.dumps`: it raises on integers beyond 64 bits and non-string keys, and writes
    NaN and infinities as ``null``, so any output holding ``null`` is written again by the
    standard encoder (which also writes a real ``None`` as ``null``, only slower). Dataclasses,
    datetimes and sets are refused as before; enums and UUIDs, which the standard encoder
    refused, are written as their values (no ledger column is given one).
    """
    try:
        raw = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:
        return standard_json(value)
    if b"null" in raw:
        return standard_json(value)
    return raw.decode()


def standard_json(value: Any) -> str:
    """:func:`encode_json`'s text from the standard library's encoder."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def decode_curve_json(text: str) -> Any:
    """A stored RDP curve's JSON (:class:`CurveText`) parsed: by orjson (10x faster than
    :func:`json.loads` on a curve), or by the standard parser for the ``Infinity`` and ``NaN``
    literals only it reads. Curves hold floats and small integers, which both parsers read to
    the same values (orjson reads integers beyond 64 bits as floats, so it is not used for
    JSON in general)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


class EncodedJson(str):
    """A value already encoded by :func:`encode_json`: a :class:`JsonText` column stores it as
    is (so a value written many times, or also sent elsewhere, is encoded once)."""

    __slots__ = ()


class JsonText(TypeDecorator[Any]):
    """A JSON value stored as TEXT (exact float round-trip on every backend)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if isinstance(value, EncodedJson):
            return str(value)
        return encode_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        return json.loads(value)


class CurveText(JsonText):
    """A stored RDP curve (:meth:`RdpCurve.to_json`), parsed by :func:`decode_curve_json`."""

    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        return decode_curve_json(value)
