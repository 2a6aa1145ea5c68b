"""Bodies of ``POST /v1/embeddings/batch`` (pydantic; they are its OpenAPI schema)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, StrictBool
from pydantic.config import JsonDict

from service.api.batch_base import BatchAnswerBase, BatchItemBase, BatchQueryBase
from service.api.models import EmbeddingMechanism
from service.api.params import IntField
from service.privacy.modes import Mode

_QUERY_EXAMPLE: JsonDict = {"nodes": ["42", "107"], "epsilon": 0.5, "k": 4, "mode": "edge"}

_MECHANISM_EXAMPLE: JsonDict = {
    "name": "dp_instant_embedding",
    "mode": "edge",
    "epsilon": 0.5,
    "delta": 0.0,
    "dimension": 4,
    "hash_salt": "5b25e67f942dbca616fadeca088af6af",
    "sigma": 0.001,
    "sensitivity": 10.0,
    "noise_scale": 20.0,
    "score_grid": 0.0625,
    "alpha": 0.08108108108108103,
    "rounds": 100,
    "floor": 0.25,
}

_ANSWER_EXAMPLE: JsonDict = {
    "items": [
        {
            "node": "42",
            "graph_version": "9922312492d2e3b9aa29",
            "embedding": [-17.25, 6.0, 29.5, -5.0625],
            "mechanism": _MECHANISM_EXAMPLE,
            "replayed": False,
            "epsilon_charged": 0.5,
        },
        {
            "node": "107",
            "error": {
                "code": "budget_exhausted",
                "message": "the charged account has no budget left for this query",
                "details": {},
            },
        },
    ],
    "request_id": "f02cf19a37934461957028ddb367e6fb",
    "epsilon_charged": 0.5,
}


class EmbeddingBatchQuery(BatchQueryBase):
    """Seeds embedded in one call; every other field applies to each of them."""

    model_config = ConfigDict(json_schema_extra={"examples": [_QUERY_EXAMPLE]})

    k: IntField | None = Field(
        None,
        description="Dimension, a JSON integer or a number with a zero fraction (1..PPR_MAX_K "
        "and at most 4096, default PPR_EMBEDDING_DEFAULT_K).",
    )
    sigma: float | None = Field(
        None,
        strict=True,
        description="PushFlowCap's sensitivity sigma (PPR_EMBEDDING_MIN_SIGMA.."
        "PPR_EMBEDDING_MAX_SIGMA, default PPR_EMBEDDING_DEFAULT_SIGMA).",
    )
    mode: Mode = Field(
        Mode.PERSONALIZED,
        description="`personalized`: each seed user's account is charged (within the caller's "
        "scopes; joint DP, each answer for its seed user only); `edge`: the caller is charged "
        "for every item, counted in the graph-wide exposure.",
    )
    fresh: StrictBool = Field(False, description="Draw new noise even where a release exists.")


class EmbeddingBatchItem(BatchItemBase):
    """One seed's embedding or the error it alone failed with (`error`)."""

    graph_version: str | None = None
    embedding: list[float] | None = Field(None, description="The k coordinates.")
    mechanism: EmbeddingMechanism | None = Field(
        None,
        description="As in GET /v1/embeddings/{node}: epsilon, delta, dimension, hash_salt, "
        "sigma, noise_scale, score_grid, ...",
    )


class EmbeddingBatchAnswer(BatchAnswerBase[EmbeddingBatchItem]):
    model_config = ConfigDict(json_schema_extra={"examples": [_ANSWER_EXAMPLE]})
