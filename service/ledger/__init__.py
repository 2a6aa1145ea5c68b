"""The durable budget ledger: accounts, API keys, budgets, charges, refunds, releases, audit.

``Ledger`` is the only entry point the service needs; records (plain dataclasses) and errors
come from :mod:`service.ledger.records` and :mod:`service.ledger.ledger`. No SQLAlchemy type
leaves this package.
"""

from service.bounds import ACCOUNT_TYPES, AccountType
from service.ledger.budget_rule import ADMISSION_RTOL
from service.ledger.database import UPGRADE_COMMAND, LedgerGridMismatch, upgrade
from service.ledger.ledger import (
    AccountExists,
    Ledger,
    LedgerUnavailable,
    UnknownApiKey,
    UnknownCharge,
)
from service.ledger.records import (
    AccountRecord,
    ApiKeyRecord,
    BudgetExhausted,
    BudgetView,
    ChargeReceipt,
    ChargeRecord,
    ChargeSettled,
    DegreeCharge,
    DegreeReceipt,
    GraphBudgetExhausted,
    GraphCap,
    LedgerNotMigrated,
    ModeNotAllowed,
    ReadCapExhausted,
    ReadView,
    ReleaseKey,
    ServiceQuotaExhausted,
    StoredRelease,
    SyntheticCharge,
    UnknownAccount,
)

__all__ = [
    "ACCOUNT_TYPES",
    "ADMISSION_RTOL",
    "UPGRADE_COMMAND",
    "AccountExists",
    "AccountRecord",
    "AccountType",
    "ApiKeyRecord",
    "BudgetExhausted",
    "BudgetView",
    "ChargeReceipt",
    "ChargeRecord",
    "ChargeSettled",
    "DegreeCharge",
    "DegreeReceipt",
    "GraphBudgetExhausted",
    "GraphCap",
    "Ledger",
    "LedgerGridMismatch",
    "LedgerNotMigrated",
    "LedgerUnavailable",
    "ModeNotAllowed",
    "ReadCapExhausted",
    "ReadView",
    "ReleaseKey",
    "ServiceQuotaExhausted",
    "StoredRelease",
    "SyntheticCharge",
    "UnknownAccount",
    "UnknownApiKey",
    "UnknownCharge",
    "upgrade",
]
