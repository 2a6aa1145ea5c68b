"""What the admin's views of the ledger return (frozen records), and the two SQL helpers the
views share. The views themselves are :mod:`service.ledger.admin_views` and its parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

AccountSort = Literal[
    "account_id", "spent", "remaining", "used", "cap", "delta", "charges", "last_charge", "created"
]
ACCOUNT_SORTS: tuple[str, ...] = (
    "account_id", "spent", "remaining", "used", "cap", "delta", "charges", "last_charge", "created",
)  # fmt: skip
AccountStatus = Literal["any", "active", "near_cap", "over_cap", "idle"]

#: How many points of an account's curve are returned at most (the last point always is).
CURVE_POINTS_MAX = 2000


@dataclass(frozen=True)
class AccountFilter:
    type: str | None = None
    #: Free text: an account id, a node id (exact or prefix) or part of a label.
    q: str | None = None
    status: AccountStatus = "any"
    #: ``near_cap``: spent at least this fraction of the cap.
    near_cap_fraction: float = 0.8
    min_spent_epsilon: float | None = None


@dataclass(frozen=True)
class AccountRow:
    account_id: int
    type: str
    node_id: str | None
    label: str | None
    cap_epsilon: float
    delta: float
    spent_epsilon: float
    remaining_epsilon: float
    used_fraction: float
    charges: int
    last_charge_at: str | None
    created_at: str


@dataclass(frozen=True)
class Page:
    total: int
    limit: int
    offset: int
    items: list[Any]


@dataclass(frozen=True)
class AuditPage(Page):
    #: Every action that occurs in the log (for a filter's choices).
    actions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HourUsage:
    at: str
    queries: int
    epsilon: float
    refunded: int
    refusals: int


@dataclass(frozen=True)
class CurvePoint:
    at: str
    charge_id: int
    epsilon: float  # this charge's own per-query epsilon
    composed_epsilon: float  # everything so far, composed by the accountant at the delta
    naive_epsilon: float  # the per-query epsilons added up


@dataclass(frozen=True)
class AccountCurve:
    account_id: int
    delta: float
    cap_epsilon: float
    charges: int
    composed_epsilon: float
    naive_epsilon: float
    points: list[CurvePoint] = field(default_factory=list)


@dataclass(frozen=True)
class BudgetPreview:
    account_id: int
    cap_epsilon: float
    delta: float
    spent_epsilon: float
    remaining_epsilon: float
    cap_below_spent: bool


@dataclass(frozen=True)
class ServiceUsage:
    """What a service account charged to other accounts (seed users, personalized mode)."""

    account_id: int
    modes: list[str]
    may_create_seed_accounts: bool
    quota_epsilon: float
    quota_is_default: bool
    used_24h_epsilon: float
    charges_to_others: int
    epsilon_to_others: float
    accounts_charged: int
    top_charged: list[dict[str, Any]]


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def naive_utc(moment: datetime, session: Session) -> datetime:
    """SQLite stores naive UTC: compare with naive values there."""
    if session.get_bind().dialect.name == "sqlite":
        return moment.replace(tzinfo=None)
    return moment
