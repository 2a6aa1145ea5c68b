"""``CompactJSONResponse``: a JSON answer built as plain dicts, written by orjson.

The batch routes build their answers directly (thousands of results a call are not validated
again on the way out), and Starlette's ``JSONResponse`` wrote them with :func:`json.dumps`:
3.6 ms for 200 items of 20 results, against 0.15 ms with orjson (a dependency already, for the
ledger's JSON). The JSON values are the same: UTF-8 text without spaces, each float written
with the shortest digits that read back to it (``1e-05`` may come out as ``1e-5``: the same
number). orjson writes a NaN or an infinity as ``null``, where ``JSONResponse`` refuses them
(``allow_nan=False``): an answer whose text holds ``null`` (a None, or such a number) is
written by ``JSONResponse`` instead, so a non-finite number is refused as before.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse

__all__ = ["CompactJSONResponse"]


class CompactJSONResponse(JSONResponse):
    """:class:`JSONResponse` rendered by orjson (module docstring)."""

    def render(self, content: Any) -> bytes:
        body = orjson.dumps(content)
        if b"null" in body:  # a None, or a NaN or infinity orjson writes as null
            return super().render(content)
        return body
