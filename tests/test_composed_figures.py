"""A composed figure that is infinite is answered as null, and the schema says it may be."""

from __future__ import annotations

import math

from service.api.app import create_app
from service.api.dashboard_models import AccountRow, BudgetPreview
from service.api.models import Budget, Exposure


def test_an_infinite_figure_is_null_and_a_finite_one_a_number() -> None:
    budget = Budget.model_validate(
        {"account_id": 1, "spent_epsilon": math.inf, "cap_epsilon": 1.0,
         "remaining_epsilon": 0.0, "delta": 1e-15, "charges": 3}
    )  # fmt: skip
    assert budget.spent_epsilon is None
    assert '"spent_epsilon":null' in budget.model_dump_json()
    finite = Budget.model_validate({**budget.model_dump(), "spent_epsilon": 0.25})
    assert finite.spent_epsilon == 0.25


def test_the_schema_allows_null_for_every_composed_figure() -> None:
    schema = create_app().openapi()["components"]["schemas"]

    def nullable(model: str, field: str) -> bool:
        prop = schema[model]["properties"][field]
        return any(option.get("type") == "null" for option in prop.get("anyOf", []))

    for model, field in [
        (Budget.__name__, "spent_epsilon"),
        (AccountRow.__name__, "spent_epsilon"),
        (AccountRow.__name__, "used_fraction"),
        (BudgetPreview.__name__, "spent_epsilon"),
        (Exposure.__name__, "epsilon"),
        ("Reads", "read_epsilon"),
        ("AccountCurve", "composed_epsilon"),
    ]:
        assert model in schema, model
        assert nullable(model, field), (model, field)
