"""What the batch endpoints' bodies share (``POST /v1/ppr/batch``, ``POST /v1/embeddings/batch``):
the seeds asked for, one item per seed (its own answer fields, or the error it alone failed
with), and the answer's items in order with what they were charged in total.

Each batch declares its own fields on top (a ranking's ``results``, an embedding's vector and
mechanism) and its examples; the OpenAPI schema names the concrete models only.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from service.api.models import ErrorBody
from service.api.params import QueryNodeIdField


class BatchQueryBase(BaseModel):
    """Seeds answered in one call; every other field applies to each of them."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[QueryNodeIdField] = Field(
        min_length=1,
        description='External node ids as JSON strings (`"42"`, never the number `42`), '
        "answered in this order (at most PPR_BATCH_MAX_ITEMS).",
    )
    epsilon: float | None = Field(
        None,
        strict=True,
        description="Per-item epsilon, a JSON number (configured range; default "
        "PPR_DEFAULT_EPSILON).",
    )


class BatchItemBase(BaseModel):
    """One seed's answer, or the error it alone failed with (`error`)."""

    node: str
    replayed: bool | None = Field(None, description="True: a stored release, nothing charged.")
    epsilon_charged: float | None = Field(None, description="Epsilon charged for this item.")
    error: ErrorBody | None = None


ItemT = TypeVar("ItemT", bound=BatchItemBase)


class BatchAnswerBase(BaseModel, Generic[ItemT]):
    """A batch's items in the order of its nodes, and what they were charged together."""

    items: list[ItemT] = Field(description="One per requested node, in the given order.")
    request_id: str
    epsilon_charged: float = Field(description="Sum of the items' per-query epsilons charged.")
