"""What the service answers, as the client reads it: frozen pydantic models of the client's own.

They are deliberately tolerant, so that a newer server does not break an older client: fields
a newer server adds are kept (``model_extra``) rather than refused, enumerations (modes,
account types, charge states) are plain strings, and ``mechanism`` requires only what every
mechanism states (name, mode, epsilon, delta).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from service.client.errors import PprError, error_class

__all__ = [
    "Account",
    "AccountWithBudget",
    "ApiKey",
    "AuditEntry",
    "BatchAnswer",
    "BatchAnswerBase",
    "BatchItem",
    "BatchItemBase",
    "Budget",
    "Charge",
    "CreatedAccount",
    "ErrorInfo",
    "Exposure",
    "ExposureByMode",
    "ExposurePoint",
    "GraphInfo",
    "Mechanism",
    "NewApiKey",
    "PprAnswer",
    "Result",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class Result(_Model):
    node: str
    score: float


class Mechanism(_Model):
    """How an answer was made; fields beyond the first four depend on the mechanism."""

    name: str
    mode: str
    epsilon: float
    delta: float
    beta: float | None = None
    steps: int | None = None
    noisy_steps: int | None = None
    eta: float | None = None
    noise_scale: float | None = None
    score_grid: float | None = None


class Budget(_Model):
    account_id: int
    spent_epsilon: float | None  # null: infinite (docs/privacy.md, section 5)
    cap_epsilon: float
    remaining_epsilon: float
    delta: float
    charges: int


class PprAnswer(_Model):
    node: str
    graph_version: str
    results: list[Result]
    mechanism: Mechanism
    budget: Budget
    replayed: bool
    request_id: str
    epsilon_charged: float


class ErrorInfo(_Model):
    code: str
    message: str
    details: dict[str, Any] | None = None


class BatchItemBase(_Model):
    """What every batch item states (``POST /v1/ppr/batch``, ``POST /v1/embeddings/batch``):
    its node and either its own answer fields or the error it alone failed with (``error``)."""

    node: str
    replayed: bool | None = None
    epsilon_charged: float | None = None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def exception(self) -> PprError | None:
        """The item's error as the typed exception a single query would have raised."""
        if self.error is None:
            return None
        return error_class(self.error.code)(
            self.error.message, code=self.error.code, details=self.error.details
        )

    def raise_for_error(self) -> None:
        error = self.exception()
        if error is not None:
            raise error


ItemT = TypeVar("ItemT", bound=BatchItemBase)


class BatchAnswerBase(_Model, Generic[ItemT]):
    """A batch's items, one per node in the order sent, and the epsilon charged in total."""

    items: list[ItemT]
    request_id: str
    epsilon_charged: float


class BatchItem(BatchItemBase):
    """One seed's answer (``results``) or the error it alone failed with (``error``)."""

    results: list[Result] | None = None


class BatchAnswer(BatchAnswerBase[BatchItem]):
    """``POST /v1/ppr/batch``."""


class Account(_Model):
    account_id: int
    type: str
    node_id: str | None = None
    label: str | None = None
    may_create_seed_accounts: bool = False
    modes: list[str] = []
    quota_epsilon: float | None = None
    created_at: str


class AccountWithBudget(Account):
    budget: Budget


class ApiKey(_Model):
    key_id: int
    account_id: int
    prefix: str
    created_at: str
    revoked_at: str | None = None


class NewApiKey(ApiKey):
    api_key: str


class CreatedAccount(AccountWithBudget):
    key: NewApiKey


class Charge(_Model):
    charge_id: int
    created_at: str
    charged_account_id: int
    principal_account_id: int
    seed: str
    mechanism: str
    mode: str
    epsilon: float
    graph_version: str
    request_id: str
    idempotency_key: str | None = None
    refunded: bool
    state: str


class AuditEntry(_Model):
    id: int
    created_at: str
    actor_account_id: int | None = None
    action: str
    target_account_id: int | None = None
    details: dict[str, Any] | None = None


class ExposureByMode(_Model):
    epsilon: float
    charges: int


class ExposurePoint(_Model):
    at: str
    epsilon: float
    charges: int


class Exposure(_Model):
    epsilon: float
    delta: float
    charges: int
    graph_releases: int = 0
    cap_epsilon: float | None = None
    by_mode: dict[str, ExposureByMode] = {}
    series: list[ExposurePoint] = []
    shards_epsilon: float | None = None


class GraphInfo(_Model):
    version: str
    source: str
    nodes: int
    edges: int
    degree_min: int
    degree_mean: float
    degree_max: int
    loaded_at: float
    load_seconds: float
