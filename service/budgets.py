"""The range of budget parameters an account may be given (by an admin, the CLI or a default).

A cap below ``CAP_EPSILON_MIN`` or a delta outside ``[DELTA_MIN, DELTA_MAX)`` is almost surely
a typo (``5e-324``, ``0.999``): a delta of 1e-3 already lets a mechanism leak a record with
probability 0.1% per account, far beyond the usual ``delta << 1/|E|``.
"""

from __future__ import annotations

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
