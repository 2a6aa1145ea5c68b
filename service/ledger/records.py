"""Plain records the ledger hands out (no SQLAlchemy types leave the ledger package)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from service.errors import ServiceError
from service.mechanisms.postprocess import RankedNode

AccountType = Literal["user", "service", "admin"]
ACCOUNT_TYPES: tuple[AccountType, ...] = ("user", "service", "admin")


@dataclass(frozen=True)
class AccountRecord:
    account_id: int
    type: AccountType
    node_id: str | None
    label: str | None
    allow_create_seed_accounts: bool
    created_at: str  # ISO 8601, UTC


@dataclass(frozen=True)
class ApiKeyRecord:
    key_id: int
    account_id: int
    prefix: str  # the first characters of the key, safe to show to identify it
    created_at: str
    revoked_at: str | None


@dataclass(frozen=True)
class BudgetView:
    """An account's budget: the spend composed by the RDP accountant at the account's delta."""

    account_id: int
    spent_epsilon: float
    cap_epsilon: float
    remaining_epsilon: float
    delta: float
    charges: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "account_id": self.account_id,
            "spent_epsilon": self.spent_epsilon,
            "cap_epsilon": self.cap_epsilon,
            "remaining_epsilon": self.remaining_epsilon,
            "delta": self.delta,
            "charges": self.charges,
        }


@dataclass(frozen=True)
class ChargeReceipt:
    charge_id: int
    budget: BudgetView  # after the charge
    reused: bool = False  # an earlier charge with the same idempotency key was found instead


@dataclass(frozen=True)
class ChargeRecord:
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
    idempotency_key: str | None
    refunded: bool
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseKey:
    """What makes two queries the same release: replaying one for the other is free."""

    account_id: int  # the charged account
    node: str
    graph_version: str
    mode: str
    epsilon: float


@dataclass(frozen=True)
class StoredRelease:
    key: ReleaseKey
    charge_id: int
    results: list[RankedNode]  # the top of the released ranking, seed excluded, best first
    mechanism: dict[str, Any]
    request_id: str


class BudgetExhausted(ServiceError):
    code = "budget_exhausted"
    status = 403

    def __init__(self, budget: BudgetView, query_epsilon: float) -> None:
        super().__init__(
            f"this query (epsilon {query_epsilon:.4g}) would take the account's spend past its "
            f"cap of {budget.cap_epsilon:.4g}; remaining budget {budget.remaining_epsilon:.4g}. "
            "Ask for a smaller epsilon, replay an earlier answer, or ask an admin to raise the cap",
            details={"budget": budget.to_dict(), "query_epsilon": query_epsilon},
        )
        self.budget = budget


class UnknownAccount(ServiceError):
    code = "unknown_account"
    status = 404


class LedgerNotMigrated(ServiceError):
    code = "ledger_not_migrated"
    status = 503
    exit_code = 2  # the operator runs the command the message names


class IdempotencyKeyFailed(ServiceError):
    code = "idempotency_key_failed"
    status = 409
