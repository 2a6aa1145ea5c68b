"""Refusals the query path keeps (mode not granted, read cap reached): each in its own
transaction, or a group's together in one.

Refusals are kept so that admins see them by reason (``/v1/admin/refusals``); nothing is
charged for them. A batch whose every item is refused used to write one row per item, each
in a transaction of its own (1,000 commits for 1,000 items). While a group is being prepared
(:meth:`RefusalLog.gathered`), the refusals it meets are kept back and written at the end in
one transaction and one multi-row INSERT: the same rows, so the admin's statistics are
unchanged. (Refusals at admission - budget, quota, graph-wide cap - are written by the ledger
inside the admission's own transaction.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from service.ledger.ledger import Ledger
from service.ledger.reports import RefusalRow


class RefusalLog:
    """Writes refusals to the ledger, alone or gathered per group (per thread)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._local = threading.local()

    def record(
        self,
        reason: str,
        *,
        charged_account_id: int | None = None,
        principal_account_id: int | None = None,
        mode: str | None = None,
        epsilon: float | None = None,
    ) -> None:
        row = RefusalRow(reason, charged_account_id, principal_account_id, mode, epsilon)
        pending: list[RefusalRow] | None = getattr(self._local, "pending", None)
        if pending is None:
            self._ledger.reports.record_refusals([row])
        else:
            pending.append(row)

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Keep back the refusals this thread records in the block; write them at its end,
        in one transaction (a nested block leaves them to the outer one)."""
        if getattr(self._local, "pending", None) is not None:
            yield
            return
        self._local.pending = []
        try:
            yield
        finally:
            rows: list[RefusalRow] = self._local.pending
            self._local.pending = None
            self._ledger.reports.record_refusals(rows)
