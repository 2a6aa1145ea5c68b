"""Strict request parsing for every route, before its handler and dependencies run.

FastAPI (through pydantic's lax mode) reads ``" 0.1"`` as 0.1, ``"1.0"`` and ``"\\x0c3"`` as
integers, and a body sent without ``Content-Type: application/json`` is validated as bytes (a
confusing ``invalid_parameter``). Here, for every route:

* a number in the query string or the path is written plainly: an integer is ASCII digits
  without sign, spaces or leading zeros (``0``, ``12``); a real number is a decimal with an
  optional exponent (``0.1``, ``1e-6``), no surrounding spaces (``422 invalid_parameter``);
* a route that takes a JSON body answers a body sent without a JSON media type (missing or
  another ``Content-Type``) with ``415 unsupported_media_type`` naming the header to send; a
  route whose body is optional accepts an empty request without one.

Nothing is charged: the check runs before authentication and admission.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Coroutine
from typing import Any, Union, get_args, get_origin

from fastapi import params
from fastapi.dependencies.utils import get_flat_params
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.errors import InvalidParameter, ServiceError

#: A plain decimal integer: digits only, no sign, no leading zeros.
_PLAIN_INT = re.compile(r"(?:0|[1-9][0-9]*)")
#: A plain decimal real number (optionally negative, with an exponent), no spaces.
_PLAIN_REAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_JSON_MEDIA_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json", re.IGNORECASE)

#: The header a JSON body needs, as the 415's message names it.
JSON_CONTENT_TYPE = "Content-Type: application/json"


class UnsupportedMediaType(ServiceError):
    code = "unsupported_media_type"
    status = 415

    def __init__(self, given: str | None) -> None:
        got = "no Content-Type" if not given else f"Content-Type {given!r}"
        super().__init__(
            f"this endpoint takes a JSON body: send the header '{JSON_CONTENT_TYPE}' (got {got})",
            details={"header": "Content-Type", "expected": "application/json"},
        )


def _number_kind(annotation: Any) -> str | None:
    """``"int"`` or ``"real"`` for an annotation that is (optionally) an int or a float."""
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = {_number_kind(arg) for arg in get_args(annotation) if arg is not type(None)}
        return kinds.pop() if len(kinds) == 1 else None
    if annotation is bool:
        return None
    if annotation is int:
        return "int"
    if annotation is float:
        return "real"
    return None


def is_json_media_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip()
    return _JSON_MEDIA_TYPE.fullmatch(media_type) is not None


class StrictRoute(APIRoute):
    """An :class:`APIRoute` that parses numbers strictly and wants JSON bodies labelled."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        numbers = [
            ("query" if isinstance(field.field_info, params.Query) else "path", field.alias, kind)
            for field in get_flat_params(self.dependant)
            if isinstance(field.field_info, params.Query | params.Path)
            and (kind := _number_kind(field.field_info.annotation)) is not None
        ]
        body = self.body_field
        body_required = None if body is None else body.field_info.is_required()

        async def strict_handler(request: Request) -> Response:
            for where, name, kind in numbers:
                source = request.query_params if where == "query" else request.path_params
                for raw in _values(source, name):
                    _check_number(name, raw, kind)
            if body_required is not None:
                await _check_json_body(request, required=body_required)
            return await handler(request)

        return strict_handler


def _values(source: Any, name: str) -> list[str]:
    if hasattr(source, "getlist"):
        return [str(v) for v in source.getlist(name)]
    value = source.get(name)
    return [] if value is None else [str(value)]


def _check_number(name: str, raw: str, kind: str) -> None:
    if kind == "int" and _PLAIN_INT.fullmatch(raw) is None:
        raise InvalidParameter(
            name, f"must be a plain decimal integer (digits only, e.g. 12), got {raw!r}"
        )
    if kind == "real" and _PLAIN_REAL.fullmatch(raw) is None:
        raise InvalidParameter(
            name, f"must be a plain decimal number without spaces (e.g. 0.1), got {raw!r}"
        )


async def _check_json_body(request: Request, *, required: bool) -> None:
    content_type = request.headers.get("content-type")
    if is_json_media_type(content_type):
        return
    if not required and not content_type and not await request.body():
        return  # an optional body, not sent
    raise UnsupportedMediaType(content_type)
