"""Bounds of what callers may name, shared by the HTTP API, the CLI and the settings (so all
refuse the same values with a clear error, never a database error): ledger row ids fit the
32-bit integer columns of PostgreSQL, offsets stay below what either database accepts, labels
are printable text (PostgreSQL refuses a NUL in text), an account is of one of three types, and
the budget parameters an account may be given (by an admin, the CLI or a default) and the
budget planner's inputs stay in their ranges.

A cap below ``CAP_EPSILON_MIN`` or a delta outside ``[DELTA_MIN, DELTA_MAX)`` is almost surely
a typo (``5e-324``, ``0.999``): a delta of 1e-3 already lets a mechanism leak a record with
probability 0.1% per account, far beyond the usual ``delta << 1/|E|``.
"""

from __future__ import annotations

from typing import Literal

AccountType = Literal["user", "service", "admin"]
ACCOUNT_TYPES: tuple[AccountType, ...] = ("user", "service", "admin")
#: The budget periods an account's renewing cap may have (UTC windows; service/ledger/periods.py).
BudgetPeriod = Literal["day", "week", "month"]
BUDGET_PERIODS: tuple[BudgetPeriod, ...] = ("day", "week", "month")

#: Largest id of a ledger row (the ``integer`` columns of PostgreSQL).
ID_MAX = 2**31 - 1
#: Largest ``offset`` of a list.
OFFSET_MAX = 2**31 - 1
#: Largest ``limit`` of a list.
LIMIT_MAX = 1000
#: Longest account label.
LABEL_MAX = 200
#: Printable text only: no C0 control characters (NUL, newline, ...) and no DEL.
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"

#: Smallest cap epsilon (inclusive). Smaller caps admit nothing; refuse the typo instead.
CAP_EPSILON_MIN = 1e-6
#: Largest cap epsilon (inclusive): beyond this the budget protects nothing.
CAP_EPSILON_MAX = 1e3
#: Smallest delta (inclusive).
DELTA_MIN = 1e-15
#: Delta must stay below this (exclusive).
DELTA_MAX = 1e-3

#: The budget planner's bounds (``python -m service plan``, ``POST /v1/admin/plan``): up to a
#: century of days, a million answers a day and 100,000 graph versions.
PLAN_DAYS_MAX = 36_500
PLAN_ANSWERS_PER_DAY_MAX = 1_000_000
PLAN_GRAPH_VERSIONS_MAX = 100_000
