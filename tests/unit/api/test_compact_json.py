"""The batch answers' JSON (service/api/compact_json.py): orjson's text, the same values as
Starlette's JSONResponse, and non-finite numbers refused as JSONResponse refuses them."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.responses import JSONResponse

from service.api.compact_json import CompactJSONResponse


def batch_like() -> dict[str, object]:
    return {
        "items": [
            {"node": "17", "results": [{"node": "ü-3", "score": 1e-05},
                                       {"node": "4", "score": 0.0}],
             "replayed": False, "epsilon_charged": 0.1},
            {"node": "x", "error": {"code": "unknown_node", "message": "no such node"}},
        ],
        "request_id": "r1",
        "epsilon_charged": 0.1,
    }  # fmt: skip


def test_the_same_values_as_json_response_in_compact_utf8() -> None:
    content = batch_like()
    ours = CompactJSONResponse(content).body
    theirs = JSONResponse(content).body
    assert json.loads(ours) == json.loads(theirs) == content
    assert b" " not in ours.replace(b"no such node", b"")
    assert "ü-3".encode() in ours  # UTF-8, not \\u escapes
    assert CompactJSONResponse(content).media_type == "application/json"


def test_a_none_is_written_as_null() -> None:
    content = {"items": [], "detail": None}
    assert json.loads(CompactJSONResponse(content).body) == content


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_as_json_response_refuses_them(value: float) -> None:
    content = {"items": [{"node": "1", "results": [{"node": "2", "score": value}]}]}
    with pytest.raises(ValueError):
        JSONResponse(content)
    with pytest.raises(ValueError):
        CompactJSONResponse(content)
