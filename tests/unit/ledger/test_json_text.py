"""The ledger's JSON (``service/ledger/json_text.py``): whichever encoder writes a value, it reads
back as the value the standard library's encoder stores, bit for bit for floats; what the fast
encoder cannot write the same way (NaN, infinities, integers beyond 64 bits, non-string keys)
goes to the standard one; a curve column reads the ``Infinity`` literal; and the values survive
a real column on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Column, Integer, MetaData, Table, insert, select

from service.ledger.database import make_engine
from service.ledger.json_text import (
    CurveText,
    JsonText,
    decode_curve_json,
    encode_json,
    standard_json,
)
from service.privacy.accountant import RdpCurve


def _bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _floats() -> list[float]:
    """Every kind of finite double: random bit patterns over all exponents, subnormals, the
    extremes, signed zeros, and the values curves hold (small, many digits)."""
    rng = np.random.default_rng(20261130)  # a test's fixed sample, not a serving path
    patterns = rng.integers(0, 2**63, size=20_000, dtype=np.int64)
    values = patterns.view(np.float64)
    special = [
        0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 2.2250738585072009e-308,
        1.7976931348623157e308, -1.7976931348623157e308, 1e-05, 1e16, 1e22, 0.1, 1 / 3,
        123456789012345680.0, 9007199254740993.0, 4.35e-05,
    ]  # fmt: skip
    curve_like = list(rng.random(2_000) * 3.7e-3) + list(rng.exponential(1e-6, 2_000))
    return [float(v) for v in values if math.isfinite(v)] + special + curve_like


def test_floats_read_back_bit_for_bit_through_both_parsers() -> None:
    values = _floats()
    text = encode_json(values)
    assert "null" not in text
    for parsed in (json.loads(text), decode_curve_json(text)):
        assert len(parsed) == len(values)
        assert [_bits(v) for v in parsed] == [_bits(v) for v in values]
    # and the standard encoder's text (what older rows hold) reads the same through the fast parser
    assert [_bits(v) for v in decode_curve_json(standard_json(values))] == [
        _bits(v) for v in values
    ]


class Label(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, -0.0, "x"], "c": {"z": None, "y": True}},
        [float("inf"), float("-inf"), 1.0],
        {"rdp": [0.1, float("inf")], "pure": float("inf")},
        {"big": 2**70, "negative": -(2**64)},
        {1: "int key", 2.5: "float key"},
        {"text": "café \u2028 \ud83d\ude00 \"quoted\" \\ back"},
        (1, (2, 3)),
        {"label": Label("kept as text")},
        {"none": None},
        2**63,
        [],
        {},
    ],
    ids=[
        "nested", "infinities", "curve-with-inf", "big-ints", "non-string-keys", "unicode",
        "tuples", "str-subclass", "null", "u64", "empty-list", "empty-object",
    ],
)  # fmt: skip
def test_every_value_reads_back_as_the_standard_encoders(value: Any) -> None:
    text = encode_json(value)
    assert json.loads(text) == json.loads(standard_json(value))


def test_nan_is_written_as_the_standard_encoder_writes_it() -> None:
    text = encode_json({"x": float("nan")})
    assert text == standard_json({"x": float("nan")}) == '{"x":NaN}'
    assert math.isnan(decode_curve_json(text)["x"])


def test_keys_are_sorted_and_the_text_is_compact() -> None:
    assert encode_json({"b": 1, "a": {"d": 2, "c": 3}}) == '{"a":{"c":3,"d":2},"b":1}'


@dataclass
class Point:
    x: int


@pytest.mark.parametrize("value", [Point(1), datetime.now(UTC), {"set": {1}}])
def test_what_the_standard_encoder_refuses_is_still_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        standard_json(value)
    with pytest.raises(TypeError):
        encode_json(value)


def _curve(orders: int, with_inf: bool) -> RdpCurve:
    rdp = np.random.default_rng(7).random(orders) * 1e-3
    if with_inf:
        rdp[-1] = np.inf
    return RdpCurve(rdp, 0.25, 0.0)


@pytest.mark.parametrize("with_inf", [False, True], ids=["finite", "infinite-order"])
def test_curves_survive_a_real_column(ledger_url: str, with_inf: bool) -> None:
    table = Table(
        "json_text_roundtrip",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("rdp", CurveText, nullable=False),
        Column("doc", JsonText, nullable=False),
    )
    curve = _curve(len(RdpCurve.zero().rdp), with_inf)
    doc = {"big": 2**70, "curve": curve.to_json()}
    engine = make_engine(ledger_url)
    try:
        table.create(engine)
        with engine.begin() as connection:
            connection.execute(insert(table).values(id=1, rdp=curve.to_json(), doc=doc))
        with engine.connect() as connection:
            row = connection.execute(select(table.c.rdp, table.c.doc)).one()
        back = RdpCurve.from_json(row.rdp)
        assert [_bits(v) for v in back.rdp] == [_bits(v) for v in curve.rdp]
        assert back.pure == curve.pure
        assert row.doc["big"] == 2**70 and isinstance(row.doc["big"], int)
        assert RdpCurve.from_json(row.doc["curve"]).rdp.tolist() == curve.rdp.tolist()
    finally:
        engine.dispose()
