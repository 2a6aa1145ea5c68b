"""Bodies of ``POST /v1/ppr/batch`` (pydantic; they are its OpenAPI schema, with examples)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, StrictBool
from pydantic.config import JsonDict

from service.api.batch_base import BatchAnswerBase, BatchItemBase, BatchQueryBase
from service.api.models import Result
from service.api.params import IntField
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode
from service.serving.refresh import REFRESH_HELP, REFRESH_PATTERN

_QUERY_EXAMPLE: JsonDict = {
    "nodes": ["42", "107", "no-such-node"],
    "epsilon": 0.1,
    "k": 3,
    "mode": "edge",
}

_ANSWER_EXAMPLE: JsonDict = {
    "items": [
        {
            "node": "42",
            "results": [
                {"node": "329", "score": 0.0111},
                {"node": "24", "score": 0.0109},
                {"node": "7", "score": 0.0101},
            ],
            "replayed": False,
            "epsilon_charged": 0.09999988140953486,
        },
        {
            "node": "107",
            "results": [
                {"node": "1684", "score": 0.0213},
                {"node": "1912", "score": 0.0198},
                {"node": "3437", "score": 0.0190},
            ],
            "replayed": True,
            "epsilon_charged": 0.0,
        },
        {
            "node": "no-such-node",
            "error": {
                "code": "unknown_node",
                "message": "node 'no-such-node' is not in the loaded graph",
                "details": {"node": "no-such-node"},
            },
        },
    ],
    "request_id": "f02cf19a37934461957028ddb367e6fb",
    "epsilon_charged": 0.09999988140953486,
}


class BatchQuery(BatchQueryBase):
    """Seeds answered in one call; every other field applies to each of them."""

    model_config = ConfigDict(json_schema_extra={"examples": [_QUERY_EXAMPLE]})

    k: IntField | None = Field(
        None,
        description="Results per item, a JSON integer or a number with a zero fraction (5.0) "
        "(1..PPR_MAX_K, default PPR_DEFAULT_K).",
    )
    mode: Mode = Field(
        Mode.PERSONALIZED,
        description="`personalized`: each seed user's account is charged (within the caller's "
        "scopes); `edge`: the caller is charged for every item.",
    )
    mechanism: RankingMechanism | None = Field(
        None,
        description="The ranking, as in GET /v1/ppr/{node} (default PPR_DEFAULT_MECHANISM; "
        "common_neighbours, friends_of_friends and blended are personalized mode only).",
    )
    fresh: StrictBool = Field(False, description="Draw new noise even where a release exists.")
    refresh: str | None = Field(None, description=REFRESH_HELP, pattern=REFRESH_PATTERN)
    exclude_neighbors: StrictBool = Field(
        False, description="Drop each seed's own neighbours (personalized mode only)."
    )


class BatchItem(BatchItemBase):
    """One seed's answer (`results`) or the error it alone failed with (`error`)."""

    results: list[Result] | None = None


class BatchAnswer(BatchAnswerBase[BatchItem]):
    model_config = ConfigDict(json_schema_extra={"examples": [_ANSWER_EXAMPLE]})

    synthetic: bool | None = Field(
        None, description="Present (true) only in a sandbox (docs/synthetic.md)."
    )
