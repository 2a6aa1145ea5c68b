"""Bounds of what callers may name, shared by the HTTP API and the CLI (so both refuse the same
values with a clear error, never a database error): ledger row ids fit the 32-bit integer
columns of PostgreSQL, offsets stay below what either database accepts, labels are
printable text (PostgreSQL refuses a NUL in text), and an account is of one of three types."""

from __future__ import annotations

from typing import Literal

AccountType = Literal["user", "service", "admin"]
ACCOUNT_TYPES: tuple[AccountType, ...] = ("user", "service", "admin")

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
