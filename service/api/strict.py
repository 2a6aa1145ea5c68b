"""Strict request parsing for every route, before its handler and dependencies run.

FastAPI (through pydantic's lax mode) reads ``" 0.1"`` as 0.1, ``"1.0"`` and ``"\\x0c3"`` as
integers, and a body sent without ``Content-Type: application/json`` is validated as bytes (a
confusing ``invalid_parameter``). Here, for every route:

* a number in the query string or the path is written plainly: an integer is ASCII digits
  without sign, spaces or leading zeros (``0``, ``12``), optionally followed by a fraction of
  zeros (``12.0``: JSON Schema, which the OpenAPI document's ``integer`` follows, counts it an
  integer, so a client that follows the schema may send it); a real number is a decimal with
  an optional exponent (``0.1``, ``1e-6``), no surrounding spaces (``422 invalid_parameter``);
* a route that takes a JSON body answers a body sent without a JSON media type (missing or
  another ``Content-Type``) with ``415 unsupported_media_type`` naming the header to send; a
  route whose body is optional accepts an empty request without one;
* a body labelled JSON that cannot be parsed, for whatever reason (a syntax error, nesting
  deeper than the parser goes, bytes that are not UTF-8), is ``400 malformed_json``.

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
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from service.errors import InvalidParameter, ServiceError, shown

#: A plain decimal integer: digits only, no sign, no leading zeros; a fraction of zeros may
#: follow (``12.0`` is an integer in JSON Schema).
_PLAIN_INT = re.compile(r"(?:0|[1-9][0-9]*)(?:\.0+)?")
#: A plain decimal real number (optionally negative, with an exponent), no spaces.
_PLAIN_REAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_JSON_MEDIA_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json", re.IGNORECASE)

#: The header a JSON body needs, as the 415's message names it.
JSON_CONTENT_TYPE = "Content-Type: application/json"


class MalformedJson(ServiceError):
    code = "malformed_json"
    status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(f"the body is not valid JSON: {reason}")


def _parse_failure(exc: BaseException) -> str:
    """Why a body labelled JSON could not be parsed, in words (never the body's bytes)."""
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8 text"
    return "it cannot be parsed"


class UnsupportedMediaType(ServiceError):
    code = "unsupported_media_type"
    status = 415

    def __init__(self, given: str | None) -> None:
        got = "no Content-Type" if not given else f"Content-Type {shown(given)}"
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

    def request_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """What answers a request once its numbers and body are checked: FastAPI's handler."""
        return super().get_route_handler()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = self.request_handler()
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
            if body_required is None:
                return await handler(request)
            await _check_json_body(request, required=body_required)
            try:
                return await handler(request)
            except HTTPException as exc:
                # FastAPI answers a body its JSON parser raised on (other than a syntax error)
                # with a bare 400 "There was an error parsing the body"
                if exc.status_code == 400 and exc.__cause__ is not None:
                    raise MalformedJson(_parse_failure(exc.__cause__)) from exc
                raise

        return strict_handler


def _values(source: Any, name: str) -> list[str]:
    if hasattr(source, "getlist"):
        return [str(v) for v in source.getlist(name)]
    value = source.get(name)
    return [] if value is None else [str(value)]


def _check_number(name: str, raw: str, kind: str) -> None:
    if kind == "int" and _PLAIN_INT.fullmatch(raw) is None:
        raise InvalidParameter(
            name,
            f"must be a plain decimal integer (digits only, e.g. 12 or 12.0), got {shown(raw)}",
        )
    if kind == "real" and _PLAIN_REAL.fullmatch(raw) is None:
        raise InvalidParameter(
            name, f"must be a plain decimal number without spaces (e.g. 0.1), got {shown(raw)}"
        )


async def _check_json_body(request: Request, *, required: bool) -> None:
    content_type = request.headers.get("content-type")
    if is_json_media_type(content_type):
        return
    if not required and not content_type and not await request.body():
        return  # an optional body, not sent
    raise UnsupportedMediaType(content_type)
