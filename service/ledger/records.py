"""Plain records the ledger hands out (no SQLAlchemy types leave the ledger package)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.bounds import AccountType
from service.errors import InvalidParameter, ServiceError
from service.mechanisms.postprocess import RankedNode


@dataclass(frozen=True)
class AccountRecord:
    account_id: int
    type: AccountType
    node_id: str | None
    label: str | None
    may_create_seed_accounts: bool
    created_at: str  # ISO 8601, UTC
    #: Service accounts: the modes they may query (default edge only).
    modes: tuple[str, ...] = ("edge",)
    #: Service accounts: eps per rolling 24 h chargeable to other accounts (None: default).
    quota_epsilon: float | None = None
    #: Service accounts: cap on their read figure (None: the configured default).
    read_cap_epsilon: float | None = None


@dataclass(frozen=True)
class OpenedAccount:
    """A new account, the budget it was given and its first API key (``api_key``, the
    plaintext: shown once)."""

    account: AccountRecord
    cap_epsilon: float
    delta: float
    api_key: str
    key: ApiKeyRecord


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
    #: The account's budget period, where it has one (and the view was read with it).
    period: PeriodFigures | None = None

    def to_dict(self) -> dict[str, Any]:
        view = {
            "account_id": self.account_id,
            "spent_epsilon": self.spent_epsilon,
            "cap_epsilon": self.cap_epsilon,
            "remaining_epsilon": self.remaining_epsilon,
            "delta": self.delta,
            "charges": self.charges,
        }
        if self.period is not None:  # absent, not null, without a period: today's shape
            view.update(self.period.to_dict())
        return view


@dataclass(frozen=True)
class PeriodFigures:
    """An account's current budget period: the composition of its live charges since
    ``started_at`` at the account's delta, and its cap, which renews at ``resets_at``."""

    period: str  # day | week | month (UTC windows)
    period_cap_epsilon: float
    period_spent_epsilon: float
    started_at: datetime
    resets_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "period_cap_epsilon": self.period_cap_epsilon,
            "period_spent_epsilon": self.period_spent_epsilon,
            "period_remaining_epsilon": max(
                0.0, self.period_cap_epsilon - self.period_spent_epsilon
            ),
            "period_started_at": self.started_at.isoformat(),
            "period_resets_at": self.resets_at.isoformat(),
        }


@dataclass
class QuotaWindow:
    """A service account's live charges to other accounts in its 24-hour quota window, as one
    admission transaction sees them: their sum, read once by the database, plus what the
    transaction has charged since under the account's lock."""

    used: float
    #: ``Retry-After`` seconds of a refusal, by the excess it must free: the charges that
    #: leave the window first do not change while the transaction holds the account's lock,
    #: so a group's refusals of one size are worked out once.
    retry_after: dict[float, float] = field(default_factory=dict)

    def add(self, epsilon: float) -> None:
        self.used += epsilon


@dataclass(frozen=True)
class DegreeCharge:
    """A graph version's DP degree release, as an account pays for it: once per version (and
    scale), the first time it receives an answer built on it."""

    graph_version: str
    epsilon: float
    curve: Any  # RdpCurve of the release (Laplace at epsilon)

    def paid_key(self, account_id: int) -> tuple[int, str, float]:
        """What identifies the account's one live charge for this release: (account, graph
        version, epsilon), epsilon compared exactly (as the ledger's lookup compares it)."""
        return (account_id, self.graph_version, float(self.epsilon))


@dataclass(frozen=True)
class SyntheticCharge:
    """A synthetic release (a finished synthesis run: the graph release ``release_name`` about
    ``graph_version``), as an account pays for it: once, the first time it receives a sandbox
    answer computed from it. The curve charged is the one the release was recorded with."""

    graph_version: str
    release_name: str


@dataclass(frozen=True)
class DegreeReceipt:
    """The outcome of :meth:`QuotaAndDegree.admit_degree_release` (or ``admit_synthetic_release``):
    the budget after it, the epsilon of the release, and whether this call charged it (False:
    the account had paid for this release already)."""

    budget: BudgetView
    charged: bool
    replayed: bool = False  # the Idempotency-Key was bound to this same popular query already
    epsilon: float = 0.0  # the release's epsilon (charged or not)


@dataclass(frozen=True)
class ReadView:
    """What one service account's answers reveal: the composition of every distinct release it
    received (fresh or replayed, graph-wide releases once each), at the account's delta."""

    account_id: int
    epsilon: float
    delta: float
    releases: int
    cap_epsilon: float | None  # None: no cap

    def to_dict(self) -> dict[str, Any]:
        return {
            "account_id": self.account_id,
            "read_epsilon": self.epsilon,
            "delta": self.delta,
            "releases": self.releases,
            "read_cap_epsilon": self.cap_epsilon,
        }


class ReadCapExhausted(ServiceError):
    """A service account's read figure would pass its read cap."""

    code = "read_cap_exhausted"
    status = 403

    def __init__(self, view: ReadView, added_epsilon: float) -> None:
        super().__init__(
            f"this answer would take what this service account has read to epsilon "
            f"{added_epsilon:.4g}, past its read cap of {view.cap_epsilon:.4g} (now "
            f"{view.epsilon:.4g} over {view.releases} releases); ask an admin to raise it "
            "(accounts set-scopes --read-cap-epsilon)",
            details={"read": view.to_dict(), "read_epsilon_after": added_epsilon},
        )
        self.view = view


@dataclass(frozen=True)
class ReadAsk:
    """The principal (a service account) reads the release its admission charges: the release
    is counted in its read figure in the admission's own transaction, after a check against
    its read cap (its ``read_cap_epsilon``, else ``default_cap_epsilon``; None: no cap) that
    refuses the query with :class:`ReadCapExhausted` before anything is charged."""

    default_cap_epsilon: float | None
    #: ``(graph_version, mechanism)`` of the graph-wide release the answer is built on (the
    #: degree release of ``blended``), counted too the first time this reader gets it.
    graph_release: tuple[str, str] | None = None


@dataclass(frozen=True)
class Admission:
    """One query to admit and charge (what ``Admissions.admit_and_charge`` is given)."""

    charged_account_id: int
    principal_account_id: int
    seed: str
    mechanism: str
    mode: str
    params: dict[str, Any]
    query_curve: Any  # RdpCurve (records imports nothing of privacy/)
    query_epsilon: float
    graph_version: str
    request_id: str
    idempotency_key: str | None = None
    release_key: ReleaseKey | None = None
    #: With a ``release_key``: a stored release joins only if made after this time (the
    #: refresh policy's max age); an identical query in flight joins whatever its age.
    released_after: datetime | None = None
    quota_epsilon: float | None = None
    #: The version's degree release, when the answer is built on it (``blended``): charged
    #: with the query, in the same transaction, if the account has not paid for it yet.
    degree: DegreeCharge | None = None
    #: Set when the principal is a service account that receives the release.
    read: ReadAsk | None = None


@dataclass(frozen=True)
class ChargeReceipt:
    charge_id: int
    budget: BudgetView  # after the charge
    reused: bool = False  # an earlier charge with the same idempotency key was found instead
    #: An identical query (same release key) was already admitted or released: nothing was
    #: charged, and ``charge_id`` is that twin's charge, whose release is the answer.
    joined: bool = False
    #: The epsilon of the degree release charged with this query (0: none, or paid before).
    degree_epsilon: float = 0.0


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
    state: str = "admitted"


@dataclass(frozen=True)
class ReleaseKey:
    """What makes two queries the same release: replaying one for the other is free."""

    account_id: int  # the charged account
    node: str
    graph_version: str
    mode: str
    epsilon: float
    mechanism: str = "noisy_diffusion"

    def digest(self) -> str:
        """A stable 64-character digest (the in-flight twin index of the ledger)."""
        text = "\x1f".join(
            [
                str(self.account_id),
                self.node,
                self.graph_version,
                self.mode,
                repr(float(self.epsilon)),
                self.mechanism,
            ]
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredRelease:
    key: ReleaseKey
    charge_id: int
    results: Sequence[RankedNode]  # the top of the released ranking, seed excluded, best first
    mechanism: dict[str, Any]
    request_id: str
    #: When the release was made (UTC); None where it was not recorded (an older cache entry).
    #: Not part of equality: the same release read back is equal to the one stored.
    released_at: datetime | None = field(default=None, compare=False)


class BudgetExhausted(ServiceError):
    code = "budget_exhausted"
    status = 403

    def __init__(
        self, budget: BudgetView, query_epsilon: float, *, retry_after: int | None = None
    ) -> None:
        """``retry_after`` (seconds until the period's reset): refused by the period cap."""
        period = budget.period
        details: dict[str, Any] = {"budget": budget.to_dict(), "query_epsilon": query_epsilon}
        if retry_after is None or period is None:
            message = (
                f"this query (epsilon {query_epsilon:.4g}) would take the account's spend past "
                f"its cap of {budget.cap_epsilon:.4g}; remaining budget "
                f"{budget.remaining_epsilon:.4g}. Ask for a smaller epsilon, replay an earlier "
                "answer, or ask an admin to raise the cap"
            )
        else:
            resets = period.resets_at.isoformat()
            message = (
                f"this query (epsilon {query_epsilon:.4g}) would take the account's spend this "
                f"{period.period} past its period cap of {period.period_cap_epsilon:.4g} "
                f"(spent {period.period_spent_epsilon:.4g}); the period cap renews at {resets}. "
                "Replay an earlier answer, or ask again after the reset"
            )
            details.update(cap="period_cap", resets_at=resets, retry_after_seconds=retry_after)
        super().__init__(message, details=details)
        self.budget = budget
        self.retry_after = retry_after


class IdempotencyKeyReused(InvalidParameter):
    """The same Idempotency-Key was sent with a different query (nothing is charged)."""

    def __init__(self) -> None:
        super().__init__(
            "Idempotency-Key", "was already used for a different query; send a new key"
        )


class UnknownAccount(ServiceError):
    code = "unknown_account"
    status = 404


class LedgerNotMigrated(ServiceError):
    code = "ledger_not_migrated"
    status = 503
    exit_code = 2  # the operator runs the command the message names


class ServiceQuotaExhausted(ServiceError):
    """A service account reached the eps it may charge to other accounts in 24 hours."""

    code = "service_quota_exhausted"
    status = 429

    def __init__(self, message: str, *, retry_after: int, details: dict[str, Any]) -> None:
        super().__init__(message, details={**details, "retry_after_seconds": retry_after})
        self.retry_after = max(1, int(retry_after))


class GraphBudgetExhausted(ServiceError):
    """The graph-wide exposure cap would be exceeded."""

    code = "graph_budget_exhausted"
    status = 403


class ChargeSettled(ServiceError):
    """The charge was refunded (e.g. reconciled): its answer must never be released."""

    code = "charge_settled"
    status = 503


class ModeNotAllowed(ServiceError):
    code = "mode_not_allowed"
    status = 403


@dataclass(frozen=True)
class GraphCap:
    """The optional graph-wide cap: composed exposure of all accounts at ``delta``.

    ``max_charge`` bounds (order by order) the curve of any charge that takes the fast path;
    a charge above it, or one near the cap, locks every exposure shard and checks exactly.
    """

    cap_epsilon: float
    delta: float
    max_charge: Any  # RdpCurve (kept untyped here to keep records free of privacy imports)
