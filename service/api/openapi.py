"""The OpenAPI schema as this deployment serves it.

Routes declare their own errors; what every route of one kind can answer is added here, so a
new endpoint gets it without repeating it:

* authenticated operations: 400 ``duplicate_header`` (two Authorization headers), 401
  (key), 429 ``rate_limited``, 500 ``internal_error`` and 503 ``ledger_unavailable`` (every
  request looks its key up in the ledger);
* operations with a JSON body: 400 ``malformed_json``, 413 ``payload_too_large`` and 415
  ``unsupported_media_type``;
* the configured bounds of ``k`` and ``epsilon`` (``PPR_MAX_K``, ``PPR_EPSILON_MIN``,
  ``PPR_EPSILON_MAX``) as ``minimum``/``maximum`` of those query parameters and of the batch
  batch bodies' fields, ``PPR_EMBEDDING_MIN_SIGMA``/``MAX_SIGMA`` of the embeddings' ``sigma``,
  and ``PPR_BATCH_MAX_ITEMS`` as the batches' ``maxItems``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.config import Settings

_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_JSON_ERROR = {"application/json": {"schema": _ERROR_REF}}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer"},
    }
}

AUTHENTICATED_ERRORS: dict[str, dict[str, Any]] = {
    "400": {"description": "`duplicate_header`: a second Authorization or Idempotency-Key"},
    "401": {"description": "`unauthorized`: missing, malformed, unknown or revoked key"},
    "429": {"description": "`rate_limited`: this account's requests are over its rate limit",
            "headers": _RETRY_AFTER},
    "500": {"description": "`internal_error`: an unexpected failure (quote the request id)"},
    "503": {"description": "`ledger_unavailable`: the ledger database does not answer",
            "headers": _RETRY_AFTER},
}  # fmt: skip
BODY_ERRORS: dict[str, dict[str, Any]] = {
    "400": {"description": "`malformed_json`: the body is not valid JSON"},
    "413": {"description": "`payload_too_large`: the body exceeds PPR_MAX_BODY_BYTES"},
    "415": {
        "description": "`unsupported_media_type`: the body was sent without "
        "`Content-Type: application/json`"
    },
}
_METHODS = ("get", "put", "post", "delete", "patch")
#: Statuses both lists above declare: an operation that gets both states both codes.
_SHARED_STATUSES = frozenset(AUTHENTICATED_ERRORS) & frozenset(BODY_ERRORS)


def _bound(parameter: dict[str, Any], **bounds: float) -> None:
    schema = parameter.get("schema", {})
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") in ("integer", "number"):
            branch.pop("exclusiveMinimum", None)
            branch.update(bounds)


def _add(responses: dict[str, Any], extra: dict[str, dict[str, Any]]) -> None:
    for status, response in extra.items():
        if status not in responses:
            responses[status] = {**response, "content": _JSON_ERROR}
            continue
        if status in _SHARED_STATUSES:  # e.g. 400: malformed_json or duplicate_header
            described = responses[status].get("description", "")
            if response["description"] not in described:
                responses[status]["description"] = f"{described}; {response['description']}"
        if "headers" in response:
            responses[status].setdefault("headers", response["headers"])


def _bound_property(schema: dict[str, Any], model: str, name: str, **bounds: float) -> None:
    properties = schema.get("components", {}).get("schemas", {}).get(model, {}).get("properties")
    if properties is not None and name in properties:
        _bound({"schema": properties[name]}, **bounds)


def complete_schema(schema: dict[str, Any], mechanism: Settings) -> dict[str, Any]:
    """``schema`` with the common error responses and the configured parameter bounds."""
    eps = {"minimum": mechanism.epsilon_min, "maximum": mechanism.epsilon_max}
    sigma = {"minimum": mechanism.embedding_min_sigma, "maximum": mechanism.embedding_max_sigma}
    _bound_property(schema, "EmbeddingBatchQuery", "sigma", **sigma)
    for model in ("BatchQuery", "EmbeddingBatchQuery"):  # POST /v1/ppr/batch, /embeddings/batch
        _bound_property(schema, model, "k", minimum=1, maximum=mechanism.max_k)
        _bound_property(schema, model, "epsilon", **eps)
        nodes = schema.get("components", {}).get("schemas", {}).get(model, {})
        if "nodes" in nodes.get("properties", {}):
            nodes["properties"]["nodes"]["maxItems"] = mechanism.batch_max_items
    for path_item in schema.get("paths", {}).values():
        for method in _METHODS:
            operation = path_item.get(method)
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            if operation.get("security"):
                _add(responses, AUTHENTICATED_ERRORS)
            if "requestBody" in operation:
                _add(responses, BODY_ERRORS)
            for parameter in operation.get("parameters", []):
                if parameter.get("in") != "query":
                    continue
                if parameter["name"] == "k":
                    _bound(parameter, minimum=1, maximum=mechanism.max_k)
                elif parameter["name"] == "epsilon":
                    _bound(parameter, minimum=mechanism.epsilon_min, maximum=mechanism.epsilon_max)
                elif parameter["name"] == "sigma":
                    _bound(
                        parameter,
                        minimum=mechanism.embedding_min_sigma,
                        maximum=mechanism.embedding_max_sigma,
                    )
    return schema


def install_openapi(app: FastAPI, mechanism: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = complete_schema(schema, mechanism)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
